"""A pool's view of its engines' prefix caches: the KV event stream the router follows for each
backend (router/fleet/kvstream.py), by backend name, and the question a `precise_prefix` lane's
balancer asks of them (router/balance/base.py `CachedTokens`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from router.fleet.kvindex import chain_keys
from router.fleet.kvstream import Stream


class KVCaches:
    """The streams of one pool's backends. A backend without a stream here — its pool follows no
    KV events, or its stream is not yet or no longer connected — is answered None, and placement
    judges it by approximation."""

    def __init__(self) -> None:
        self.streams: dict[str, Stream] = {}

    def cached_tokens(self, names: Sequence[str], token_ids: Sequence[int]) -> Mapping[str, int | None]:
        """Each named backend's cached leading tokens of the prompt; the prompt is keyed once per
        block size among them."""
        keys_by_size: dict[int, list[int]] = {}
        held: dict[str, int | None] = {}
        streams = self.streams
        for name in names:
            stream = streams.get(name)
            index = stream.view() if stream is not None else None
            if index is None:
                held[name] = None
                continue
            size = index.block_size
            if size is None:
                held[name] = 0  # connected, nothing stored yet
                continue
            keys = keys_by_size.get(size)
            if keys is None:
                keys = keys_by_size[size] = chain_keys(token_ids, size)
            held[name] = index.cached_tokens(keys)
        return held
