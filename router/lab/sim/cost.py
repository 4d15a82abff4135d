"""What the simulator costs: CPU of one process serving N engines × M live streams, and the speed
of the virtual clock.

    python -m router.lab.sim.cost serve  [--engines 8] [--streams 32] [--seconds 20] [--preset NAME]
    python -m router.lab.sim.cost vclock [--requests 10000] [--engines 8] [--rate 100]

`serve` starts `lane-router sim --ports …` as a child process, keeps `streams` streaming requests
open against every engine (a new one starts whenever one ends), and reads the child's CPU time
from /proc over the measurement window. The load generator reads raw bytes and only counts SSE
events, so the client's own cost stays small and out of the number.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import signal
import sys
import time
from dataclasses import dataclass

import httpx

from router.lab.procs import free_ports

_BODY = b'{"model":"%s","prompt":"%s","max_tokens":%d,"ignore_eos":true,"stream":true}'


@dataclass(frozen=True, slots=True)
class ServeCost:
    engines: int
    streams: int
    seconds: float
    sim_cpu_cores: float
    client_cpu_cores: float
    tokens_per_second: float
    pace: float  # modelled engine-busy seconds per wall second, per engine (1.0 = on pace)


def _cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks  # utime + stime


async def _stream_forever(port: int, body: bytes, counter: list[int]) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    head = (
        b"POST /v1/completions HTTP/1.1\r\nhost: sim\r\ncontent-type: application/json\r\n"
        b"content-length: %d\r\n\r\n" % len(body)
    )
    marker, end = b'data: {"id"', b"data: [DONE]\n\n\r\n0\r\n\r\n"
    try:
        while True:
            writer.write(head + body)
            tail = b""
            while True:
                data = await reader.read(65536)
                if not data:
                    return
                # Events may be split across reads: search with the previous read's tail.
                window = tail + data
                counter[0] += window.count(marker) - tail.count(marker)
                if window.endswith(end):
                    break
                tail = window[-len(end) :]
    finally:
        writer.close()


async def _busy_seconds(ports: list[int]) -> float:
    total = 0.0
    async with httpx.AsyncClient() as client:
        for port in ports:
            text = (await client.get(f"http://127.0.0.1:{port}/metrics")).text
            for line in text.splitlines():
                if line.startswith("sim_engine_busy_seconds_total "):
                    total += float(line.split()[1])
    return total


async def _wait_healthy(ports: list[int], timeout: float = 30.0) -> None:
    async with httpx.AsyncClient() as client, asyncio.timeout(timeout):
        for port in ports:
            while True:
                with contextlib.suppress(httpx.HTTPError):
                    if (await client.get(f"http://127.0.0.1:{port}/health")).status_code == 200:
                        break
                await asyncio.sleep(0.1)


async def measure_serve(
    engines: int, streams: int, seconds: float, preset: str, max_tokens: int, warmup: float = 3.0
) -> ServeCost:
    ports = free_ports(engines)
    cmd = [
        sys.executable,
        "-m",
        "router",
        "sim",
        "--ports",
        ",".join(map(str, ports)),
        "--preset",
        preset,
        "--served-model-name",
        "cost",
    ]
    child = await asyncio.create_subprocess_exec(*cmd, stdout=asyncio.subprocess.DEVNULL)
    tasks: list[asyncio.Task[None]] = []
    try:
        await _wait_healthy(ports)
        prompt = ("costing " * 128).encode()
        body = _BODY % (b"cost", prompt, max_tokens)
        counter = [0]
        tasks = [
            asyncio.create_task(_stream_forever(p, body, counter)) for p in ports for _ in range(streams)
        ]
        await asyncio.sleep(warmup)
        b0 = time.monotonic()
        busy0 = await _busy_seconds(ports)
        b0 = (b0 + time.monotonic()) / 2  # the snapshot's mid-time
        cpu0, client0, tokens0 = _cpu_seconds(child.pid), time.process_time(), counter[0]
        t0 = time.monotonic()
        await asyncio.sleep(seconds)
        wall = time.monotonic() - t0
        cpu1, client1, tokens1 = _cpu_seconds(child.pid), time.process_time(), counter[0]
        b1 = time.monotonic()
        busy = await _busy_seconds(ports) - busy0
        busy_wall = (b1 + time.monotonic()) / 2 - b0
        return ServeCost(
            engines=engines,
            streams=streams,
            seconds=wall,
            sim_cpu_cores=(cpu1 - cpu0) / wall,
            client_cpu_cores=(client1 - client0) / wall,
            tokens_per_second=(tokens1 - tokens0) / wall,
            pace=busy / busy_wall / engines,
        )
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        child.send_signal(signal.SIGINT)
        try:
            await asyncio.wait_for(child.wait(), 15)
        except TimeoutError:
            child.kill()
            await child.wait()


def measure_vclock(
    requests: int, engines: int, rate: float, preset: str, seed: int = 1
) -> tuple[float, float, int]:
    """CPU seconds to simulate `requests` mixed requests on `engines` engines, the simulated
    duration, and the tokens generated. Placement uses the router's own least-outstanding
    balancer."""
    from router.balance.least_outstanding import LeastOutstanding
    from router.lab.sim.timing import load_preset
    from router.lab.sim.vclock import TraceRequest, VirtualBackend, simulate

    p = load_preset(preset)
    backends = [
        VirtualBackend(
            name=f"http://sim-{i}",
            pool="pool",
            config=p.engine,
            timing=p.timing,
            served_model_names=(p.model,),
        )
        for i in range(engines)
    ]
    rng = random.Random(seed)
    docs = ["".join(rng.choice("abcdefgh ") for _ in range(8000)) for _ in range(20)]
    trace = []
    t = 0.0
    for i in range(requests):
        t += rng.expovariate(rate)
        r = rng.random()
        if r < 0.5:  # chat
            text, out = f"q{i} " + "x" * rng.randint(100, 2000), rng.randint(50, 400)
        elif r < 0.8:  # RAG over a few shared documents
            text, out = rng.choice(docs) + f" question {i}", 64
        else:  # long context / batch
            text, out = f"s{i} " + "y" * rng.randint(4000, 20000), 600
        body = {
            "model": p.model,
            "messages": [{"role": "user", "content": text}],
            "max_tokens": out,
            "ignore_eos": True,
        }
        trace.append(TraceRequest(f"r-{i}", t, body))
    balancer = LeastOutstanding()
    start = time.process_time()
    result = simulate(backends, trace, lambda states, req: balancer.pick(states, None).index)
    cpu = time.process_time() - start
    return cpu, result.end_time, sum(b.generated_tokens for b in result.backends)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m router.lab.sim.cost",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="what", required=True)
    s = sub.add_parser("serve")
    s.add_argument("--engines", type=int, default=8)
    s.add_argument("--streams", type=int, default=32)
    s.add_argument("--seconds", type=float, default=20.0)
    s.add_argument("--preset", default="h100-llama3-8b")
    s.add_argument("--max-tokens", type=int, default=1000)
    v = sub.add_parser("vclock")
    v.add_argument("--requests", type=int, default=10000)
    v.add_argument("--engines", type=int, default=8)
    v.add_argument("--rate", type=float, default=100.0, help="arrivals per second")
    v.add_argument("--preset", default="h100-llama3-8b")
    args = parser.parse_args(argv)
    if args.what == "serve":
        cost = asyncio.run(
            measure_serve(args.engines, args.streams, args.seconds, args.preset, args.max_tokens)
        )
        print(
            f"{cost.engines} engines x {cost.streams} streams, preset {args.preset}, "
            f"{cost.seconds:.1f} s: simulator {cost.sim_cpu_cores:.2f} cores, "
            f"load generator {cost.client_cpu_cores:.2f} cores, "
            f"{cost.tokens_per_second:,.0f} streamed chunks/s, "
            f"pace {cost.pace:.2f} (modelled busy s per wall s per engine; 1.00 = on pace)"
        )
    else:
        cpu, simulated, tokens = measure_vclock(args.requests, args.engines, args.rate, args.preset)
        print(
            f"{args.requests} requests on {args.engines} engines ({args.preset}, {args.rate}/s): "
            f"{cpu:.1f} CPU s for {simulated:.1f} simulated s, {tokens:,} tokens generated"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
