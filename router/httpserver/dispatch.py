"""Calling the app for one request, and what the server does with each way the call can end."""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Final

from router.httpserver.exchange import RESPONSE_DONE, RESPONSE_NEW

if TYPE_CHECKING:
    from router.httpserver.context import ServerContext
    from router.httpserver.exchange import Exchange

log: Final = logging.getLogger("lane_router.http")
access_log: Final = logging.getLogger("lane_router.access")


async def run_app(ctx: ServerContext, ex: Exchange) -> None:
    ctx.running.add(ex)
    try:
        await ctx.app(ex.scope, ex.receive, ex.send)
    except asyncio.CancelledError:
        if ctx.cutting:
            ex.cut(ctx.config.shutdown_event)  # stopped at the shutdown deadline: expected
        else:
            ex.drop()
    except ctx.config.quiet_errors:
        ex.drop()  # the app has said why
    except Exception:
        log.exception("unhandled error in the app on %s %s", ex.scope["method"], ex.scope["path"])
        ex.fail()
    else:
        if ex.state != RESPONSE_DONE and not ex.is_gone:
            what = "starting" if ex.state == RESPONSE_NEW else "ending"
            log.error(
                "the app returned without %s its response to %s %s",
                what,
                ex.scope["method"],
                ex.scope["path"],
            )
            ex.fail()
    finally:
        ex.release()
        ctx.finished(ex)
        if ctx.config.access_log:
            _access(ex)


def _access(ex: Exchange) -> None:
    client = ex.scope["client"]
    access_log.info(
        '%s - "%s %s HTTP/%s" %d',
        f"{client[0]}:{client[1]}" if client else "-",
        ex.scope["method"],
        ex.scope["path"],
        ex.scope["http_version"],
        ex.status,
    )
