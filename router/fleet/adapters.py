"""LoRA adapters: which backends hold one, and where a request naming one goes. Pure.

vLLM serves an adapter as a model name of its own, listed in its `/v1/models` with the base
model as `parent`, and keeps only `--max-loras` adapters in its batch slots at once, swapping the
others in and out. The health checker learns each backend's list (router/fleet/health.py,
`Backend.served` and `Backend.adapters`); a request naming an adapter goes only to the backends
of its lane's pool that hold it, placed among them by the adapter's name with a bound on load
(router/balance/adapter_placement.py) whatever the lane's balance strategy, so each adapter
keeps to the same few backends, whose slots then hold it.

An adapter the profile names with a path (`adapters: [{name, path}]`) that no routable backend
of the pool holds — or whose holders are all loaded past the bound — is loaded on demand on the
backend the same ranking picks among all of them (router/fleet/adapterload.py)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from router.balance.adapter_placement import load_bound
from router.fleet.backend import Backend


class AdapterNeed:
    """A request's adapter: its name, the rendezvous key, the path to load it from (the
    profile's, None: the servers' own), and whether a backend whose models are unknown yet may
    hold it (`lenient`: an adapter the profile names as one the servers serve)."""

    __slots__ = ("key", "lenient", "name", "path")

    def __init__(self, name: str, path: str | None, lenient: bool) -> None:
        self.name = name
        self.key = b"adapter\x00" + name.encode()
        self.path = path
        self.lenient = lenient


def serves(backend: Backend, need: AdapterNeed) -> bool:
    """Whether the backend's last `/v1/models` listed the adapter (or the router loaded it there
    since); one that never answered counts for a `lenient` adapter."""
    served = backend.served
    if served is None:
        return need.lenient
    return need.name in served


def holds(backend: Backend, need: AdapterNeed) -> bool:
    """Whether the adapter's requests may go to the backend: it serves it, or the router is
    loading it there (the requests arriving meanwhile wait for that load, not start others)."""
    return serves(backend, need) or need.name in backend.loading


def candidates_for(backends: Sequence[Backend], need: AdapterNeed) -> list[Backend]:
    """The backends a request for the adapter may go to: its holders. With a path to load it
    from, any of them (the one picked loads it first) when none holds it, or when every holder
    is loaded past the bound of the whole pool and no load of it is under way: the adapter then
    spills into one more backend's slots."""
    held = [b for b in backends if holds(b, need)]
    if need.path is None or len(held) == len(backends):
        return held
    if not held:
        return list(backends)
    if any(need.name in b.loading for b in held):
        return held  # the requests arriving while it loads wait for that load, not start another
    bound = load_bound(backends)
    if all(b.in_flight + 1 > bound for b in held):
        return list(backends)
    return held


def learned_parents(listed: Iterable[tuple[str, tuple[str, ...], Backend]]) -> dict[str, str]:
    """Every adapter some backend listed, with the model it is an adapter of. Each backend comes
    with its pool's model and the names that model goes by: an adapter counts only with one of
    those as its parent, so a server can neither claim an adapter for a model its pool does not
    serve nor, by the parent it lists, move another model's adapter. An adapter listed for two
    different models is ambiguous: refused (unknown) rather than guessed."""
    found: dict[str, str] = {}
    clashing: set[str] = set()
    for model, names, backend in listed:
        for name, parent in backend.adapters:
            if parent in names and found.setdefault(name, model) != model:
                clashing.add(name)
    for name in clashing:
        del found[name]
    return found
