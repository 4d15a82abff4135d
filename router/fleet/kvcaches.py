"""A pool's view of its engines' prefix caches: the KV event stream the router follows for each
backend (router/fleet/kvstream.py), by backend name, and the question a `precise_prefix` lane's
balancer asks of them (router/balance/base.py `CachedTokens`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from router.fleet.kvindex import BlockIndex, Keyer
from router.fleet.kvstream import Stream


class KVCaches:
    """The streams of one pool's backends. A backend without a stream here — its pool follows no
    KV events, or its stream is not yet or no longer connected — is answered None, and placement
    judges it by approximation. `keyer` keys the pool's indexes (`index()`) and its lookups."""

    def __init__(self) -> None:
        self.streams: dict[str, Stream] = {}
        self.keyer = Keyer()

    def index(self) -> BlockIndex:
        """A new block index for one of the pool's backends."""
        return BlockIndex(self.keyer)

    def cached_tokens(
        self, names: Sequence[str], token_ids: Sequence[int], salt: str | None = None
    ) -> Mapping[str, int | None]:
        """Each named backend's cached leading tokens of the prompt (salted by `salt`, as the
        request's body carries it to the engine). The prompt is keyed once per keyer and block size
        among them, a chunk at a time, and no further than some backend holds it."""
        held: dict[str, int | None] = {}
        groups: dict[tuple[int, int], list[tuple[str, BlockIndex]]] = {}
        streams = self.streams
        for name in names:
            stream = streams.get(name)
            index = stream.view() if stream is not None else None
            if index is None:
                held[name] = None
            elif index.block_size is None:
                held[name] = 0  # connected, nothing stored yet
            else:
                groups.setdefault((id(index.keyer), index.block_size), []).append((name, index))
        for (_, size), indexes in groups.items():
            held.update(_held(indexes, indexes[0][1].keyer, token_ids, size, salt))
        return held


def _held(
    indexes: list[tuple[str, BlockIndex]], keyer: Keyer, token_ids: Sequence[int], size: int, salt: str | None
) -> dict[str, int]:
    """The cached tokens of indexes sharing a keyer and a block size: each chunk of keys is asked
    of the indexes that held every key before it; none left, the rest of the prompt is not keyed."""
    blocks = dict.fromkeys((name for name, _ in indexes), 0)
    going = indexes
    for chunk in keyer.chunks(token_ids, size, salt):
        still = []
        for name, index in going:
            n = index.held_blocks(chunk)
            blocks[name] += n
            if n == len(chunk):
                still.append((name, index))
        going = still
        if not going:
            break
    return {name: n * size for name, n in blocks.items()}
