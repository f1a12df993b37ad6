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
