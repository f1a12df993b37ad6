"""The Ray and MLflow releases nre_ray is tested on, and the one warning a command gives when it runs on others.

:data:`TESTED` is the same set of ranges as pyproject.toml's dependencies (``tests/unit/test_versions.py`` keeps
them equal); ``scripts/check_versions.sh`` runs the releases at both ends of them, and ``constraints.txt`` pins the
default install. A leaf: it imports nothing of ours, and reads the installed versions from the packages' metadata
without importing Ray or MLflow (a command warns before they load).
"""

from __future__ import annotations

import sys
from importlib import metadata
from typing import TextIO

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

#: distribution -> the releases that are tested (pyproject.toml's specifiers, without extras)
TESTED: dict[str, str] = {"ray": ">=2.59,<2.61", "mlflow": ">=3.16.1,<3.18"}
#: How the warning names each distribution.
_NAMES = {"ray": "Ray", "mlflow": "MLflow"}

_warned = False


def installed_version(distribution: str) -> str | None:
    """The installed version of ``distribution`` (None when it is not installed)."""
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def untested_warning() -> str | None:
    """One ``warning:`` line naming the installed Ray or MLflow releases outside :data:`TESTED` and the tested
    ranges; None when both are inside (or not installed)."""
    outside = []
    for distribution, spec in TESTED.items():
        found = installed_version(distribution)
        if found is None:
            continue
        try:
            inside = SpecifierSet(spec).contains(Version(found), prereleases=True)
        except InvalidVersion:
            inside = False
        if not inside:
            outside.append(f"{_NAMES[distribution]} {found}")
    if not outside:
        return None
    ranges = ", ".join(f"{_NAMES[d]} {spec}" for d, spec in TESTED.items())
    return (f"warning: {' and '.join(outside)} {'is' if len(outside) == 1 else 'are'} outside the tested releases "
            f"({ranges}); it may work, but nothing here checked it (docs/development.md#versions)")


def warn_if_untested(stream: TextIO | None = None) -> None:
    """Print :func:`untested_warning` once per process (to stderr by default); every command calls this as it
    starts (through :func:`nre_ray.cluster.session.quiet_environ`)."""
    global _warned
    if _warned:
        return
    _warned = True
    line = untested_warning()
    if line:
        print(line, file=stream or sys.stderr)
