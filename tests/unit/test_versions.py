"""The tested Ray and MLflow releases: nre_ray.core.versions.TESTED is pyproject.toml's ranges, the default install's
pins (constraints.txt) lie inside them, and a command started on a release outside them prints one warning line that
names the ranges. Another Ray cannot be installed inside a test: the installed version is replaced
(``installed_version``); scripts/check_versions.sh runs the real other releases."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from nre_ray.cluster.session import quiet_environ
from nre_ray.core import versions

REPO = Path(__file__).resolve().parents[2]


def project_ranges() -> dict[str, Requirement]:
    dependencies = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    return {r.name: r for r in map(Requirement, dependencies)}


def test_tested_is_pyprojects_ranges_and_the_pins_lie_inside():
    ranges = project_ranges()
    assert {name: str(ranges[name].specifier) for name in versions.TESTED} == {
        name: str(Requirement(f"{name}{spec}").specifier) for name, spec in versions.TESTED.items()}
    pins = dict(line.split("==") for line in (REPO / "constraints.txt").read_text().splitlines()
                if line and not line.startswith("#"))
    assert pins["ray"] == "2.60.0" and pins["mlflow"] == "3.17.2" and pins["torch"] == "2.13.0"
    for name in versions.TESTED:
        assert ranges[name].specifier.contains(pins[name]), (name, pins[name])
    assert "-c constraints.txt" in (REPO / "Makefile").read_text()


def installed(monkeypatch: pytest.MonkeyPatch, **found: str) -> None:
    """Pretend these releases are installed (the others as they are); the next command start warns again."""
    real = versions.installed_version
    monkeypatch.setattr(versions, "installed_version", lambda d: found.get(d) or real(d))
    monkeypatch.setattr(versions, "_warned", False)


@pytest.mark.parametrize(("found", "named"), [
    ({"ray": "2.58.0"}, "Ray 2.58.0 is"),
    ({"ray": "2.61.0"}, "Ray 2.61.0 is"),
    ({"mlflow": "3.18.0"}, "MLflow 3.18.0 is"),
    ({"mlflow": "3.16.0"}, "MLflow 3.16.0 is"),
    ({"ray": "2.58.0", "mlflow": "3.18.0"}, "Ray 2.58.0 and MLflow 3.18.0 are"),
])
def test_a_command_outside_the_tested_releases_warns_once(monkeypatch, capsys, found, named):
    installed(monkeypatch, **found)
    quiet_environ(())  # what every command calls as it starts (here without touching os.environ)
    quiet_environ(())  # and later again (start_ray): still one line
    out, err = capsys.readouterr()
    assert out == ""
    assert err.count("\n") == 1 and err.startswith(f"warning: {named} outside the tested releases"), err
    assert "(Ray >=2.59,<2.61, MLflow >=3.16.1,<3.18)" in err


@pytest.mark.parametrize("found", [{"ray": "2.59.0", "mlflow": "3.16.1"}, {"ray": "2.60.0", "mlflow": "3.17.2"},
                                   {"ray": "2.60.1", "mlflow": "3.17.0"}])
def test_the_tested_releases_give_no_warning(monkeypatch, capsys, found):
    installed(monkeypatch, **found)
    quiet_environ(())
    assert capsys.readouterr().err == ""
