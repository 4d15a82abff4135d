"""`vllm serve` command lines for the backends of a profile, as they stand in the profile.

One command per backend URL (per pool for a pool found by DNS, to run on every host its name
resolves to): the server listens on that URL's host and port, is started with its
pool's rendered arguments (`router.config.render.pool_serve_args`), reads its upstream key from
the variable the router reads it from, and serves the model that a variable names (defaulting to
the pool's model, so a local copy of the weights can be given without editing the profile).
"""

from __future__ import annotations

import ipaddress
import shlex
import textwrap
from dataclasses import dataclass

from router.config.models import DiscoveryConfig, ProfileConfig
from router.deploy.plan import CPU_ENTRYPOINT, GPU_ENTRYPOINT, Device, PoolPlan, plan_pools, pool_notes


@dataclass(frozen=True, slots=True)
class ServeCommand:
    pool: str
    index: int
    url: str
    argv: tuple[str, ...]
    model_at: int
    model_env: str
    key_env: str | None

    def shell(self) -> str:
        """The command as one shell line; the model and key stay variables, expanded when it runs."""
        words: list[str] = []
        if self.key_env is not None:
            # `:?` stops the shell before a server starts without its key, open to anyone.
            words.append(f'VLLM_API_KEY="${{{self.key_env}:?set {self.key_env}}}"')
        for i, arg in enumerate(self.argv):
            words.append(_model_word(self.model_env, arg) if i == self.model_at else shlex.quote(arg))
        return " ".join(words)


@dataclass(frozen=True, slots=True)
class ServePlan:
    profile: str
    device: Device
    commands: tuple[ServeCommand, ...]
    notes: tuple[str, ...]


def serve_plan(cfg: ProfileConfig, device: Device = "gpu") -> ServePlan:
    plans = plan_pools(cfg, device)
    commands: list[ServeCommand] = []
    notes = pool_notes(plans)
    for p in plans:
        if p.pool.discovery is not None:
            commands.append(_discovered(p, p.pool.discovery, device))
            notes.append(_discovered_note(p, p.pool.discovery))
        for index, url in enumerate(p.pool.backends):
            host, port = url.host or "127.0.0.1", url.port or 80
            bind = _bind_address(host)
            if bind != host:
                notes.append(
                    f"pool {p.name}: {host}:{port} listens on every interface: let only the router "
                    "reach that port (vLLM leaves /invocations, /tokenize and more open without a key)"
                )
            commands.append(_command(p, index, f"http://{host}:{port}", bind, port, device))
        if p.pool.upstream_api_key is not None and p.pool.upstream_api_key_env is None:
            notes.append(
                f"pool {p.name}: the upstream key is written in the profile; export {p.key_env} "
                "with the same value where its servers start"
            )
    return ServePlan(cfg.profile, device, tuple(commands), tuple(notes))


def _discovered(p: PoolPlan, found: DiscoveryConfig, device: Device) -> ServeCommand:
    where = f"http://<each address of {found.dns}>:{found.port}"
    return _command(p, 0, where, "0.0.0.0", found.port, device)


def _discovered_note(p: PoolPlan, found: DiscoveryConfig) -> str:
    # The hosts are whatever the name resolves to when the router looks: the script cannot list them.
    return (
        f"pool {p.name}: found by DNS ({found.dns}): run its command on every host the name resolves to; "
        f"it listens on every interface: let only the router reach port {found.port} (vLLM leaves "
        "/invocations, /tokenize and more open without a key)"
    )


def _command(p: PoolPlan, index: int, url: str, bind: str, port: int, device: Device) -> ServeCommand:
    entry = GPU_ENTRYPOINT if device == "gpu" else CPU_ENTRYPOINT
    argv = (*entry, *p.server_args(p.pool.model, device, bind, port))
    model_at = len(entry) + (0 if device == "gpu" else 1)
    return ServeCommand(
        pool=p.name,
        index=index,
        url=url,
        argv=argv,
        model_at=model_at,
        model_env=p.model_env,
        key_env=p.key_env,
    )


def _bind_address(host: str) -> str:
    """An IP address is bound as is; a host name is this machine's name, so bind every interface."""
    try:
        ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return "0.0.0.0"
    return host.strip("[]")


def _model_word(env: str, default: str) -> str:
    escaped = "".join("\\" + ch if ch in '"$`\\' else ch for ch in default)
    return f'"${{{env}:-{escaped}}}"'


def serve_script(plan: ServePlan) -> str:
    lines = [
        f"# vLLM servers for profile {plan.profile!r} ({plan.device}): one command per backend.",
        "# Set each pool's upstream key variable first; a LANE_ROUTER_MODEL_* variable may name",
        "# a local copy of the model instead of the hub id.",
    ]
    for note in plan.notes:
        lines += [f"# {line}" for line in textwrap.wrap(f"note: {note}", 98, subsequent_indent="  ")]
    for cmd in plan.commands:
        lines += ["", f"# pool {cmd.pool}, backend {cmd.index}: {cmd.url}", cmd.shell()]
    return "\n".join(lines) + "\n"
