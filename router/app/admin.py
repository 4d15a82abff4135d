"""The admin API: what each lane and backend is doing, and reload on demand (admin scope).

A pool lists its backends in rotation, those joining it (found by discovery, awaiting their
first healthy probe) and those draining (gone from it, finishing their requests); a discovery
pool also shows what its name last answered. Under a supervisor the report is the answering
worker's, and says which worker that is.

A reload re-reads the profile and the listener's TLS files, as SIGHUP does, in every process
serving the port, and is answered once every one of them has said what it did."""

from __future__ import annotations

from typing import Any

from router.app.asgi import Message, Receive, Send, send_json
from router.config.checks import ConfigIssue
from router.errors import RouterError
from router.fleet.backend import Backend
from router.fleet.pool import Pool
from router.proxy.intake import Headers
from router.state.live import TLS_NONE, ReloadReport, RouterState
from router.state.runtime import Runtime


class ReloadRefused(RouterError):
    status = 422
    type = "invalid_request_error"
    code = "invalid_config"


class ReloadUnconfirmed(RouterError):
    """A worker did not say what it did: it may serve the old files or the new."""

    status = 503
    type = "service_unavailable"
    code = "reload_unconfirmed"


def lanes_report(runtime: Runtime) -> dict[str, Any]:
    return {
        "profile": runtime.config.profile,
        "ready": runtime.ready(),
        "lanes": {
            lane.name: {
                "model": lane.model,
                "class": lane.cls.value,
                "pool": lane.pool.name,
                "balance": lane.config.balance.strategy,
                "priority": lane.config.priority,
                "max_in_flight": lane.config.max_in_flight,
                "in_flight": lane.in_flight,
                "decouple": lane.config.decouple,
            }
            for lane in runtime.lanes.values()
        },
        "pools": {name: _pool_report(pool) for name, pool in runtime.pools.items()},
    }


def _pool_report(pool: Pool) -> dict[str, Any]:
    report: dict[str, Any] = {
        "model": pool.config.model,
        "server_configuration_hash": pool.config_hash,
        "vllm_version": pool.config.vllm.version,
        "max_model_len": pool.config.vllm.max_model_len,
        "backends": [_backend_report(pool, b) for b in pool.backends],
        "joining": [_backend_report(pool, b) for b in pool.joining],
        "draining": [_backend_report(pool, b) for b in pool.draining],
    }
    if pool.config.discovery is not None:
        report["discovery"] = _discovery_report(pool)
    return report


def _backend_report(pool: Pool, b: Backend) -> dict[str, Any]:
    report: dict[str, Any] = {
        "index": b.index,
        "url": b.name,
        "health": b.health.value,
        "in_flight": b.in_flight,
        "prefilling": b.prefilling,
        "drift": list(b.drift),
        # The LoRA adapters its last /v1/models listed, and those the router is loading there.
        "adapters": [name for name, _ in b.adapters],
        "loading_adapters": sorted(b.loading),
    }
    stream = pool.kv.streams.get(b.name)
    if stream is not None:  # its engine's KV events are followed (router/fleet/kvfollow.py)
        report["kv_events"] = {"connected": stream.all_connected, "blocks": len(stream.index)}
    return report


def _discovery_report(pool: Pool) -> dict[str, Any]:
    cfg = pool.config.discovery
    assert cfg is not None
    status = pool.discovery
    outage = status.outage
    return {
        "dns": cfg.dns,
        "port": cfg.port,
        "interval_s": cfg.interval_s,
        "max_backends": cfg.max_backends,
        "nameservers": list(cfg.nameservers),
        "resolved_at": status.resolved_at,
        "addresses": status.addresses,
        "truncated": status.truncated,
        "outage": None
        if outage is None
        else {"reason": outage.reason, "since": outage.since, "failures": outage.failures},
    }


def _admin(state: RouterState, scope: Message) -> None:
    state.runtime.keys.authenticate(Headers(scope["headers"]).authorization).allow_admin()


async def lanes(state: RouterState, scope: Message, receive: Receive, send: Send) -> None:
    _admin(state, scope)
    report = lanes_report(state.runtime)
    if state.worker is not None:
        report["worker"] = state.worker
    await send_json(send, 200, report)


async def reload(state: RouterState, scope: Message, receive: Receive, send: Send) -> None:
    _admin(state, scope)
    reports = await state.reload_everywhere("admin request")
    status, payload = reload_answer(reports, state.worker)
    await send_json(send, status, payload)


def reload_answer(reports: list[ReloadReport], worker: int | None) -> tuple[int, dict[str, Any]]:
    """The answer to a reload from every process's report (`worker`: the one answering, whose
    profile the answer names). 200 when all reloaded; 422 when one refused a file, with that
    refusal's reason and issues; 503 when one did not say."""
    own = next((r for r in reports if r.worker == worker), reports[0])
    payload: dict[str, Any] = {"result": "reloaded", "profile": own.outcome.profile}
    status = 200
    err = _reload_error(reports)
    if err is not None:
        error, issues = err
        status = error.status
        payload = {**error.envelope()}
        payload["issues"] = [{"path": i.path, "message": i.message} for i in issues]
        payload["profile"] = own.outcome.profile
    if own.tls != TLS_NONE:
        payload["tls"] = own.tls
    if worker is not None:
        payload["workers"] = [r.to_json() for r in reports]
    return status, payload


def _reload_error(reports: list[ReloadReport]) -> tuple[RouterError, tuple[ConfigIssue, ...]] | None:
    for r in reports:
        if r.answered and not r.ok:
            return ReloadRefused(r.reason), r.outcome.issues
    for r in reports:
        if not r.answered:
            return ReloadUnconfirmed(r.reason), ()
    return None
