"""`lane-router serve --workers 2` as a process tree: a reload of any kind reaches every worker,
a worker that dies is restarted, SIGTERM lets a stream in progress finish before everything
exits and a second one ends it at once with the shutdown event, a parent that dies takes its
workers with it, and one scrape counts every worker."""

from __future__ import annotations

import asyncio
import os
import re
import signal
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from router.supervisor.workerchannel import ANSWER, MAX_LINE, RELOADED, ChannelError, Lines, message
from router.supervisor.workers import RESTART_MAX_S, RESTART_MIN_S, restart_delay
from tests.support.processes import last_error, stream_stopped_twice
from tests.support.profiles import auth
from tests.support.scaleout import (
    RecordingBackend,
    Router,
    alive,
    burst,
    chat,
    every_worker_ready,
    router,
    shaped,
    until_exited,
    write_profile,
)
from tests.support.servers import server_group

Backend = tuple[RecordingBackend, str]


@pytest.fixture
async def backend() -> AsyncIterator[Backend]:
    recording = RecordingBackend()
    async with server_group() as group:
        yield recording, await group.serve(recording)


async def reloads(r: Router) -> dict[str, float]:
    samples = (await r.metrics()).get("lane_router_config_reloads_total", [])
    return {labels["worker"]: v for labels, v in samples if labels["result"] == "success"}


async def until_reloads(r: Router, count: int) -> None:
    async with asyncio.timeout(30):
        while (await reloads(r)) != {"0": count, "1": count}:
            await asyncio.sleep(0.1)


def test_restarts_back_off_from_half_a_second_to_half_a_minute() -> None:
    delays = [restart_delay(n) for n in range(1, 10)]
    assert delays[0] == RESTART_MIN_S and delays[1] == 2 * RESTART_MIN_S
    assert delays[-1] == RESTART_MAX_S and delays == sorted(delays)


async def test_every_kind_of_reload_reaches_every_worker(tmp_path: Path, backend: Backend) -> None:
    _, url = backend
    data = shaped(url)
    config = write_profile(tmp_path / "p.yaml", data)
    async with router(config, workers=2, LANE_ROUTER_WATCH_INTERVAL_S="0.2") as r:
        await every_worker_ready(r, 2)

        os.kill(r.proc.pid, signal.SIGHUP)  # to the parent, which forwards it
        await until_reloads(r, 1)

        async with r.client() as http:
            answer = await http.post("/admin/reload", headers=auth("ops"))
        assert answer.status_code == 200, answer.text
        # Answered once every worker had reloaded: the one asked, and the other through the parent.
        assert [(w["worker"], w["result"]) for w in answer.json()["workers"]] == [
            (0, "reloaded"),
            (1, "reloaded"),
        ]
        assert await reloads(r) == {"0": 2, "1": 2}

        data["lanes"]["chat"]["max_in_flight"] = 7
        write_profile(tmp_path / "p.yaml", data)  # each worker watches the file
        await until_reloads(r, 3)
    assert re.search(r"worker [01] asks every worker to reload \(admin request\)", r.log.read_text())


async def test_a_worker_that_dies_is_restarted_and_the_port_keeps_serving(
    tmp_path: Path, backend: Backend
) -> None:
    _, url = backend
    config = write_profile(tmp_path / "p.yaml", shaped(url))
    async with router(config, workers=2) as r:
        await every_worker_ready(r, 2)
        first = r.workers()
        assert len(first) == 2
        os.kill(first[0], signal.SIGKILL)
        # Until it has exited, its socket still takes its share of new connections, and the
        # kernel resets those it had queued when it goes (docs/scaling.md, "Restarts").
        await until_exited(first[0])
        async with asyncio.timeout(30):
            while len(now := r.workers()) != 2 or now == first:
                assert await burst([r], [chat()]) == [200]  # the other worker serves meanwhile
                await asyncio.sleep(0.1)
        await every_worker_ready(r, 2)
        assert await burst([r], [chat() for _ in range(6)]) == [200] * 6
    log = r.log.read_text()
    assert f"worker 0 (pid {first[0]}) was killed by SIGKILL" in log and "restarting it in 0.5 s" in log


async def test_sigterm_lets_a_stream_in_progress_finish_then_everything_exits(
    tmp_path: Path, backend: Backend
) -> None:
    recording, url = backend
    recording.itl_s = 0.05
    config = write_profile(tmp_path / "p.yaml", shaped(url))
    async with router(config, workers=2) as r:
        await every_worker_ready(r, 2)
        workers = r.workers()
        async with (
            r.client() as http,
            http.stream("POST", "/v1/chat/completions", json=chat(tokens=40), headers=auth("user")) as resp,
        ):
            await recording.recording.until(lambda: recording.recording.serving == 1)
            os.kill(r.proc.pid, signal.SIGTERM)
            body = (await resp.aread()).decode()
        assert resp.status_code == 200 and body.count("data: {") == 40 and body.endswith("data: [DONE]\n\n")
        assert await asyncio.wait_for(asyncio.to_thread(r.proc.wait), 30) == 0
        assert not any(alive(pid) for pid in workers)


@pytest.mark.timeout(120)
async def test_a_second_sigterm_ends_a_stream_at_once_with_the_shutdown_event(
    tmp_path: Path, backend: Backend
) -> None:
    # The stream would run 200 s, the grace period is a minute: only the second signal ends it.
    recording, url = backend
    recording.itl_s = 0.02
    config = write_profile(tmp_path / "p.yaml", shaped(url))
    async with router(config, workers=2, LANE_ROUTER_GRACEFUL_SHUTDOWN_S="60") as r:
        await every_worker_ready(r, 2)
        workers = r.workers()
        async with r.client() as http:
            status, body = await stream_stopped_twice(
                http, chat(tokens=10_000), auth("user"), r.proc.pid, r.log
            )
        assert await asyncio.wait_for(asyncio.to_thread(r.proc.wait), 30) == 0
        assert not any(alive(pid) for pid in workers)
    assert status == 200
    error = last_error(body)
    assert (error["code"], error["type"]) == ("server_shutdown", "service_unavailable")


async def test_workers_whose_parent_died_stop_by_themselves(tmp_path: Path, backend: Backend) -> None:
    _, url = backend
    config = write_profile(tmp_path / "p.yaml", shaped(url))
    async with router(config, workers=2) as r:
        await every_worker_ready(r, 2)
        workers = r.workers()
        os.kill(r.proc.pid, signal.SIGKILL)
        await until_exited(*workers)


async def test_one_scrape_counts_every_worker_with_a_worker_label(tmp_path: Path, backend: Backend) -> None:
    _, url = backend
    config = write_profile(tmp_path / "p.yaml", shaped(url))
    async with router(config, workers=2) as r:
        await every_worker_ready(r, 2)
        assert await burst([r], [chat() for _ in range(40)]) == [200] * 40
        samples = (await r.metrics())["lane_router_requests_total"]
    per_worker = {labels["worker"]: v for labels, v in samples if labels["status"] == "200"}
    assert set(per_worker) == {"0", "1"} and sum(per_worker.values()) == 40


def test_channel_messages_are_read_whole_however_the_reads_cut_them() -> None:
    sent = message(RELOADED, 7, {"worker": 1, "issues": ["a\nb"]}) + message(ANSWER, 8, [1, 2])
    for cut in range(len(sent) + 1):
        lines = Lines()
        read = [*lines.feed(sent[:cut]), *lines.feed(sent[cut:])]
        assert read == [(RELOADED, 7, {"worker": 1, "issues": ["a\nb"]}), (ANSWER, 8, [1, 2])]
    with pytest.raises(ChannelError):
        list(Lines().feed(b"reload x {}\n"))
    with pytest.raises(ChannelError):
        list(Lines().feed(b"x" * (MAX_LINE + 1)))
