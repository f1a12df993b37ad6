#!/usr/bin/env python3
"""Bags against sentences on GIDS, scored the same way (issue 38's evidence for docs/results.md).

GIDS ships only its dev and test files here (``../shared/datasets/gids``): both models train on ``test.tsv`` and
are tested once on ``dev.tsv``. The same seeded share of ``test.tsv``'s *bags* (``--valid-fraction``, drawn as the
bag task draws it: :func:`nre_ray.tasks.bag.grouping.in_valid_share`) validates both, written out as files so that
both runs see exactly the same sentences:

* **bags**: ``python -m nre_ray.train --bag-aggregator att`` on the TSV files as published, nre_ray's defaults (the
  encoder, its size, the epochs, early stopping on validation AUC);
* **sentences**: the same encoder and settings trained sentence by sentence (each sentence labelled with its row's
  relation, NA the negative label), on the same sentences written as CSV; its best checkpoint then predicts every
  sentence of validation and test (``python -m nre_ray.predict --top-k`` all labels), and each bag is scored by
  the at-least-one rule (a relation's score for a bag is its highest over the bag's sentences, the way a sentence
  model is scored at the bag level in the distant-supervision literature).

Both are then scored by the same code (:mod:`nre_ray.tasks.bag.bag_scores`, OpenNRE's held-out evaluation, NA left
out of the positives): AUC, P@100/200/300, and micro/macro F1 at the threshold chosen on validation. One pair of
runs per ``--seeds`` seed, and their mean. The table and the JSON go to ``--out``; ``--markdown`` rewrites the part
of docs/results.md between the ``bench_gids`` markers::

    .venv/bin/python scripts/bench_gids.py --markdown docs/results.md
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from bench_common import add_run_options, finish, machine, run_nre_ray, table

from nre_ray.run.checkpoint import load_checkpoint
from nre_ray.tasks.bag import bag_scores
from nre_ray.tasks.bag.bags import NA, bag_keys, bag_labels
from nre_ray.tasks.bag.files import read_nyt10_chunks
from nre_ray.tasks.bag.grouping import in_valid_share

REPO = Path(__file__).resolve().parents[1]
GIDS = REPO.parent / "shared" / "datasets" / "gids"
SENTENCE_COLUMNS = ["sentence", "head", "head_offset", "tail", "tail_offset", "relation"]
SHOWN = ("auc", "p_at_100", "p_at_200", "p_at_300", "micro_f1", "macro_f1")
BAGS, SENTENCES = "bags (att)", "sentences, at least one"
MARKERS = ("<!-- bench_gids:begin -->", "<!-- bench_gids:end -->")


def read_tsv(path: Path) -> tuple[list[str], pd.DataFrame]:
    """The file's lines (as published) and its rows as nre_ray reads them (one per line, with ``bag`` keys)."""
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    frame = pd.concat(list(read_nyt10_chunks(str(path))), ignore_index=True)
    bad = frame[frame["problem"].astype(str) != ""]
    if len(bad):
        raise SystemExit(f"{path}: {len(bad)} rows nre_ray refuses, e.g. line {bad['line'].iloc[0]}: "
                         f"{bad['problem'].iloc[0]}")
    frame["bag"] = bag_keys(frame).to_numpy()
    return lines, frame


def write_split(work: Path, name: str, lines: list[str], frame: pd.DataFrame, keep: np.ndarray) -> None:
    """``name``.tsv (the kept lines as published) and ``name``.csv (the same rows for the sentence task), with the
    rows' bag keys beside them (``name``.bags.json) for the sentence model's bag scores."""
    numbers = frame["line"].astype(int).to_numpy()[keep]
    (work / f"{name}.tsv").write_text("".join(lines[n - 1] for n in numbers), encoding="utf-8")
    frame.loc[keep, SENTENCE_COLUMNS].to_csv(work / f"{name}.csv", index=False)
    (work / f"{name}.bags.json").write_text(json.dumps(frame.loc[keep, "bag"].tolist()), encoding="utf-8")


def prepare(gids: Path, work: Path, fraction: float, seed: int) -> dict[str, int]:
    """train/valid (the bags of ``test.tsv``, a seeded share validating) and test (``dev.tsv``), as TSV and CSV."""
    lines, frame = read_tsv(gids / "test.tsv")
    valid = np.array([in_valid_share(seed, key, fraction) for key in frame["bag"]], dtype=bool)
    write_split(work, "train", lines, frame, ~valid)
    write_split(work, "valid", lines, frame, valid)
    test_lines, test = read_tsv(gids / "dev.tsv")
    write_split(work, "test", test_lines, test, np.ones(len(test), dtype=bool))
    return {"train_sentences": int((~valid).sum()), "valid_sentences": int(valid.sum()),
            "test_sentences": len(test), "train_bags": frame.loc[~valid, "bag"].nunique(),
            "valid_bags": frame.loc[valid, "bag"].nunique(), "test_bags": test["bag"].nunique()}


def bag_counts(work: Path, name: str, predictions: pd.DataFrame, labels: list[str]) -> np.ndarray:
    """(N, 2, C) bag-task counts of the sentence model's ``predictions`` of split ``name``: row 0 each bag's
    at-least-one scores (the highest of its sentences' probabilities per relation), row 1 its gold label set; bags
    in key order (the bag task's)."""
    keys = json.loads((work / f"{name}.bags.json").read_text(encoding="utf-8"))
    gold_rows = pd.read_csv(work / f"{name}.csv", keep_default_na=False)
    probs = np.zeros((len(predictions), len(labels)))
    column = {label: i for i, label in enumerate(labels)}
    for row, (names, values) in enumerate(zip(predictions["top_k_labels"], predictions["top_k_scores"],
                                              strict=True)):
        probs[row, [column[n] for n in names]] = values
    order = sorted(set(keys))
    at = {key: i for i, key in enumerate(order)}
    counts = np.zeros((len(order), 2, len(labels)), dtype=np.float32)
    index = np.array([at[k] for k in keys])
    np.maximum.at(counts[:, 0], index, probs.astype(np.float32))
    for key, relations in pd.Series(gold_rows["relation"].to_numpy()).groupby(np.array(keys)):
        for label in bag_labels(relations, NA):
            if label in column:
                counts[at[key], 1, column[label]] = 1.0
    return counts


def sentence_bag_scores(work: Path, checkpoint: str, labels: list[str], timeout: float) -> dict[str, dict[str, float]]:
    """The sentence model's validation and test bags scored like the bag model's (test at validation's
    threshold)."""
    counted = {}
    for name in ("valid", "test"):
        out = work / f"sentences_{name}.jsonl"
        cmd = [sys.executable, "-m", "nre_ray.predict", "--model", checkpoint, "--input", str(work / f"{name}.csv"),
               "--output", str(out), "--top-k", str(len(labels)), "--no-progress"]
        done = subprocess.run(cmd, cwd=work, capture_output=True, text=True, timeout=timeout, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} exited {done.returncode}:\n{done.stderr[-3000:]}")
        counted[name] = bag_counts(work, name, pd.read_json(out, lines=True), labels)
    return bag_scores.split_scores(counted, labels, NA)


def one_seed(args: argparse.Namespace, work: Path, seed: int) -> tuple[dict[str, int], str, dict[str, Any]]:
    """Both runs with ``seed`` (the validation bags drawn with it too) in ``work``: the split's sizes, the encoder,
    and each model's validation and test scores, epochs and run time."""
    work.mkdir(parents=True, exist_ok=True)
    sizes = prepare(args.gids, work, args.valid_fraction, seed)
    common = ["--seed", str(seed), "--num-workers", str(args.workers), *args.flags.split()]
    bags = run_nre_ray(work / "bags", ["--bag-aggregator", "att", "--train", str(work / "train.tsv"),
                                       "--valid", str(work / "valid.tsv"), "--test", str(work / "test.tsv"),
                                       *common], args.timeout, run_name="gids-bags")
    model = load_checkpoint(Path(bags["summary"]["best_checkpoint"]), weights=False).meta["model"]
    sentences = run_nre_ray(work / "sentences", ["--train", str(work / "train.csv"), "--valid",
                                                 str(work / "valid.csv"), "--test", str(work / "test.csv"),
                                                 "--negative-label", NA, "--model", model, *common],
                            args.timeout, run_name="gids-sentences")
    best = sentences["summary"]["best_checkpoint"]
    labels = list(load_checkpoint(Path(best), weights=False).labels)
    scored = {BAGS: {"valid": bags["summary"]["valid"], "test": bags["summary"]["test"],
                     "epochs": len(bags["epochs"]), "wall_s": bags["wall_s"]},
              SENTENCES: {**sentence_bag_scores(work, best, labels, args.timeout),
                          "epochs": len(sentences["epochs"]), "wall_s": sentences["wall_s"]}}
    return sizes, model, scored


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gids", type=Path, default=GIDS, help="the folder with test.tsv and dev.tsv")
    parser.add_argument("--valid-fraction", type=float, default=0.1, help="share of test.tsv's bags that validates")
    parser.add_argument("--seeds", default="0,1,2", help="one pair of runs per seed (default: 0,1,2)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--flags", default="", help="more flags for both training runs (an experiment)")
    parser.add_argument("--markdown", type=Path, default=None, help="rewrite the bench_gids part of this file")
    add_run_options(parser, None, "", "docs/results_gids.json", timeout=3600)
    args = parser.parse_args(argv)
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="bench_gids-"))
    seeds = [int(s) for s in args.seeds.split(",")]
    runs = {seed: one_seed(args, work / f"seed{seed}", seed) for seed in seeds}
    rows = []
    for name in (BAGS, SENTENCES):
        for seed, (_, _, scored) in runs.items():
            s = scored[name]
            rows.append([name, seed, *(f"{s['test'][k]:.4f}" for k in SHOWN), f"{s['valid']['auc']:.4f}",
                         s["epochs"], f"{s['wall_s']:.0f}"])
        means = [float(np.mean([r[2][name]["test"][k] for r in runs.values()])) for k in SHOWN]
        rows.append([f"**{name}**", "mean", *(f"**{m:.4f}**" for m in means), "", "", ""])
    tables = table(["model", "seed", *(f"test {k}" for k in SHOWN), "valid auc", "epochs", "run s"], rows)
    wins = sum(r[2][BAGS]["test"]["auc"] > r[2][SENTENCES]["test"]["auc"] for r in runs.values())
    mean = {name: float(np.mean([r[2][name]["test"]["auc"] for r in runs.values()])) for name in (BAGS, SENTENCES)}
    tables += (f"\n\nThe bag model has the higher test AUC with {wins} of {len(runs)} seeds (mean {mean[BAGS]:.4f} "
               f"against {mean[SENTENCES]:.4f}).")
    sizes, model = runs[seeds[0]][0], runs[seeds[0]][1]
    flags = ["--num-workers", str(args.workers), *args.flags.split()]
    result = {"machine": machine(), "sizes": {seed: r[0] for seed, r in runs.items()}, "model": model,
              "flags": flags, "scores": {seed: r[2] for seed, r in runs.items()}}
    if args.markdown:
        write_markdown(args.markdown, tables, sizes, model, flags)
    finish(result, tables, args, work)
    return 0


def write_markdown(path: Path, tables: str, sizes: dict[str, int], model: str, flags: list[str]) -> None:
    """The table and how it was made, between the ``bench_gids`` markers of ``path`` (added at the end when
    absent)."""
    text = path.read_text(encoding="utf-8") if path.exists() else ""
    body = (f"{MARKERS[0]}\n## Distant supervision: bags against sentences on GIDS\n\n"
            f"`scripts/bench_gids.py`: both train on GIDS `test.tsv` (5,663 sentences in 3,247 bags; a seeded 10% "
            f"of its bags validates, {sizes['valid_bags']:,} with the first seed) and are "
            f"tested once on `dev.tsv` ({sizes['test_sentences']:,} sentences in {sizes['test_bags']:,} bags): GIDS's "
            f"training split is not available here. Encoder `{model}` with nre_ray's defaults for both "
            f"(`{' '.join(flags)}`; the seed draws the validation bags and the initial weights); "
            "the bag model is selective attention (`--bag-aggregator att`, chosen on "
            "validation AUC); the sentence model is trained on each sentence's own label (NA the negative label) "
            "and scored at the bag level by the at-least-one rule (a relation's bag score is its best sentence's "
            "probability). Both are scored by the same code: OpenNRE's held-out evaluation, NA left out of the "
            f"positives; F1 at the threshold chosen on validation.\n\n{tables}\n{MARKERS[1]}\n")
    if MARKERS[0] in text and MARKERS[1] in text:
        before, rest = text.split(MARKERS[0], 1)
        after = rest.split(MARKERS[1], 1)[1].lstrip("\n")
        text = before + body + ("\n" + after if after else "")
    else:
        text = text.rstrip("\n") + "\n\n" + body
    path.write_text(text, encoding="utf-8")


if __name__ == "__main__":
    sys.exit(main())
