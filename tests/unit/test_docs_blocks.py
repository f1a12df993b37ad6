"""README.md and docs/*.md, without running anything: every command block is run by the docs test or says why not,
every documented ``python -m nre_ray...`` command parses with its own parser, and the README is a front page."""

from __future__ import annotations

import re

from tests.docs_blocks import KINDS, PARSERS, REPO, RUNNABLE, all_blocks, commands


def test_every_command_block_is_run_or_says_why_not():
    blocks = all_blocks()
    assert len(blocks) > 20
    for block in blocks:
        if block.kind is not None:
            assert block.kind in KINDS, f"{block}: unknown docs-test marker {block.kind!r}"
            assert block.lang in RUNNABLE, f"{block}: a docs-test marker on a ```{block.lang} block"
        if block.kind == "skip":
            assert block.arg, f"{block}: say why the block is skipped"
        if block.lang not in RUNNABLE:  # an output or a file's content: it must not hide commands
            assert not re.search(r"^\$ |^python -m |^make ", block.body, re.M), \
                f"{block}: commands in a ```{block.lang or '(plain)'} block; use ```bash or ```console"


def test_every_documented_command_parses():
    checked = 0
    for block in all_blocks():
        if block.lang not in RUNNABLE:
            continue
        for argv in commands(block.body):
            parser = PARSERS.get(argv[0])
            assert parser is not None, f"{block}: unknown command python -m {argv[0]}"
            try:
                parser().parse_args(argv[1:])
            except SystemExit as err:
                assert err.code == 0, f"{block}: python -m {' '.join(argv)} does not parse"
            checked += 1
    assert checked > 15


def test_readme_is_a_front_page_with_a_map_of_the_docs():
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) < 150
    for doc in sorted((REPO / "docs").glob("*.md")):
        assert f"(docs/{doc.name})" in readme, f"README.md does not link docs/{doc.name}"
    image = re.search(r"!\[[^]]*\]\((docs/[^)]+\.png)\)", readme)
    assert image and (REPO / image[1]).stat().st_size < 400_000
