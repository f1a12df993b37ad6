"""The Train controller's callback hands the workers' console notes and epochs to the driver's events file."""

from __future__ import annotations

import json

from nre_ray.console import NOTES_KEY
from nre_ray.tracking.callback import EpochMetricsLogger


def test_a_report_of_notes_becomes_one_console_event_and_nothing_in_mlflow(tmp_path, capsys):
    events = tmp_path / "events.jsonl"
    callback = EpochMetricsLogger(f"sqlite:///{tmp_path / 'never.db'}", "run-id", str(events), epochs=5)
    notes = ["embeddings: 4 of 9 vocabulary words found in v.txt"]
    callback.after_report(None, [{NOTES_KEY: notes}, {NOTES_KEY: []}], None)  # rank 0's lines, rank 1's none
    assert [json.loads(line) for line in events.read_text().splitlines()] == [{"event": "notes", "lines": notes}]
    assert callback._tracker is None and not (tmp_path / "never.db").exists()

    printed = EpochMetricsLogger(f"sqlite:///{tmp_path / 'never.db'}", "run-id", None)  # no events file (ray://)
    printed.after_report(None, [{NOTES_KEY: ["a", "b"]}], None)
    assert capsys.readouterr().out == "a\nb\n"
