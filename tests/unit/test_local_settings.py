"""The dashboard of the local Ray a command starts (nre_ray.cluster.local_settings): with it by default, the State API
pinned to its port; without it (NRE_RAY_DASHBOARD=0), pinned where nothing answers, never to another Ray here."""

from __future__ import annotations

import os
import socket

import pytest

from nre_ray.cluster.local_settings import (
    DASHBOARD_ENV,
    NO_STATE_API,
    PREEMPTION_WATCHER_ENV,
    TRAIN_METRICS_ENV,
    dashboard_args,
    local_train_settings,
    with_dashboard,
)


@pytest.mark.parametrize(("value", "wanted"), [(None, True), ("1", True), ("yes", True), ("0", False),
                                               ("false", False), (" OFF ", False), ("no", False)])
def test_the_dashboard_is_on_unless_turned_off(monkeypatch, value, wanted):
    if value is None:
        monkeypatch.delenv(DASHBOARD_ENV, raising=False)
    else:
        monkeypatch.setenv(DASHBOARD_ENV, value)
    assert with_dashboard() is wanted


def test_with_the_dashboard_the_state_api_is_pinned_to_its_port(monkeypatch):
    monkeypatch.delenv(DASHBOARD_ENV, raising=False)
    monkeypatch.delenv("RAY_API_SERVER_ADDRESS", raising=False)
    args = dashboard_args()
    assert set(args) == {"dashboard_port"}
    assert os.environ["RAY_API_SERVER_ADDRESS"] == f"http://127.0.0.1:{args['dashboard_port']}"
    with socket.socket() as sock:  # a port free to bind, for the dashboard a moment later
        sock.bind(("127.0.0.1", args["dashboard_port"]))


@pytest.mark.parametrize("before", [None, ""])
def test_without_it_the_state_api_is_pinned_to_a_closed_port(monkeypatch, before):
    monkeypatch.setenv(DASHBOARD_ENV, "0")
    if before is None:
        monkeypatch.delenv("RAY_API_SERVER_ADDRESS", raising=False)
    else:
        monkeypatch.setenv("RAY_API_SERVER_ADDRESS", before)  # set but empty: unpinned, as Ray reads it
    assert dashboard_args() == {"include_dashboard": False}
    assert os.environ["RAY_API_SERVER_ADDRESS"] == NO_STATE_API == "http://127.0.0.1:9"


def test_a_users_own_state_api_address_is_kept(monkeypatch):
    for value in ("0", "1"):
        monkeypatch.setenv(DASHBOARD_ENV, value)
        monkeypatch.setenv("RAY_API_SERVER_ADDRESS", "http://10.0.0.5:8265")
        assert dashboard_args() == ({} if value == "1" else {"include_dashboard": False})
        assert os.environ["RAY_API_SERVER_ADDRESS"] == "http://10.0.0.5:8265"


@pytest.mark.parametrize("dashboard", [True, False])
def test_runs_on_a_local_ray_start_no_preemption_watcher_and_no_metrics_without_a_dashboard(monkeypatch, dashboard):
    monkeypatch.delenv(PREEMPTION_WATCHER_ENV, raising=False)
    monkeypatch.delenv(TRAIN_METRICS_ENV, raising=False)
    local_train_settings(dashboard)
    assert os.environ[PREEMPTION_WATCHER_ENV] == "0"
    assert os.environ.get(TRAIN_METRICS_ENV) == (None if dashboard else "0")


def test_the_users_own_train_switches_win(monkeypatch):
    monkeypatch.setenv(PREEMPTION_WATCHER_ENV, "1")
    monkeypatch.setenv(TRAIN_METRICS_ENV, "true")
    local_train_settings(dashboard=False)
    assert (os.environ[PREEMPTION_WATCHER_ENV], os.environ[TRAIN_METRICS_ENV]) == ("1", "true")
