"""Worker sizing from the cluster's resources, and clear refusals for what cannot be placed."""

import pytest

from nre_ray.train import UsageError, plan_resources


def test_more_workers_than_cores_get_fractions():
    r = plan_resources(4, False, [{"CPU": 2.0}])
    assert r.per_worker == {"CPU": 0.5} and r.threads == 1
    assert plan_resources(2, False, [{"CPU": 16.0}]).per_worker == {"CPU": 1.0}


def test_uneven_nodes_still_place_every_worker():
    r = plan_resources(5, False, [{"CPU": 3.0}, {"CPU": 1.0}])
    per = r.per_worker["CPU"]
    assert int(3.0 / per) + int(1.0 / per) >= 5


def test_gpu_requests():
    with pytest.raises(UsageError, match="no GPU"):
        plan_resources(2, True, [{"CPU": 2.0}])
    with pytest.raises(UsageError, match="needs 4 GPUs, but the cluster has 2"):
        plan_resources(4, True, [{"CPU": 8.0, "GPU": 2.0}])
    r = plan_resources(2, True, [{"CPU": 8.0, "GPU": 2.0}, {"CPU": 4.0}])
    assert r.per_worker == {"CPU": 4.0, "GPU": 1} and r.threads == 4


def test_cpus_per_worker_sets_cpus_and_threads():
    r = plan_resources(1, False, [{"CPU": 2.0}], cpus_per_worker=2.0)
    assert r.per_worker == {"CPU": 2.0} and r.threads == 2
    r = plan_resources(3, False, [{"CPU": 4.0}, {"CPU": 2.0}], cpus_per_worker=2.0)
    assert r.per_worker == {"CPU": 2.0} and r.threads == 2
    assert plan_resources(2, False, [{"CPU": 2.0}], cpus_per_worker=0.5).threads == 1
    r = plan_resources(2, True, [{"CPU": 16.0, "GPU": 2.0}], cpus_per_worker=6.0)
    assert r.per_worker == {"CPU": 6.0, "GPU": 1} and r.threads == 6


def test_cpus_per_worker_that_does_not_fit_is_refused():
    # 3 + 1 CPUs hold only two 1.5-CPU workers (a worker never spans nodes)
    with pytest.raises(UsageError, match=r"--num-workers 3 with --cpus-per-worker 1.5: .* room for 2 workers"):
        plan_resources(3, False, [{"CPU": 3.0}, {"CPU": 1.0}], cpus_per_worker=1.5)
    with pytest.raises(UsageError, match="room for 1 workers of one GPU and 8 CPUs"):
        plan_resources(2, True, [{"CPU": 12.0, "GPU": 2.0}], cpus_per_worker=8.0)


def test_a_local_ray_that_does_not_start_in_time_is_a_clear_error(monkeypatch):
    """Ray's raylet must register within a fixed 30 s; on an overloaded machine it does not, and Ray raises a bare
    Exception. That cannot be produced on demand, so ray.init is replaced by one that raises Ray's message."""
    import ray

    from nre_ray.train import start_ray

    def times_out(**kwargs):
        raise Exception("The current node timed out during startup. This could happen because some of the raylet "
                        "failed to startup or the GCS has become overloaded.")

    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", times_out)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    with pytest.raises(UsageError, match=r"the local Ray did not start: .* load average .* --address auto"):
        start_ray(None, 2)
