"""Config drift against a live server: a pool that declares a longer context than its server runs."""

from __future__ import annotations

import pytest

from tests.lab.realvllm.conftest import RealPools
from tests.lab.realvllm.realrouter import DRIFT, real_router
from tests.support.profiles import auth

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(420)]


async def test_declared_context_longer_than_live_is_reported(real_pools: RealPools) -> None:
    data = real_pools.profile()
    data["pools"]["interactive"]["vllm"]["max_model_len"] = 4096  # the server runs 2048
    async with real_router(data) as front:
        await front.settled()
        async with front.http() as client:
            resp = await client.get("/admin/lanes", headers=auth("ops"))
        # Read while the router still runs: its shutdown forgets every backend's series.
        samples = front.samples()
    assert resp.status_code == 200
    pools = resp.json()["pools"]
    [drifted] = pools["interactive"]["backends"]
    [matching] = pools["batch"]["backends"]
    assert drifted["url"] == real_pools.interactive.url
    assert any("max_model_len" in d and "4096" in d and "2048" in d for d in drifted["drift"]), drifted
    assert len(drifted["drift"]) == 1, "version and model match the live server"
    assert matching["drift"] == []
    assert samples.matching(DRIFT, pool="interactive", backend=real_pools.interactive.url) == [1.0]
    assert samples.matching(DRIFT, pool="batch", backend=real_pools.batch.url) == [0.0]
