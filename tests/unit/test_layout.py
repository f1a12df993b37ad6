"""docs/development.md's layout block against the tree.

How the block is read (the rule the tests check, and the one to write the block by):

* The block is the first fenced block after ``## Layout``. An *entry* is a line that starts in the first column,
  with the indented lines after it.
* In an entry, every word that ends in ``.py`` names a module, and every word that ends in ``/`` names a folder
  (``cluster/``, ``formats/``, ``sample/``). The first one of the entry is its head (``nre_ray/config.py``,
  ``nre_ray/cluster/``); its folder (a module's folder, or the folder itself) is the entry's folder.
* A name is looked up in the entry's folder first, then in ``nre_ray/``, then at the repository's root; it must exist
  in one of them, as a file (``.py``) or a folder (``/``). So ``session.py`` under ``nre_ray/cluster/`` is
  nre_ray/cluster/session.py, ``serve/cli.py`` under ``nre_ray/config.py`` is nre_ray/serve/cli.py, and
  ``scripts/make_bag_corpus.py`` is the repository's.
* Every module of nre_ray/ is named, but two kinds, which are covered: a package's ``__init__.py`` once the package or
  anything in it is named; and the modules directly in a folder whose name is followed by ``(one module per``
  (``formats/ (one module per input format)``).
"""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "nre_ray"
DOC = REPO / "docs" / "development.md"

#: A module (``.py``) or a folder (``/`` at the end), not a part of a longer word or path.
NAME = re.compile(r"(?<![\w/.])(?:[\w/]*\w\.py|\w+(?:/\w+)*/)(?![\w/.])")
ONE_PER = re.compile(r"\s*\(one\s+module\s+per\b")


def layout_entries(text: str) -> list[str]:
    """The entries of the layout block of ``text`` (a line in the first column and the indented lines after it)."""
    section = text.split("\n## Layout\n", 1)[1]
    block = re.search(r"^```\n(.*?)^```$", section, re.M | re.S)
    assert block, "docs/development.md: no fenced block under ## Layout"
    entries: list[str] = []
    for line in block[1].splitlines():
        if line[:1].isspace() and entries:
            entries[-1] += "\n" + line
        elif line.strip():
            entries.append(line)
    return entries


def named(entry: str) -> list[tuple[str, Path | None, bool]]:
    """The names of one entry: each as written, the path it resolves to (None: nowhere), and whether it is
    followed by ``(one module per``."""
    found = list(NAME.finditer(entry))
    if not found:
        return []
    head = REPO / found[0][0]
    folder = head if found[0][0].endswith("/") else head.parent
    out = []
    for match in found:
        name = match[0]
        places = [base / name for base in (folder, PACKAGE, REPO)]
        path = next((p for p in places if (p.is_dir() if name.endswith("/") else p.is_file())), None)
        out.append((name, path, bool(ONE_PER.match(entry, match.end()))))
    return out


def _layout() -> list[tuple[str, Path | None, bool]]:
    return [name for entry in layout_entries(DOC.read_text(encoding="utf-8")) for name in named(entry)]


def _modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts)


def test_every_name_in_the_layout_exists():
    missing = [name for name, path, _ in _layout() if path is None]
    assert not missing, f"docs/development.md's layout names what the tree does not have: {missing}"


def test_every_module_is_in_the_layout():
    names = _layout()
    paths = {path.resolve() for _, path, _ in names if path is not None}
    one_per = {path.resolve() for _, path, per in names if path is not None and per}
    uncovered = []
    for module in _modules():
        package = module.parent.resolve()
        if module.name == "__init__.py":
            covered = any(p == package or package in p.parents for p in paths)
        else:
            covered = module.resolve() in paths or package in one_per
        if not covered:
            uncovered.append(str(module.relative_to(REPO)))
    assert not uncovered, f"modules docs/development.md's layout does not name: {uncovered}"


def test_the_rule_reads_what_it_says():
    """The reading of an entry, on a made-up one: names relative to the entry's folder, then nre_ray/, then the
    root; folders; ``(one module per``; a word that only contains ``.py`` or ``/`` is no name."""
    entry = ("nre_ray/data/           read.py (read_table), formats/ (one module per input format), sample/, models/\n"
             "                        scripts/make_bag_corpus.py, nowhere.py, ray://HOST, s3://BUCKET, docs/data.md,\n"
             "                        mod.pyc")
    got = {name: (path.relative_to(REPO).as_posix() if path else None, per) for name, path, per in named(entry)}
    assert got == {"nre_ray/data/": ("nre_ray/data", False), "read.py": ("nre_ray/data/read.py", False),
                   "formats/": ("nre_ray/data/formats", True), "sample/": ("nre_ray/data/sample", False),
                   "models/": ("nre_ray/models", False),
                   "scripts/make_bag_corpus.py": ("scripts/make_bag_corpus.py", False), "nowhere.py": (None, False)}
    assert layout_entries("x\n## Layout\n\n```\na/  one\n    two\nb.py three\n```\n") == ["a/  one\n    two",
                                                                                        "b.py three"]


def test_no_two_modules_share_a_name():
    """A module's name says what it is, once: no two modules of nre_ray/ have one name (a package's ``__init__.py``
    and ``__main__.py`` aside)."""
    seen: dict[str, list[str]] = {}
    for module in _modules():
        if module.name not in ("__init__.py", "__main__.py"):
            seen.setdefault(module.stem, []).append(str(module.relative_to(REPO)))
    twins = {name: paths for name, paths in seen.items() if len(paths) > 1}
    assert not twins, f"modules that share a name: {twins}"


def test_the_top_holds_the_commands_and_the_foundations():
    """Directly in nre_ray/ are only the commands (``python -m nre_ray.<name>``: a ``__main__`` block), config.py
    and storage.py; the run library is run/, the shared helpers core/, and the rest are subsystems' packages."""
    top = {p.name for p in PACKAGE.glob("*.py")}
    commands = {p.name for p in PACKAGE.glob("*.py") if 'if __name__ == "__main__":' in p.read_text(encoding="utf-8")}
    assert commands == {"train.py", "predict.py", "evaluate.py", "standin.py"}
    assert top - commands == {"__init__.py", "config.py", "storage.py"}
    assert (PACKAGE / "run" / "__init__.py").is_file() and (PACKAGE / "core" / "__init__.py").is_file()
