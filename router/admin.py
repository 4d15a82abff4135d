"""The admin API: what each lane and backend is doing, and reload on demand (admin scope).

A pool lists its backends in rotation, those joining it (found by discovery, awaiting their
first healthy probe) and those draining (gone from it, finishing their requests); a discovery
pool also shows what its name last answered."""

from __future__ import annotations

from typing import Any

from router.asgi import Message, Receive, Send, send_json
from router.errors import RouterError
from router.proxy.intake import Headers
from router.runtime import Backend, Pool, Runtime
from router.state import RouterState


class ReloadRefused(RouterError):
    status = 422
    type = "invalid_request_error"
    code = "invalid_config"


def lanes_report(runtime: Runtime) -> dict[str, Any]:
    return {
        "profile": runtime.config.profile,
        "ready": runtime.ready(),
        "lanes": {
            lane.name: {
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
        "backends": [_backend_report(b) for b in pool.backends],
        "joining": [_backend_report(b) for b in pool.joining],
        "draining": [_backend_report(b) for b in pool.draining],
    }
    if pool.config.discovery is not None:
        report["discovery"] = _discovery_report(pool)
    return report


def _backend_report(b: Backend) -> dict[str, Any]:
    return {
        "index": b.index,
        "url": b.name,
        "health": b.health.value,
        "in_flight": b.in_flight,
        "prefilling": b.prefilling,
        "drift": list(b.drift),
    }


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
    await send_json(send, 200, lanes_report(state.runtime))


async def reload(state: RouterState, scope: Message, receive: Receive, send: Send) -> None:
    _admin(state, scope)
    outcome = await state.reload("admin request")
    if not outcome.ok:
        err = ReloadRefused(outcome.reason)
        payload: dict[str, Any] = err.envelope()
        payload["issues"] = [{"path": i.path, "message": i.message} for i in outcome.issues]
        payload["profile"] = outcome.profile
        await send_json(send, err.status, payload)
        return
    await send_json(send, 200, {"result": "reloaded", "profile": outcome.profile})
