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


SUBMIT = """
import logging, sys, zipfile
from pathlib import Path
from ray._private.runtime_env.packaging import create_package
from ray._private.runtime_env.working_dir import upload_working_dir_if_needed

logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s")
root, target = sys.argv[1], sys.argv[2]

def upload(working_dir, excludes, is_file=False):  # what ray job submit packages, into a file instead of the GCS
    create_package(working_dir, Path(target), include_parent_dir=False, excludes=excludes, include_gitignore=True)

upload_working_dir_if_needed({"working_dir": root}, include_gitignore=True, upload_fn=upload)
print("\\n".join(zipfile.ZipFile(target).namelist()))
"""


def test_the_documented_job_submit_ships_no_git_or_venv_and_says_nothing(tmp_path) -> None:
    """``ray job submit --working-dir .`` from the repository root, with the setting env.sh exports: Ray warned
    "Directory '.git' is now ignored by default ..." (and '.venv') on every submit; the .rayignore leaves them out."""
    import os
    import subprocess
    import sys

    from nre_ray.cluster.standin_cluster import Standin

    setting = "RAY_OVERRIDE_RUNTIME_ENV_DEFAULT_EXCLUDES"
    shell = Standin(str(tmp_path), "b", 1, 2, 3, 4, "/tmp/none", "s", (10002, 10003)).shell()
    assert f"export {setting}=''\n" in shell  # env.sh: Ray's default excludes off, the .rayignore in their place
    env = {**os.environ, setting: ""}
    out = subprocess.run([sys.executable, "-c", SUBMIT, str(ROOT), str(tmp_path / "package.zip")], env=env,
                         capture_output=True, text=True, timeout=120, check=True)
    assert "ignored by default" not in out.stderr, out.stderr
    names = out.stdout.split()
    assert "nre_ray/train.py" in names and "pyproject.toml" in names
    assert not [n for n in names if n.split("/")[0] in (".git", ".venv", "venv", ".standin", "ray_results", ".versions")
                or "__pycache__" in n], names
