"""The engine's Prometheus metrics, under vLLM's names, rendered in the text exposition format.

Kept dependency-free and cheap on purpose: a histogram observation is one bisect and two adds,
because the simulator records one inter-token latency per generated token.
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from router.lab.sim.request import EngineRequest

TTFT_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
    2560.0,
)
ITL_BUCKETS = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
)
LATENCY_BUCKETS = (
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
    960.0,
    1920.0,
    7680.0,
)
TOKEN_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000, 100000)


@dataclass(slots=True)
class Histogram:
    bounds: Sequence[float]
    counts: list[int] = field(default_factory=list)
    total: float = 0.0
    count: int = 0

    def __post_init__(self) -> None:
        self.counts = [0] * (len(self.bounds) + 1)

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.total += value
        self.count += 1


_HISTOGRAMS = {
    "time_to_first_token_seconds": ("Histogram of time to first token in seconds.", TTFT_BUCKETS),
    "inter_token_latency_seconds": ("Histogram of inter-token latency in seconds.", ITL_BUCKETS),
    "e2e_request_latency_seconds": ("Histogram of e2e request latency in seconds.", LATENCY_BUCKETS),
    "request_queue_time_seconds": ("Histogram of time spent in WAITING phase for request.", LATENCY_BUCKETS),
    "request_inference_time_seconds": (
        "Histogram of time spent in RUNNING phase for request.",
        LATENCY_BUCKETS,
    ),
    "request_prefill_time_seconds": (
        "Histogram of time spent in PREFILL phase for request.",
        LATENCY_BUCKETS,
    ),
    "request_decode_time_seconds": ("Histogram of time spent in DECODE phase for request.", LATENCY_BUCKETS),
    "request_prompt_tokens": ("Number of prefill tokens processed.", TOKEN_BUCKETS),
    "request_generation_tokens": ("Number of generation tokens processed.", TOKEN_BUCKETS),
    "iteration_tokens_total": ("Histogram of number of tokens per engine_step.", TOKEN_BUCKETS),
}


class EngineMetrics:
    """Counters and histograms of one engine; gauges are read from the engine at render time."""

    def __init__(self) -> None:
        self.hist = {name: Histogram(bounds) for name, (_, bounds) in _HISTOGRAMS.items()}
        self.ttft = self.hist["time_to_first_token_seconds"]
        self.itl = self.hist["inter_token_latency_seconds"]
        self.iteration = self.hist["iteration_tokens_total"]
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.success: dict[str, int] = {"stop": 0, "length": 0, "abort": 0}

    def on_token(self, req: EngineRequest, t: float) -> None:
        if req.first_token_time is None:
            req.first_token_time = t
            self.ttft.observe(t - req.arrival_time)
        else:
            assert req.last_token_time is not None
            self.itl.observe(t - req.last_token_time)
        req.last_token_time = t

    def on_finish(self, req: EngineRequest, t: float) -> None:
        reason = req.finish_reason or "abort"
        self.success[reason] = self.success.get(reason, 0) + 1
        h = self.hist
        h["e2e_request_latency_seconds"].observe(t - req.arrival_time)
        h["request_prompt_tokens"].observe(req.num_prompt_tokens)
        h["request_generation_tokens"].observe(req.num_output_tokens)
        if req.scheduled_time is not None:
            # Like vLLM, every per-phase time is recorded when the request finishes.
            h["request_queue_time_seconds"].observe(req.scheduled_time - req.queued_time)
            h["request_inference_time_seconds"].observe(t - req.scheduled_time)
            if req.first_token_time is not None:
                h["request_prefill_time_seconds"].observe(req.first_token_time - req.scheduled_time)
                h["request_decode_time_seconds"].observe(t - req.first_token_time)

    def render(
        self,
        labels: Mapping[str, str],
        gauges: Mapping[str, tuple[str, float]],
        counters: Mapping[str, tuple[str, float]],
        info: Mapping[str, Mapping[str, str]] | None = None,
    ) -> str:
        base = _labels(labels)
        lines: list[str] = []
        for name, (help_text, value) in gauges.items():
            lines += [f"# HELP vllm:{name} {help_text}", f"# TYPE vllm:{name} gauge"]
            lines.append(f"vllm:{name}{{{base}}} {float(value)}")
        for name, info_labels in (info or {}).items():
            lines += [f"# HELP vllm:{name} Information of the engine.", f"# TYPE vllm:{name} gauge"]
            lines.append(f"vllm:{name}{{{_labels({**labels, **info_labels})}}} 1.0")
        all_counters = {
            "prompt_tokens": ("Number of prefill tokens processed.", float(self.prompt_tokens)),
            "generation_tokens": ("Number of generation tokens processed.", float(self.generation_tokens)),
            **counters,
        }
        for name, (help_text, value) in all_counters.items():
            lines += [f"# HELP vllm:{name}_total {help_text}", f"# TYPE vllm:{name} counter"]
            lines.append(f"vllm:{name}_total{{{base}}} {float(value)}")
        lines += [
            "# HELP vllm:request_success_total Count of successfully processed requests.",
            "# TYPE vllm:request_success counter",
        ]
        for reason, n in sorted(self.success.items()):
            lines.append(f'vllm:request_success_total{{{base},finished_reason="{reason}"}} {float(n)}')
        for name, (help_text, _) in _HISTOGRAMS.items():
            lines += [f"# HELP vllm:{name} {help_text}", f"# TYPE vllm:{name} histogram"]
            lines += _histogram_lines(f"vllm:{name}", base, self.hist[name])
        return "\n".join(lines) + "\n"


def _labels(labels: Mapping[str, str]) -> str:
    return ",".join(f'{k}="{_escape(v)}"' for k, v in sorted(labels.items()))


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _histogram_lines(name: str, base: str, h: Histogram) -> list[str]:
    out: list[str] = []
    cumulative = 0
    for bound, n in zip(h.bounds, h.counts, strict=False):
        cumulative += n
        out.append(f'{name}_bucket{{{base},le="{float(bound)}"}} {float(cumulative)}')
    out.append(f'{name}_bucket{{{base},le="+Inf"}} {float(h.count)}')
    out.append(f"{name}_count{{{base}}} {float(h.count)}")
    out.append(f"{name}_sum{{{base}}} {h.total}")
    return out
