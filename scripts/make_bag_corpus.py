#!/usr/bin/env python3
"""Write a synthetic distant-supervision corpus in NYT10's TSV layout, or the bundled bag sample.

The corpus (``--out FILE``) defaults to NYT10's training-set shape: 570,000 sentences in 280,000 entity-pair bags,
53 relations (NA included), mostly NA, heavy-tailed bag sizes. ``--sample`` (re)writes the bundled bag sample in
``nre_ray/tasks/bag/sample/`` (or ``--out FOLDER``). Deterministic by ``--seed``; see
:mod:`nre_ray.tasks.bag.synthetic` for the distributions.

    python scripts/make_bag_corpus.py --out /tmp/nyt10_synthetic.tsv
    python scripts/make_bag_corpus.py --out /tmp/small.tsv --sentences 5700 --pairs 2800
    python scripts/make_bag_corpus.py --sample
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from nre_ray.tasks.bag.synthetic import CorpusSpec, write_corpus, write_sample

DEFAULT_SAMPLE = Path(__file__).resolve().parents[1] / "nre_ray" / "tasks" / "bag" / "sample"


def main(argv: list[str] | None = None) -> int:
    """Parse the options and write the corpus or the sample; 2 on a bad option."""
    defaults = CorpusSpec()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, help="the TSV file to write (with --sample: the folder)")
    parser.add_argument("--sample", action="store_true", help="write the bundled bag sample instead")
    parser.add_argument("--sentences", type=int, default=defaults.sentences, help="sentences (lines)")
    parser.add_argument("--pairs", type=int, default=defaults.pairs, help="entity pairs (bags)")
    parser.add_argument("--relations", type=int, default=defaults.relations, help="relations, NA included")
    parser.add_argument("--na-share", type=float, default=defaults.na_share, help="share of NA pairs")
    parser.add_argument("--alpha", type=float, default=defaults.alpha, help="bag-size power law exponent")
    parser.add_argument("--seed", type=int, default=defaults.seed, help="random seed")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    if args.sample:
        folder = args.out or DEFAULT_SAMPLE
        counts = write_sample(folder)
        print(f"wrote {folder}: " + ", ".join(f"{name} {n} sentences" for name, n in counts.items()))
        return 0
    if args.out is None:
        parser.error("--out FILE is required (or pass --sample)")
    spec = CorpusSpec(sentences=args.sentences, pairs=args.pairs, relations=args.relations, na_share=args.na_share,
                      alpha=args.alpha, seed=args.seed)
    try:
        spec.check()
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    count = write_corpus(args.out, spec)
    print(f"wrote {args.out}: {count} sentences in {spec.pairs} bags, {spec.relations} relations "
          f"({time.perf_counter() - start:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
