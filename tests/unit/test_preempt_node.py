"""``python -m nre_ray.standin preempt-node`` without a cluster: which node it takes, and its one-line errors. The
preemption itself, on a real stand-in, is in tests/integration/test_standin.py."""

from __future__ import annotations

import pytest

from nre_ray.cluster import standin_cluster
from nre_ray.cluster.session import UsageError
from nre_ray.cluster.standin_cluster import choose_node
from nre_ray.standin import main as standin_main
from tests.procs import free_port

HEAD, A, B, C = "h" * 56, "a" * 56, "b" * 56, "c" * 56
ALIVE = {HEAD: True, A: False, B: False, C: False}


def test_by_default_the_first_worker_node_with_a_training_worker_is_taken():
    assert choose_node(None, ALIVE, {C, B}) == B
    assert choose_node(None, ALIVE, {HEAD, C}) == C  # a training worker on the head does not make it a candidate


def test_a_node_asked_for_is_taken_with_or_without_a_training_worker():
    assert choose_node(A, ALIVE, {B}) == A


@pytest.mark.parametrize(("asked", "training", "message"), [
    ("d" * 56, {A}, f"--node {'d' * 56}: no node of the stand-in has that id; its worker nodes: {A}, {B}, {C}"),
    (HEAD, {A}, f"--node {HEAD} is the head node, which a spot interruption never takes"),
    (None, set(), f"no worker node of the stand-in runs a training worker (worker nodes: {A}, {B}, {C}); start a "
                  "run first"),
    (None, {HEAD}, "no worker node of the stand-in runs a training worker"),
])
def test_what_cannot_be_preempted_is_refused(asked, training, message):
    with pytest.raises(UsageError, match="^" + message.replace("(", r"\(").replace(")", r"\)")):
        choose_node(asked, ALIVE, training)


def test_a_standin_without_worker_nodes_says_so():
    with pytest.raises(UsageError, match=r"runs a training worker \(it has no worker node\)"):
        choose_node(None, {HEAD: True}, set())


@pytest.mark.parametrize(("args", "message"), [
    (["--deadline", "-1"], "error: --deadline -1: the seconds from the notice to the node's end cannot be negative"),
    ([], "error: no stand-in in {dir} ({dir}/standin.json is missing); start one with"),
])
def test_argument_errors_are_one_line_and_exit_2(tmp_path, capsys, args, message):
    assert standin_main(["preempt-node", "--dir", str(tmp_path), *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith(message.format(dir=tmp_path)) and err.count("\n") == 1, err


def test_a_deadline_that_is_not_a_number_is_refused(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        standin_main(["preempt-node", "--dir", str(tmp_path), "--deadline", "soon"])
    assert exit_.value.code == 2 and "argument --deadline: invalid float value: 'soon'" in capsys.readouterr().err


def test_a_standin_that_is_recorded_but_not_running_is_reported(tmp_path, capsys):
    ports = [free_port() for _ in range(4)]
    standin_cluster.Standin(str(tmp_path), "b", *ports, "/tmp/none", "s", (10002, 10003)).save()
    assert standin_main(["preempt-node", "--dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: the stand-in's Ray at http://127.0.0.1:{ports[2]} does not answer (") \
        and err.count("\n") == 1, err
