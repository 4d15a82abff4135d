"""A simulated vLLM engine core: requests in, steps out. Pure and clock-agnostic.

`step(now)` schedules one batch, applies it as if it had run, and returns what happened and how
long the step took per the timing model; tokens it produced exist at `now + duration`. The
real-time server sleeps that long before handing the tokens to clients; the virtual clock puts
the step's end on an event heap.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from router.errors import Unavailable
from router.lab.sim.config import EngineConfig
from router.lab.sim.engine_metrics import EngineMetrics
from router.lab.sim.kv import KVCacheManager
from router.lab.sim.kv_events import KVEventLog
from router.lab.sim.request import EngineRequest, Status
from router.lab.sim.scheduler import Scheduler
from router.lab.sim.timing import StepTimeModel
from router.lab.sim.token_ids import FILLER_IDS, FILLER_STRIDE

_LAYOUT_SAMPLE = 64


@dataclass(slots=True)
class StepResult:
    start: float
    duration: float
    prefill_tokens: int
    decode_seqs: int
    attended_tokens: int
    outputs: list[EngineRequest] = field(default_factory=list)  # each got one new token
    finished: list[EngineRequest] = field(default_factory=list)
    preempted: list[EngineRequest] = field(default_factory=list)

    @property
    def end(self) -> float:
        return self.start + self.duration


class Engine:
    def __init__(self, config: EngineConfig, timing: StepTimeModel, *, kv_events: bool = False) -> None:
        self.config = config
        self.timing = timing
        # What the block manager cached and evicted since the server last published it.
        self.kv_events: KVEventLog | None = KVEventLog() if kv_events else None
        self.kv = KVCacheManager(
            config.num_gpu_blocks,
            config.block_size,
            layout=config.kv_layout,
            enable_prefix_caching=config.enable_prefix_caching,
            events=self.kv_events,
        )
        self.scheduler = Scheduler(config, self.kv)
        self.metrics = EngineMetrics()
        self.requests: dict[str, EngineRequest] = {}
        self._arrived: list[EngineRequest] = []
        self.steps = 0
        self.busy_time = 0.0
        # Layout statistic sampled every `_LAYOUT_SAMPLE` steps: live sequences, their blocks
        # and their compact spans, summed over samples.
        self.layout_samples = [0, 0, 0]

    # ---- state -------------------------------------------------------------------------------
    @property
    def num_running(self) -> int:
        return len(self.scheduler.running)

    @property
    def num_waiting(self) -> int:
        return len(self.scheduler.waiting)

    @property
    def has_work(self) -> bool:
        return bool(self.scheduler.running or self.scheduler.waiting)

    @property
    def kv_usage(self) -> float:
        return self.kv.usage

    # ---- requests ----------------------------------------------------------------------------
    def add_request(self, req: EngineRequest, now: float) -> None:
        """Queue a request; Unavailable (503) when `max_num_queued_reqs` are already waiting."""
        limit = self.config.max_num_queued_reqs
        if limit is not None and self.num_waiting >= limit:
            raise Unavailable(f"The engine queue is full ({limit} requests waiting).", code="queue_full")
        if req.request_id in self.requests:
            raise ValueError(f"duplicate request id {req.request_id!r}")
        req.queued_time = now
        self.requests[req.request_id] = req
        self.scheduler.add(req)
        self._arrived.append(req)

    def abort(self, request_id: str, now: float) -> bool:
        """Stop a request and free its blocks (a client went away). False if already done."""
        req = self.requests.pop(request_id, None)
        if req is None:
            return False
        self.scheduler.remove(req)
        req.status = Status.FINISHED
        req.finish_reason = "abort"
        req.finish_time = now
        self.metrics.on_finish(req, now)
        return True

    # ---- one step ----------------------------------------------------------------------------
    def step(self, now: float) -> StepResult | None:
        """Run one step starting at `now`; None when there is nothing to schedule."""
        if self._arrived:
            # vLLM's engine core reads new requests between steps and stamps them queued then:
            # waiting for the step under way is not part of its queue time.
            for req in self._arrived:
                req.queued_time = max(req.queued_time, now)
            self._arrived.clear()
        sched = self.scheduler.schedule()
        if not sched:
            return None
        duration = self.timing.step_time(
            sched.prefill_tokens, sched.decode_seqs, sched.attended_tokens, sched.prefill_pairs
        )
        end = now + duration
        result = StepResult(
            start=now,
            duration=duration,
            prefill_tokens=sched.prefill_tokens,
            decode_seqs=sched.decode_seqs,
            attended_tokens=sched.attended_tokens,
            preempted=sched.preempted,
        )
        metrics = self.metrics
        outputs, finished = result.outputs, result.finished
        filler, n_filler = FILLER_IDS, len(FILLER_IDS)
        itl = metrics.itl
        for req, n in sched.tokens.items():
            if req.scheduled_time is None:
                req.scheduled_time = now
            computed = req.num_computed_tokens + n
            req.num_computed_tokens = computed
            if computed != len(req.token_ids):
                continue
            # The step produced this request's next token.
            pos = req.num_output_tokens
            req.token_ids.append(filler[(req.seed + pos * FILLER_STRIDE) % n_filler])
            req.num_output_tokens = pos + 1
            last = req.last_token_time
            if last is None:
                metrics.on_token(req, end)
            else:
                itl.observe(end - last)
                req.last_token_time = end
            outputs.append(req)
            if pos + 1 >= req.output_len:
                req.finish_reason = req.stop_reason
                finished.append(req)
        metrics.prompt_tokens += sched.prefill_tokens
        metrics.generation_tokens += len(outputs)
        metrics.iteration.observe(sched.prefill_tokens + sched.decode_seqs)
        if finished:
            self._finish(finished, end)
        self.steps += 1
        self.busy_time += duration
        if self.steps % _LAYOUT_SAMPLE == 0:
            stats = self.kv.layout_stats()
            sample = self.layout_samples
            sample[0] += stats.sequences
            sample[1] += stats.blocks
            sample[2] += stats.spans
        return result

    @property
    def blocks_per_sequence(self) -> float:
        seqs, blocks, _ = self.layout_samples
        return blocks / seqs if seqs else 0.0

    @property
    def spans_per_sequence(self) -> float:
        seqs, _, spans = self.layout_samples
        return spans / seqs if seqs else 0.0

    def _finish(self, done: list[EngineRequest], t: float) -> None:
        gone = set(done)
        sched = self.scheduler
        sched.running = [r for r in sched.running if r not in gone]
        for req in done:
            self.kv.free(req.request_id)
            del self.requests[req.request_id]
            req.status = Status.FINISHED
            req.finish_time = t
            self.metrics.on_finish(req, t)

    # ---- metrics -----------------------------------------------------------------------------
    def render_metrics(self, model_name: str) -> str:
        cfg = self.config
        sched = self.scheduler
        text = self.metrics.render(
            {"model_name": model_name, "engine": "0"},
            gauges={
                "num_requests_running": ("Number of requests in model execution batches.", self.num_running),
                "num_requests_waiting": ("Number of requests waiting to be processed.", self.num_waiting),
                "kv_cache_usage_perc": ("KV-cache usage. 1 means 100 percent usage.", self.kv_usage),
            },
            counters={
                "num_preemptions": ("Cumulative number of preemption from the engine.", sched.preemptions),
                "prefix_cache_queries": (
                    "Prefix cache queries, in terms of number of queried tokens.",
                    sched.prefix_queries,
                ),
                "prefix_cache_hits": (
                    "Prefix cache hits, in terms of number of cached tokens.",
                    sched.prefix_hits,
                ),
            },
            info={
                "cache_config_info": {
                    "block_size": str(cfg.block_size),
                    "num_gpu_blocks": str(cfg.num_gpu_blocks),
                    "enable_prefix_caching": str(cfg.enable_prefix_caching),
                },
            },
        )
        # The simulator's own counters (not vLLM's): modelled busy time, to check that the
        # process keeps the model's pace (busy seconds ≈ wall seconds under full load).
        return text + (
            "# HELP sim_engine_busy_seconds_total Modelled duration of all engine steps.\n"
            "# TYPE sim_engine_busy_seconds counter\n"
            f"sim_engine_busy_seconds_total {self.busy_time}\n"
            "# HELP sim_engine_steps_total Engine steps run.\n"
            "# TYPE sim_engine_steps counter\n"
            f"sim_engine_steps_total {float(self.steps)}\n"
            "# HELP sim_kv_blocks_per_sequence KV blocks per live sequence (sampled mean).\n"
            "# TYPE sim_kv_blocks_per_sequence gauge\n"
            f"sim_kv_blocks_per_sequence {self.blocks_per_sequence}\n"
            "# HELP sim_kv_spans_per_sequence Compact spans per live sequence (sampled mean).\n"
            "# TYPE sim_kv_spans_per_sequence gauge\n"
            f"sim_kv_spans_per_sequence {self.spans_per_sequence}\n"
        )
