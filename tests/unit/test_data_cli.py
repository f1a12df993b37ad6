"""``python -m nre_ray.data``: convert (every input format to every output format, overwrite protection, bad rows)
and the input errors of inspect that need no Ray. The inspect runs that preprocess are in
tests/integration/test_data_pipeline.py."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from nre_ray.data.__main__ import main
from nre_ray.data.read import check_rows, read_table

HEADER = "sentence,head,head_offset,tail,tail_offset,relation"
ROWS = ["张三是ABC公司的董事长,张三,0,ABC公司,3,董事长", '"Acme, Inc. hired Ann",Acme,0,Ann,17,hired']
SEMEVAL = '1\t"The <e1>audits</e1> were about <e2>waste</e2>."\nMessage-Topic(e1,e2)\nComment:\n\n'
OPENNRE = {"token": ["A", "likes", "B"], "h": {"name": "A", "pos": [0, 1]}, "t": {"name": "B", "pos": [2, 3]},
           "relation": "likes"}
CANONICAL = ["sentence", "head", "head_offset", "tail", "tail_offset", "relation"]


def write(folder: Path, name: str, text: str) -> Path:
    path = folder / name
    path.write_text(text, encoding="utf-8", newline="")
    return path


def sources(folder: Path) -> list[tuple[Path, list[str]]]:
    """Inputs of each format, with the extra CLI arguments they need."""
    parquet = folder / "in.parquet"
    pd.DataFrame({"text": ["A likes B"], "subj": ["A"], "subj_at": [0], "obj": ["B"], "obj_at": [8],
                  "label": ["likes"]}).to_parquet(parquet)
    return [
        (write(folder, "in.csv", "\r\n".join([HEADER, *ROWS]) + "\r\n"), []),
        (write(folder, "in.tsv", HEADER.replace(",", "\t") + "\nA likes B\tA\t0\tB\t8\tlikes\n"), []),
        (write(folder, "in.jsonl", json.dumps(dict(zip(CANONICAL, ["A likes B", "A", 0, "B", 8, "likes"],
                                                        strict=True))) + "\n"), []),
        (write(folder, "in_opennre.txt", json.dumps(OPENNRE) + "\n"), []),
        (write(folder, "TRAIN_FILE.TXT", SEMEVAL), []),
        (write(folder, "tiny.csv", "sentence,entity1,entity2,offset1,offset2,relation\r\n甲和乙,甲,乙,0,2,r\r\n"),
         ["--format", "deepke"]),
        (parquet, ["--columns", "text=sentence,subj=head,subj_at=head_offset,obj=tail,obj_at=tail_offset,"
                                "label=relation"]),
    ]


@pytest.mark.parametrize("suffix", [".csv", ".tsv", ".jsonl", ".parquet"])
def test_convert_every_format_to_the_canonical_schema(tmp_path: Path, suffix: str,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    for source, extra in sources(tmp_path):
        target = tmp_path / f"out_{source.name}{suffix}"
        assert main(["convert", str(source), str(target), *extra]) == 0
        assert f"to {target}" in capsys.readouterr().out
        expected = check_rows(read_table(source, fmt="deepke" if "deepke" in extra else None,
                                         column_map=_map(extra)))
        got = check_rows(read_table(target))
        assert got["problem"].tolist() == [""] * len(expected)
        pd.testing.assert_frame_equal(got[CANONICAL].reset_index(drop=True),
                                      expected[CANONICAL].reset_index(drop=True), check_dtype=False)
    semeval = read_table(tmp_path / f"out_TRAIN_FILE.TXT{suffix}")
    assert semeval["id"].tolist() == ["1"]  # optional columns the input has are kept


def _map(extra: list[str]) -> dict[str, str] | None:
    if "--columns" not in extra:
        return None
    return dict(item.split("=") for item in extra[extra.index("--columns") + 1].split(","))


def test_convert_never_overwrites_without_force(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source = write(tmp_path, "in.csv", "\n".join([HEADER, *ROWS]) + "\n")
    target = write(tmp_path, "out.csv", "precious\n")
    assert main(["convert", str(source), str(target)]) == 2
    assert "out.csv already exists; nothing was written. Pass --force" in capsys.readouterr().err
    assert target.read_text(encoding="utf-8") == "precious\n"
    assert main(["convert", str(source), str(target), "--force"]) == 0
    assert len(read_table(target)) == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.csv", "out.csv"]  # no partial file left


def test_convert_bad_rows_lists_them_and_writes_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = [f"A likes B,A,{i + 1},B,8,r" for i in range(23)]  # head is not at offset i + 1
    source = write(tmp_path, "in.csv", "\n".join([HEADER, ROWS[0], *bad, "x,y"]) + "\n")
    target = tmp_path / "out.jsonl"
    assert main(["convert", str(source), str(target)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[0] == "error: bad input data"
    assert err[1] == (f"{source}:3: head_offset: the sentence does not have head at offset 1 (expected 'A', found "
                      "' '), but head 'A' occurs at offset 0")
    assert len([line for line in err if line.startswith(str(source))]) == 20
    assert "... and 4 more problems" in err and not any("Traceback" in line for line in err)
    assert not target.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["in.csv"]
    assert main(["convert", str(source), str(target), "--on-bad-rows", "skip"]) == 0
    assert "wrote 1 rows" in capsys.readouterr().out and len(read_table(target)) == 1


def test_convert_usage_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source = write(tmp_path, "in.csv", "\n".join([HEADER, *ROWS]) + "\n")
    assert main(["convert", str(source), str(tmp_path / "out.xlsx")]) == 2
    assert "cannot tell the output format from the extension '.xlsx'" in capsys.readouterr().err
    assert main(["convert", str(tmp_path / "missing.csv"), str(tmp_path / "o.csv")]) == 2
    assert "missing.csv: file not found" in capsys.readouterr().err
    assert main(["convert", str(source), str(tmp_path / "o.csv"), "--columns", "a=b"]) == 2
    assert "unknown target column 'b'" in capsys.readouterr().err


def test_inspect_input_errors_need_no_ray(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    tiny = write(tmp_path, "train.csv", "sentence,entity1,entity2,offset1,offset2,relation\n甲和乙,甲,乙,0,2,r\n")
    assert main(["inspect", "--train", str(tiny), "--cache-dir", str(tmp_path / "c")]) == 2
    err = capsys.readouterr().err
    assert "missing required columns head, head_offset, tail, tail_offset" in err and "--format deepke" in err
    assert main(["inspect", "--data-dir", str(tmp_path / "nowhere")]) == 2
    assert "data directory not found" in capsys.readouterr().err


def test_the_cli_as_a_subprocess_help_and_a_clean_exit_on_bad_rows(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, "-m", "nre_ray.data", "inspect", "--help"], capture_output=True, text=True,
                         check=True).stdout
    for flag in ("--data-dir", "--train", "--valid", "--test", "--format", "--columns", "--max-length", "--seed",
                 "--on-bad-rows", "--no-cache", "--json"):
        assert flag in out
    assert "--epochs" not in out
    source = write(tmp_path, "in.csv", f"{HEADER}\nA likes B,A,50,B,8,r\n")
    done = subprocess.run([sys.executable, "-m", "nre_ray.data", "convert", str(source), str(tmp_path / "o.csv")],
                          capture_output=True, text=True)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert f"{source}:2: head_offset: head runs past the end of the sentence" in done.stderr
