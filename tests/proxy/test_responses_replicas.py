"""Two router replicas sharing `state:` in a real Redis: a conversation begun through one is
continued, retrieved and refused to other keys through the other."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.fakebackend import FakeBackend
from tests.proxy.apistack import api_profile, client, sdk, start_router
from tests.redisserver import redis_server
from tests.servers import server_group

pytestmark = pytest.mark.timeout(60)
MODEL = "fake-model"


async def test_a_conversation_continues_through_another_replica(tmp_path: Path) -> None:
    backends = [FakeBackend() for _ in range(2)]
    for i, backend in enumerate(backends):
        backend.api.tag = f"b{i}"
    async with redis_server(tmp_path) as redis, server_group() as group:
        urls = [await group.start(b) for b in backends]
        data = api_profile(urls, state={"redis_url": redis.url, "timeout_s": 2.0})
        (one, _), (two, _) = [await start_router(group, data) for _ in range(2)]
        async with sdk(one) as first_replica, sdk(two) as second_replica:
            began = [await first_replica.responses.create(model=MODEL, input=f"hi {i}") for i in range(2)]
            for first in began:
                where = first.output_text.split(" on ")[1]
                # The id's write to Redis runs in the background of the first replica: wait for it.
                async with redis.client() as probe:
                    while not await probe.exists(f"lane-router:resp:{first.id}"):
                        pass
                follow = await second_replica.responses.create(
                    model=MODEL, input="next", previous_response_id=first.id
                )
                assert follow.output_text == f"turn 2 on {where}"
                assert (await second_replica.responses.retrieve(first.id)).id == first.id
        async with client(two, "reader") as other:
            assert (await other.get(f"/v1/responses/{began[0].id}")).status_code == 404
