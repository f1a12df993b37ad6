"""The fenced blocks of README.md and docs/*.md and the ``python -m nre_ray...`` commands in them: what the docs tests
read (tests/unit/test_docs_blocks.py checks every block is run or marked and every command parses;
tests/integration/test_docs_commands.py runs them)."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

from nre_ray.cluster.spot_watch import build_parser as spot_watch_parser
from nre_ray.data.__main__ import build_cli as data_parser
from nre_ray.evaluate import build_parser as evaluate_parser
from nre_ray.predict import build_parser as predict_parser
from nre_ray.serve.__main__ import build_parser as serve_parser
from nre_ray.standin import build_parser as standin_parser
from nre_ray.train import cli_parser as train_parser
from nre_ray.tune.__main__ import sweep_parser

REPO = Path(__file__).resolve().parents[1]
#: Written by the benchmark scripts; their commands are the benchmarks themselves (hours).
WRITTEN_BY_SCRIPTS = {"benchmarks.md", "results.md"}
DOC_FILES = [REPO / "README.md", *sorted(p for p in (REPO / "docs").glob("*.md") if p.name not in WRITTEN_BY_SCRIPTS)]
RUNNABLE = {"bash", "console", "python"}
KINDS = {"skip", "parse", "server", "exit"}
BLOCK = re.compile(r"(?:^<!-- docs-test: (?P<kind>\w+) ?(?P<arg>.*?) ?-->\n)?^```(?P<lang>[\w-]*)\n(?P<body>.*?)^```$",
                   re.M | re.S)
PARSERS = {"nre_ray.train": train_parser, "nre_ray.predict": predict_parser, "nre_ray.evaluate": evaluate_parser,
           "nre_ray.serve": serve_parser,
           "nre_ray.data": data_parser, "nre_ray.standin": standin_parser, "nre_ray.tune": sweep_parser,
           "nre_ray.cluster.spot_watch": spot_watch_parser}


@dataclass
class Block:
    """One fenced block of a document."""

    path: Path
    line: int
    lang: str
    body: str
    kind: str | None
    arg: str

    def __str__(self) -> str:
        return f"{self.path.relative_to(REPO)}:{self.line}"


def doc_blocks(path: Path) -> list[Block]:
    """The fenced blocks of ``path``, with the docs-test marker before each."""
    text = path.read_text(encoding="utf-8")
    return [Block(path, text.count("\n", 0, m.start("lang")) + 1, m["lang"], m["body"], m["kind"], m["arg"] or "")
            for m in BLOCK.finditer(text)]


def commands(body: str) -> list[list[str]]:
    """The ``python -m nre_ray.<cmd> ...`` commands of a block, as argv lists from the module on."""
    found = []
    joined = re.sub(r"\\\n", " ", body)
    for line in joined.splitlines():
        line = line.lstrip("$ ")
        start = line.find("python -m nre_ray.")
        if start < 0:
            continue
        try:
            argv = shlex.split(line[start:], comments=True)
        except ValueError:  # a quote that spans lines: not a command line of ours
            continue
        cut = next((i for i, word in enumerate(argv) if word in ("|", "||", "&&", ";", ">", "2>&1")), len(argv))
        found.append(argv[2:cut])
    return found


def all_blocks() -> list[Block]:
    return [block for path in DOC_FILES for block in doc_blocks(path)]


