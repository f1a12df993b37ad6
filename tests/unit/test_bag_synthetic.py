"""The synthetic NYT10-style corpus: deterministic by seed, exact sizes, heavy-tailed bags, mostly NA, readable by
the NYT10 reader; the bundled bag sample is what its generator writes; the script's errors."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from nre_ray.tasks.bag import bags, synthetic
from nre_ray.tasks.bag.files import detect_bag_format, read_bag_table, read_relation2id

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "nre_ray" / "tasks" / "bag" / "sample"


def test_nyt10_sized_bag_sizes() -> None:
    spec = synthetic.CorpusSpec()
    sizes = synthetic.bag_sizes(spec, np.random.default_rng(0))
    assert len(sizes) == 280_000 and sizes.sum() == 570_000 and sizes.min() >= 1
    assert 0.65 < (sizes == 1).mean() < 0.8 and np.median(sizes) == 1  # most bags: one sentence
    assert sizes.max() > 500 and np.percentile(sizes, 99) >= 10  # a heavy tail
    assert np.array_equal(sizes, synthetic.bag_sizes(spec, np.random.default_rng(0)))


def test_small_corpus_reads_back(tmp_path: Path) -> None:
    spec = synthetic.CorpusSpec(sentences=2_000, pairs=900, relations=8, multi_share=0.3, seed=4)
    path = tmp_path / "corpus.tsv"
    assert synthetic.write_corpus(path, spec) == 2_000
    assert path.read_bytes() == b"".join(line.encode() for line in synthetic.corpus_lines(spec))  # deterministic
    other = "".join(synthetic.corpus_lines(synthetic.CorpusSpec(sentences=2_000, pairs=900, relations=8, seed=5)))
    assert other != path.read_text()
    assert detect_bag_format(path) == "nyt10"
    frame = read_bag_table(path)
    assert len(frame) == 2_000 and (frame["problem"] == "").all()
    built = bags.build_bags(frame)
    assert len(built) == 900 and built["total"].sum() == 2_000
    na_bags = built["labels"].map(lambda labels: labels == ("NA",)).mean()
    assert 0.7 < na_bags < 0.9  # mostly NA (na_share 0.8)
    assert (built["labels"].map(len) > 1).sum() > 0  # multi-label pairs
    assert set(frame["relation"]) <= set(synthetic.relation_names(8))


def test_bundled_sample_is_the_generators(tmp_path: Path) -> None:
    counts = synthetic.write_sample(tmp_path)
    assert counts == {"train": 400, "valid": 120, "test": 120}
    for name in ("train.tsv", "valid.tsv", "test.tsv", "relation2id.txt"):
        assert (SAMPLE / name).read_bytes() == (tmp_path / name).read_bytes(), f"regenerate {name}: " \
            "python scripts/make_bag_corpus.py --sample"
    assert read_relation2id(SAMPLE / "relation2id.txt") == synthetic.relation_names(5)
    keys = [set(bags.build_bags(read_bag_table(SAMPLE / f"{s}.tsv"))["bag"]) for s in ("train", "valid", "test")]
    assert not (keys[0] & keys[1] or keys[0] & keys[2] or keys[1] & keys[2])  # no pair in two splits


def test_spec_and_script_errors(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="need 1 <= pairs <= sentences"):
        synthetic.CorpusSpec(sentences=5, pairs=6).check()
    with pytest.raises(ValueError, match="relations counts NA"):
        synthetic.CorpusSpec(relations=1).check()
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "make_bag_corpus.py"), "--out",
                          str(tmp_path / "x.tsv"), "--sentences", "10", "--pairs", "20"],
                         capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 2 and out.stderr.strip().splitlines() == [
        "error: need 1 <= pairs <= sentences, found pairs=20, sentences=10"]
    assert not (tmp_path / "x.tsv").exists()
