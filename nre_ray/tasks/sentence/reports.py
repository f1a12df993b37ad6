"""Evaluation report artefacts: per-class tables and confusion-matrix plots.

Plots are drawn on a bare :class:`matplotlib.figure.Figure` with the Agg
canvas, so nothing here touches pyplot's global state or the process-wide
backend (safe inside Ray workers and headless machines).
"""

from __future__ import annotations

import functools
import logging
import warnings
from pathlib import Path

import matplotlib
import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from nre_ray.tasks.sentence.metrics import per_class_table

__all__ = ["find_cjk_font", "plot_confusion_matrix", "write_class_report"]

_ANNOTATE_MAX_CLASSES = 25
_MAX_LABEL_CHARS = 60
_MAX_FIG_INCHES = 60.0

# Families known to carry CJK glyphs, in order of preference.
_CJK_FONT_CANDIDATES = (
    "Noto Sans CJK SC",
    "Noto Sans CJK TC",
    "Noto Sans CJK JP",
    "Noto Sans SC",
    "Noto Serif CJK SC",
    "Source Han Sans SC",
    "Source Han Sans CN",
    "Source Han Sans",
    "WenQuanYi Zen Hei",
    "WenQuanYi Micro Hei",
    "Microsoft YaHei",
    "SimHei",
    "PingFang SC",
    "Hiragino Sans GB",
    "Heiti SC",
    "STHeiti",
    "Arial Unicode MS",
    "AR PL UMing CN",
    "AR PL UKai CN",
    "Droid Sans Fallback",
)


def _fmt_cell(value: object) -> str:
    if isinstance(value, (float, np.floating)):
        return f"{float(value):.4f}"
    return str(value).replace("|", "\\|")


def write_class_report(cm: np.ndarray, labels: list[str], out_dir: Path, prefix: str) -> list[Path]:
    """Write the per-class table as ``<prefix>_per_class.csv`` and ``.md``.

    Args:
        cm: ``(C, C)`` confusion matrix, rows = gold, columns = predicted.
        labels: the ``C`` label names.
        out_dir: directory to write into (created if missing).
        prefix: file-name prefix, e.g. ``"dev"`` or ``"test"``.

    Returns:
        ``[csv_path, md_path]``. The CSV keeps full float precision; the
        Markdown table rounds floats to 4 decimals.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    table = per_class_table(cm, labels)

    csv_path = out_dir / f"{prefix}_per_class.csv"
    table.to_csv(csv_path, index=False, encoding="utf-8")

    cols = list(table.columns)
    lines = [
        "| " + " | ".join(cols) + " |",
        "| " + " | ".join("---" if c == "label" else "---:" for c in cols) + " |",
    ]
    for row in table.itertuples(index=False):
        lines.append("| " + " | ".join(_fmt_cell(v) for v in row) + " |")
    md_path = out_dir / f"{prefix}_per_class.md"
    md_path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return [csv_path, md_path]


@functools.lru_cache(maxsize=1)
def find_cjk_font() -> str | None:
    """Name of an installed font family with CJK glyphs, or ``None``."""
    from matplotlib import font_manager

    installed = {f.name for f in font_manager.fontManager.ttflist}
    for name in _CJK_FONT_CANDIDATES:
        if name in installed:
            return name
    for name in sorted(installed):  # anything else that advertises CJK in its name
        low = name.lower()
        if "cjk" in low or "han sans" in low or "hei" in low.split():
            return name
    return None


def _needs_cjk(labels: list[str]) -> bool:
    return any(ord(ch) > 0x2E7F for lab in labels for ch in lab)


def _shorten(label: str) -> str:
    return label if len(label) <= _MAX_LABEL_CHARS else label[: _MAX_LABEL_CHARS - 1] + "\u2026"


def plot_confusion_matrix(cm: np.ndarray, labels: list[str], path: Path, title: str) -> Path:
    """Save a row-normalised confusion-matrix heat map as an image (PNG by suffix).

    Colours are row-normalised (fraction of each gold class); raw counts are
    written in the cells when there are at most 25 classes. The figure grows
    with the number of classes and the label length; x tick labels are
    rotated. If any label has CJK characters and a CJK font is installed it
    is used; otherwise missing-glyph warnings are suppressed.

    Args:
        cm: ``(C, C)`` confusion matrix, rows = gold, columns = predicted.
        labels: the ``C`` label names.
        path: output file (parent directories are created).
        title: figure title.

    Returns:
        ``path``.
    """
    cm = np.asarray(cm, dtype=np.int64)
    n = len(labels)
    if cm.shape != (n, n):
        raise ValueError(f"confusion matrix shape {cm.shape} does not match {n} labels")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)

    row_sums = cm.sum(axis=1, keepdims=True)
    norm = np.divide(cm, row_sums, out=np.zeros(cm.shape, dtype=np.float64), where=row_sums > 0)

    shown = [_shorten(lab) for lab in labels]
    longest = max((len(s) for s in shown), default=1)
    cell = 0.45 if n <= _ANNOTATE_MAX_CLASSES else 0.32
    label_room = min(0.09 * longest, 6.0)  # inches for tick labels
    side = min(max(5.0, cell * n + label_room + 2.0), _MAX_FIG_INCHES)
    tick_fs = 10 if n <= 15 else (8 if n <= 40 else 6)
    annot_fs = 9 if n <= 10 else (7 if n <= 20 else 6)

    rc: dict[str, object] = {}
    if _needs_cjk(labels):
        font = find_cjk_font()
        if font is not None:
            rc["font.sans-serif"] = [font, *matplotlib.rcParams["font.sans-serif"]]
            rc["font.family"] = "sans-serif"

    fm_logger = logging.getLogger("matplotlib.font_manager")
    old_level = fm_logger.level
    fm_logger.setLevel(max(old_level, logging.ERROR))
    try:
        with warnings.catch_warnings(), matplotlib.rc_context(rc):
            warnings.filterwarnings("ignore", message=r".*[Gg]lyph.*missing.*")
            warnings.filterwarnings("ignore", message=r".*missing from (current )?font.*")
            warnings.filterwarnings("ignore", message=r".*[Ll]ayout.*")

            fig = Figure(figsize=(side + 1.0, side), dpi=100, layout="constrained")
            FigureCanvasAgg(fig)
            ax = fig.add_subplot(1, 1, 1)
            if n == 0:
                ax.text(
                    0.5,
                    0.5,
                    "no classes",
                    ha="center",
                    va="center",
                    transform=ax.transAxes,
                )
                ax.set_axis_off()
                ax.set_title(title)
                fig.savefig(path)
                return path
            im = ax.imshow(
                norm,
                cmap="Blues",
                vmin=0.0,
                vmax=1.0,
                interpolation="nearest",
                aspect="equal",
            )
            fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04, label="fraction of gold class")

            ticks = np.arange(n)
            ax.set_xticks(ticks)
            ax.set_yticks(ticks)
            rotate = n > 6 or longest > 8
            ax.set_xticklabels(
                shown,
                rotation=60 if rotate else 0,
                ha="right" if rotate else "center",
                rotation_mode="anchor",
                fontsize=tick_fs,
            )
            ax.set_yticklabels(shown, fontsize=tick_fs)
            ax.set_xlabel("predicted")
            ax.set_ylabel("gold")
            ax.set_title(title)

            if n <= _ANNOTATE_MAX_CLASSES:
                for i in range(n):
                    for j in range(n):
                        if cm[i, j] == 0:
                            continue
                        ax.text(
                            j,
                            i,
                            str(int(cm[i, j])),
                            ha="center",
                            va="center",
                            fontsize=annot_fs,
                            color="white" if norm[i, j] > 0.5 else "black",
                        )

            fig.savefig(path, bbox_inches="tight")
    finally:
        fm_logger.setLevel(old_level)
    return path
