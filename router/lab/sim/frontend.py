"""vLLM's API server as the engine's clients meet it: one event loop, one job at a time.

The loop admits requests (parse, validate, tokenize, hand to the engine core) and turns every
output token the engine core sends back into a stream event for its client. Both kinds of work
queue for the same single thread in arrival order, so many streams decoding slow the admission
of a new request, and a burst of arrivals holds back the tokens of running streams. Pure: the
caller passes the time and gets back when the job is done.
"""

from __future__ import annotations

from router.lab.sim.timing import StepTimeModel


class Frontend:
    """A single FIFO server; each job starts when it arrives or when the previous one ends."""

    __slots__ = ("busy_time", "free_at", "timing")

    def __init__(self, timing: StepTimeModel) -> None:
        self.timing = timing
        self.free_at = float("-inf")
        self.busy_time = 0.0

    def admit(self, now: float, prompt_tokens: int) -> float:
        """When a request arriving at `now` reaches the engine core."""
        return self._run(now, self.timing.admission_cost(prompt_tokens)) + self.timing.frontend_s

    def emit(self, now: float, tokens: int) -> float:
        """When the `tokens` output tokens of a step that ended at `now` reach their clients."""
        return self._run(now, self.timing.output_cost(tokens))

    def _run(self, now: float, cost: float) -> float:
        done = max(now, self.free_at) + cost
        self.free_at = done
        self.busy_time += cost
        return done
