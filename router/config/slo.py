"""Each request class's default SLO: the lab's classes' bounds (config/workloads/mixed-six.yaml,
sized for a GPU-class pool), so a lane that states none is still measured against one."""

from __future__ import annotations

from typing import Final

from router.config.models import LaneConfig, RequestClass, SloConfig
from router.observe.slo import UNBOUNDED, Slo

CLASS_SLO: Final[dict[RequestClass, SloConfig]] = {
    RequestClass.CHAT: SloConfig(ttft_ms=1000, itl_ms=60),
    RequestClass.RAG: SloConfig(ttft_ms=1500, itl_ms=60),
    RequestClass.LONG_CONTEXT: SloConfig(ttft_ms=8000, itl_ms=100),
    RequestClass.AGENT: SloConfig(e2e_ms=3000),
    RequestClass.BATCH: SloConfig(e2e_ms=120_000),
    RequestClass.SLOW_STREAM: SloConfig(ttft_ms=1000),
}


def lane_slo(cls: RequestClass, lane: LaneConfig) -> Slo | None:
    """The SLO a lane's requests are judged by (router/observe/slo.py): its own, else its
    class's; None when it sets none (`slo: null`, or a block without a bound)."""
    slo = lane.slo if "slo" in lane.model_fields_set else CLASS_SLO[cls]
    if slo is None or (slo.ttft_ms is None and slo.itl_ms is None and slo.e2e_ms is None):
        return None
    return Slo(_seconds(slo.ttft_ms), _seconds(slo.itl_ms), _seconds(slo.e2e_ms))


def _seconds(ms: float | None) -> float:
    return UNBOUNDED if ms is None else ms / 1000.0
