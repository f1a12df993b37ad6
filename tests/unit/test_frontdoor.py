"""The long commands' front door (:func:`nre_ray.run.frontdoor.run_command`): a Ctrl-C is never lost."""

from __future__ import annotations

import os
import signal
import weakref

from nre_ray.run.frontdoor import run_command


class _Thing:
    pass


def _ctrl_c_inside_a_collector_callback() -> None:
    """A Ctrl-C that Python's handler raises inside a weakref callback (as SQLAlchemy's are while MLflow logs a
    model): Python prints "Exception ignored in ..." and goes on."""
    thing = _Thing()
    watch = weakref.ref(thing, lambda ref: (os.kill(os.getpid(), signal.SIGINT), sum(range(1000))))
    del thing  # the callback runs here; the handler raises inside it
    assert watch() is None


def test_a_ctrl_c_lost_inside_a_callback_still_ends_the_command_with_130(capsys) -> None:
    shown: list[dict] = []

    def work() -> tuple[dict, None]:
        _ctrl_c_inside_a_collector_callback()
        return {"done": True}, None

    before = signal.getsignal(signal.SIGINT)
    assert run_command(work, shown.append, "interrupted: the run is marked KILLED") == 130
    err = capsys.readouterr().err
    assert shown == [{"done": True}]  # the work had ended: its summary is shown
    assert err.strip() == "interrupted: it had finished its work (the summary above); nothing was lost"
    assert "Exception ignored" not in err and "Traceback" not in err
    assert signal.getsignal(signal.SIGINT) is before


def test_a_ctrl_c_during_the_work_is_the_interrupted_line(capsys) -> None:
    def work() -> tuple[dict, None]:
        os.kill(os.getpid(), signal.SIGINT)
        sum(range(1000))
        raise AssertionError("the Ctrl-C did not stop the work")

    assert run_command(work, print, "interrupted: the run is marked KILLED") == 130
    assert capsys.readouterr().err.strip() == "interrupted: the run is marked KILLED"


def test_without_ctrl_c_the_summary_and_0(capsys) -> None:
    assert run_command(lambda: ({"done": True}, None), print, "interrupted") == 0
    captured = capsys.readouterr()
    assert "{'done': True}" in captured.out and captured.err == ""
