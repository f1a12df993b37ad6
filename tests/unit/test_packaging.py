"""The project's packaging files: pyproject.toml reads without setuptools' deprecation warnings, and the documented
``ray job submit --working-dir .`` leaves the repository's own folders at home, quietly."""

import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_pyproject_reads_without_setuptools_warnings() -> None:
    # pip install prints each SetuptoolsDeprecationWarning of the build (the license as a TOML table: three times)
    from setuptools.config.pyprojecttoml import apply_configuration
    from setuptools.dist import Distribution

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        dist = apply_configuration(Distribution(), ROOT / "pyproject.toml")
    assert dist.metadata.license_expression == "Apache-2.0"
