"""Tests for nre_ray.tasks.sentence.reports."""

from __future__ import annotations

import warnings

import numpy as np
import pandas as pd
import pytest
from matplotlib.image import imread

from nre_ray.tasks.sentence.metrics import per_class_table
from nre_ray.tasks.sentence.reports import plot_confusion_matrix, write_class_report

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
CM3 = np.array([[5, 1, 0], [2, 3, 1], [0, 2, 6]], dtype=np.int64)
LABELS3 = ["A", "B", "C"]


def test_write_class_report_files_and_csv_round_trip(tmp_path):
    out = tmp_path / "reports" / "nested"
    paths = write_class_report(CM3, LABELS3, out, "dev")
    assert [p.name for p in paths] == ["dev_per_class.csv", "dev_per_class.md"]
    assert all(p.is_file() for p in paths)

    back = pd.read_csv(paths[0])
    pd.testing.assert_frame_equal(back, per_class_table(CM3, LABELS3), check_dtype=False)

    md = paths[1].read_text(encoding="utf-8").splitlines()
    assert md[0] == "| label | precision | recall | f1 | support | predicted |"
    assert md[1].startswith("| --- |")
    assert len(md) == 2 + 3
    # A: P = 5/7 = 0.7143, R = 5/6 = 0.8333, F1 = 10/13 = 0.7692, support 6, predicted 7
    assert md[2] == "| A | 0.7143 | 0.8333 | 0.7692 | 6 | 7 |"


def test_write_class_report_unicode_labels_round_trip(tmp_path):
    labels = ["无关系", "人物关系/亲属", "a|b"]
    cm = np.array([[3, 1, 0], [0, 2, 0], [1, 0, 1]])
    csv_path, md_path = write_class_report(cm, labels, tmp_path, "test")
    back = pd.read_csv(csv_path)
    assert back["label"].tolist() == labels
    assert "a\\|b" in md_path.read_text(encoding="utf-8")  # pipe escaped in Markdown


def test_plot_confusion_matrix_three_classes(tmp_path):
    path = plot_confusion_matrix(CM3, LABELS3, tmp_path / "cm3.png", "dev confusion")
    assert path.is_file()
    assert path.read_bytes()[:8] == PNG_MAGIC


def test_plot_confusion_matrix_thirty_classes_long_and_chinese_labels(tmp_path):
    rng = np.random.default_rng(0)
    n = 30
    labels = [f"org:very_long_relation_name_number_{i}" for i in range(n - 10)]
    labels += [f"人物关系_{i}" for i in range(10)]
    cm = rng.integers(0, 50, size=(n, n))
    cm[3] = 0  # a class without support must not break row normalisation
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        path = plot_confusion_matrix(cm, labels, tmp_path / "sub" / "cm30.png", "test confusion")
    assert path.is_file()
    assert path.read_bytes()[:8] == PNG_MAGIC
    assert not [w for w in caught if "missing" in str(w.message).lower()]

    small = plot_confusion_matrix(CM3, LABELS3, tmp_path / "cm3.png", "small")
    assert imread(path).shape[0] > imread(small).shape[0]  # figure grows with the class count


def test_plot_confusion_matrix_empty_counts(tmp_path):
    path = plot_confusion_matrix(np.zeros((4, 4), dtype=int), list("abcd"), tmp_path / "zero.png", "empty")
    assert path.read_bytes()[:8] == PNG_MAGIC


def test_plot_uses_cjk_font_when_available(tmp_path, monkeypatch):
    from nre_ray.tasks.sentence import reports

    # Pretend an installed font covers CJK; the plot must still render cleanly.
    monkeypatch.setattr(reports, "find_cjk_font", lambda: "DejaVu Sans")
    labels = ["无关系", "人物关系", "org:founded_by"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        path = reports.plot_confusion_matrix(CM3, labels, tmp_path / "cjk.png", "中文")
    assert path.read_bytes()[:8] == PNG_MAGIC
    assert not [w for w in caught if "missing" in str(w.message).lower()]


@pytest.mark.parametrize(("installed", "found"), [
    (["DejaVu Sans", "Noto Sans CJK JP", "WenQuanYi Zen Hei"], "Noto Sans CJK JP"),  # a known family, by preference
    (["DejaVu Sans", "Sarasa Mono CJK SC"], "Sarasa Mono CJK SC"),                   # one that says CJK in its name
    (["DejaVu Sans", "Liberation Serif"], None),                                     # none with CJK glyphs
])
def test_find_cjk_font_picks_an_installed_cjk_family(monkeypatch, installed, found):
    from matplotlib import font_manager

    from nre_ray.tasks.sentence.reports import find_cjk_font

    entries = [font_manager.FontEntry(fname=f"/fonts/{i}.ttf", name=name) for i, name in enumerate(installed)]
    monkeypatch.setattr(font_manager.fontManager, "ttflist", entries)
    find_cjk_font.cache_clear()  # it looks once per process
    try:
        assert find_cjk_font() == found
    finally:
        find_cjk_font.cache_clear()
