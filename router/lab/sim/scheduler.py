"""The scheduler of one engine step, after vLLM's continuous-batching scheduler.

Each step gets a budget of `max_num_batched_tokens`:

1. running requests that are decoding get one token each (at most `max_num_seqs` run at once);
2. running requests still in prefill get their next chunk, capped per request by
   `long_prefill_token_threshold`;
3. waiting requests are admitted in policy order (fcfs, or priority then arrival) while the
   budget, the sequence limit and free KV blocks allow. Their cached prefix (full blocks whose
   chained hash is already in the cache) is skipped; at least the last prompt token is computed.

With partial-prefill limits (vLLM < 0.27), at most `max_num_partial_prefills` requests prefill in
one step, of which at most `max_long_partial_prefills` are long (prompt above the threshold);
a long request over its limit is skipped so a short one behind it can still start.

When a running request needs a KV block and none is free, the lowest-priority running request
(the last admitted under fcfs) is preempted: its blocks are freed and it goes back to the front
of the waiting queue to be recomputed later (recompute, as vLLM V1 does).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

from router.lab.sim.config import EngineConfig
from router.lab.sim.kv import KVCacheManager, chain_hashes, salted_root
from router.lab.sim.request import EngineRequest, Status
from router.lab.sim.timing import prefill_pairs

_SCAN_LIMIT = 64  # waiting requests looked at per step when some are skipped


@dataclass(slots=True)
class Schedule:
    """What one step computes: tokens per request, in scheduling order."""

    budget: int = 0
    tokens: dict[EngineRequest, int] = field(default_factory=dict)
    prefill_tokens: int = 0
    decode_seqs: int = 0
    attended_tokens: int = 0
    prefill_pairs: int = 0  # causal attention pairs of the prefill chunks
    preempted: list[EngineRequest] = field(default_factory=list)
    admitted: list[EngineRequest] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.tokens)


@dataclass(slots=True)
class _PartialCounts:
    total: int = 0
    long: int = 0


class Scheduler:
    def __init__(self, config: EngineConfig, kv: KVCacheManager) -> None:
        self.config = config
        self.kv = kv
        self.waiting: list[EngineRequest] = []
        self.running: list[EngineRequest] = []
        self._threshold = config.effective_long_prefill_threshold
        self._order = 0
        self.prefix_queries = 0
        self.prefix_hits = 0
        self.preemptions = 0

    # ---- queues ------------------------------------------------------------------------------
    def add(self, req: EngineRequest) -> None:
        self._order += 1
        req.order = self._order
        req.status = Status.WAITING
        self._enqueue(req, front=False)

    def _enqueue(self, req: EngineRequest, *, front: bool) -> None:
        if self.config.scheduling_policy == "priority":
            keys = [r.sort_key("priority") for r in self.waiting]
            self.waiting.insert(bisect.bisect_left(keys, req.sort_key("priority")), req)
        elif front:
            self.waiting.insert(0, req)
        else:
            self.waiting.append(req)

    def remove(self, req: EngineRequest) -> None:
        """Take a request out of the engine (finished or aborted) and free its blocks."""
        if req in self.running:
            self.running.remove(req)
        elif req in self.waiting:
            self.waiting.remove(req)
        if req.request_id in self.kv:
            self.kv.free(req.request_id)

    # ---- one step ----------------------------------------------------------------------------
    def schedule(self) -> Schedule:
        out = Schedule(budget=self.config.max_num_batched_tokens)
        prefilling = self._schedule_decodes(out)
        partial = _PartialCounts()
        for req in prefilling:
            if out.budget <= 0:
                break
            if req.status != Status.RUNNING:
                continue
            remaining = req.num_tokens - req.num_computed_tokens
            n = self._prefill_chunk(req, remaining, out.budget, partial)
            if n and self._grow(req, n, out):
                out.prefill_tokens += n
                out.attended_tokens += req.num_computed_tokens + n
                out.prefill_pairs += prefill_pairs(req.num_computed_tokens, n)
                self._count_partial(req, partial)
        if out.preempted:
            # As in vLLM, a step that had to preempt admits nobody new. Victims may have been
            # counted already: recount.
            self._recount(out)
        else:
            self._admit(partial, out)
        return out

    def _schedule_decodes(self, out: Schedule) -> list[EngineRequest]:
        """One token for each decoding request, in running order, on the per-token fast path
        (the slow path may preempt). Returns the running requests still in prefill."""
        append_one = self.kv.append_one
        tokens = out.tokens
        prefilling: list[EngineRequest] = []
        attended = decodes = 0
        for req in tuple(self.running):  # a copy: preemption removes from the list
            computed = req.num_computed_tokens
            if not req.num_output_tokens or computed != len(req.token_ids) - 1:
                prefilling.append(req)
                continue
            if out.budget <= 0 or req.status != Status.RUNNING:
                continue
            if append_one(req.request_id, req.token_ids[-1]):
                tokens[req] = 1
                out.budget -= 1
            elif not self._grow(req, 1, out):
                continue
            attended += computed + 1
            decodes += 1
        out.attended_tokens += attended
        out.decode_seqs += decodes
        return prefilling

    def _recount(self, out: Schedule) -> None:
        out.attended_tokens = out.decode_seqs = out.prefill_tokens = out.prefill_pairs = 0
        for req, n in out.tokens.items():
            out.attended_tokens += req.num_computed_tokens + n
            if n == 1 and req.num_output_tokens and req.num_computed_tokens == len(req.token_ids) - 1:
                out.decode_seqs += 1
            else:
                out.prefill_tokens += n
                out.prefill_pairs += prefill_pairs(req.num_computed_tokens, n)

    def _prefill_chunk(self, req: EngineRequest, remaining: int, budget: int, partial: _PartialCounts) -> int:
        """Tokens of a prefill this step may compute (0: not this step)."""
        cfg = self.config
        n = min(remaining, budget)
        if self._threshold and n > self._threshold:
            n = self._threshold
        if not cfg.enable_chunked_prefill and n < remaining:
            return 0
        if cfg.partial_prefill_limits:
            assert cfg.max_num_partial_prefills is not None
            if partial.total >= cfg.max_num_partial_prefills:
                return 0
            long_limit = cfg.max_long_partial_prefills or cfg.max_num_partial_prefills
            if self._is_long(req) and partial.long >= long_limit:
                return 0
        return n

    def _is_long(self, req: EngineRequest) -> bool:
        return bool(self._threshold) and req.num_prompt_tokens > self._threshold

    def _count_partial(self, req: EngineRequest, partial: _PartialCounts) -> None:
        partial.total += 1
        if self._is_long(req):
            partial.long += 1

    def _grow(self, req: EngineRequest, n: int, out: Schedule) -> bool:
        """Reserve KV slots for `n` more tokens of a running request, preempting others (or the
        request itself) when blocks run out. False when the request itself was preempted."""
        start = req.num_computed_tokens
        new_tokens = req.token_ids[start : start + n]
        while not self.kv.append(req.request_id, new_tokens):
            victim = self._victim()
            self._preempt(victim, out)
            if victim is req:
                return False
        out.tokens[req] = n
        out.budget -= n
        return True

    def _victim(self) -> EngineRequest:
        if self.config.scheduling_policy == "priority":
            return max(self.running, key=lambda r: r.sort_key("priority"))
        return self.running[-1]

    def _preempt(self, req: EngineRequest, out: Schedule) -> None:
        self.running.remove(req)
        self.kv.free(req.request_id)
        out.budget += out.tokens.pop(req, 0)
        req.status = Status.WAITING
        req.num_computed_tokens = 0
        req.num_preemptions += 1
        self.preemptions += 1
        out.preempted.append(req)
        self._enqueue(req, front=True)

    def _admit(self, partial: _PartialCounts, out: Schedule) -> None:
        cfg, kv = self.config, self.kv
        i = 0
        scanned = 0
        while i < len(self.waiting) and out.budget > 0 and len(self.running) < cfg.max_num_seqs:
            scanned += 1
            if scanned > _SCAN_LIMIT:
                break
            req = self.waiting[i]
            hashes = self._hashes(req)
            prefix = kv.match_prefix(hashes[: (req.num_tokens - 1) // kv.block_size])
            hit = len(prefix) * kv.block_size
            n = self._prefill_chunk(req, req.num_tokens - hit, out.budget, partial)
            if n == 0:
                if self._skippable(req, partial):
                    i += 1
                    continue
                break
            hint = req.num_prompt_tokens + req.max_tokens
            got = kv.allocate(
                req.request_id, req.token_ids[: hit + n], prefix=prefix, hint_tokens=hint, salt=req.cache_salt
            )
            if got is None:
                break  # admission waits for free blocks
            del self.waiting[i]
            self.prefix_queries += req.num_tokens
            self.prefix_hits += hit
            if req.num_preemptions == 0:
                req.num_cached_tokens = hit
            req.num_computed_tokens = hit
            req.status = Status.RUNNING
            self.running.append(req)
            out.tokens[req] = n
            out.admitted.append(req)
            out.budget -= n
            out.prefill_tokens += n
            out.attended_tokens += hit + n
            out.prefill_pairs += prefill_pairs(hit, n)
            self._count_partial(req, partial)

    def _skippable(self, req: EngineRequest, partial: _PartialCounts) -> bool:
        """A long prompt blocked only by the long-prefill limit lets shorter ones pass."""
        cfg = self.config
        if not cfg.partial_prefill_limits or not self._is_long(req):
            return False
        assert cfg.max_num_partial_prefills is not None
        return partial.total < cfg.max_num_partial_prefills

    def _hashes(self, req: EngineRequest) -> list[int]:
        bs = self.kv.block_size
        have = len(req.block_hashes)
        if have < req.num_tokens // bs:
            parent = req.block_hashes[-1] if have else salted_root(req.cache_salt)
            req.block_hashes.extend(chain_hashes(req.token_ids[have * bs :], bs, parent))
        return req.block_hashes
