"""The CPU a `precise_prefix` lane adds to a request: the prompt's token ids (the chat template
rendered and encoded by the model's tokenizer) and the index lookup (the prompt keyed, then
looked up on every backend of the pool), for a 4,096-token prompt.

    python -m router.lab.bench.precise [--model DIR] [--backends 4] [--tokens 4096]

`--model` is a model directory with tokenizer.json and a chat template (default: the lab's tiny
model, ~/.cache/lane-router/models/tiny, built by scripts/setup-vllm-cpu.sh); without one the
tokenization is not measured. Each figure is the CPU time of the measuring thread (microseconds per
request), the least of several rounds: the round least disturbed by the rest of the machine. The
lookup is timed at its costliest, every backend holding the whole prompt, and for a prompt no
backend holds.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import random
import time
from array import array
from collections.abc import Callable, Sequence
from pathlib import Path

from router.fleet.kvcaches import KVCaches
from router.fleet.kvevents import BlockStored
from router.fleet.kvstream import Stream
from router.lab.realvllm.install import default_install
from router.request.chattemplate import TemplateCount
from router.request.tokenizer_source import BY_TOKENIZER, find_tokenizer
from router.request.tokens import TokenizerCounter

BLOCK_SIZES = (16, 128)  # vLLM's default on GPUs; vllm-cpu's


def least_us(work: Callable[[], object], rounds: int = 9, per_round: int = 100) -> float:
    work()
    best = float("inf")
    for _ in range(rounds):
        start = time.thread_time()
        for _ in range(per_round):
            work()
        best = min(best, (time.thread_time() - start) / per_round)
    return best * 1e6


def blake2b_chain(token_ids: Sequence[int], block_size: int) -> list[bytes]:
    """The chained BLAKE2b keying the index used before, for comparison."""
    raw = array("I", token_ids).tobytes()
    step = block_size * 4
    parent = bytes(16)
    keys = []
    for start in range(0, len(raw) - step + 1, step):
        parent = hashlib.blake2b(parent + raw[start : start + step], digest_size=16).digest()
        keys.append(parent)
    return keys


def pool_holding(token_ids: Sequence[int], block_size: int, backends: int) -> tuple[KVCaches, list[str]]:
    """A pool's caches whose every backend holds the whole prompt."""
    caches = KVCaches()
    names = [f"http://10.0.0.{i}:8000" for i in range(backends)]
    full = len(token_ids) // block_size * block_size
    for name in names:
        stream = Stream(caches.index(), connected=True)
        stored = BlockStored(
            block_hashes=tuple(range(1, full // block_size + 1)),
            parent_block_hash=None,
            token_ids=tuple(token_ids[:full]),
            block_size=block_size,
            plain=True,
        )
        stream.index.apply([stored])
        caches.streams[name] = stream
    return caches, names


def index_lines(tokens: int, backends: int) -> list[str]:
    rng = random.Random(36)
    token_ids = [rng.randrange(150_000) for _ in range(tokens)]
    return [_index_line(token_ids, size, backends) for size in BLOCK_SIZES]


def _index_line(token_ids: list[int], size: int, backends: int) -> str:
    caches, names = pool_holding(token_ids, size, backends)
    keys = caches.keyer.chain_keys(token_ids, size)
    indexes = [caches.streams[name].index for name in names]
    keying = least_us(lambda: caches.keyer.chain_keys(token_ids, size))
    lookup = least_us(lambda: [index.cached_tokens(keys) for index in indexes])
    both = least_us(lambda: caches.cached_tokens(names, token_ids))
    fresh = [t + 1 for t in token_ids]
    none = least_us(lambda: caches.cached_tokens(names, fresh))
    old = least_us(lambda: blake2b_chain(token_ids, size))
    return (
        f"block {size:>3}: keying {keying:5.1f} µs + lookup on {backends} backends {lookup:5.1f} µs;"
        f" both (KVCaches.cached_tokens) {both:5.1f} µs, held nowhere {none:5.1f} µs"
        f"  [chained BLAKE2b keying: {old:5.1f} µs]"
    )


def template_line(model: Path, tokens: int) -> str:
    source = find_tokenizer(str(model), None, None, {})
    if source.how != BY_TOKENIZER or source.template is None:
        return f"tokenization: {model} has no tokenizer.json with a chat template"
    tokenizer = TokenizerCounter(source.path or model).tokenizer
    chat = TemplateCount(source.template, source.special or {}, tokenizer)
    words = "the harbour master records each vessel that enters the port at dawn and at dusk "
    system = {"role": "system", "content": "You answer from the documents."}
    copies = 64
    for _ in range(8):  # as many copies of the words as make the prompt `tokens` long, near enough
        body = {"messages": [system, {"role": "user", "content": words * copies}]}
        n = chat.count(body) or 0
        if abs(n - tokens) <= tokens // 50:
            break
        copies = max(1, copies * tokens // max(n, 1))
    render = least_us(lambda: chat.render(body["messages"], True), per_round=20)
    encode = least_us(lambda: chat.encode(body), per_round=20)
    return (
        f"chat prompt of {n} tokens ({len(words) * copies} characters), {model.name}'s tokenizer:"
        f" render {render:.0f} µs, render + encode {encode:.0f} µs (the template count, whose ids"
        " the lane reuses)"
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--model", type=Path, default=default_install().model("tiny"))
    parser.add_argument("--backends", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=4096)
    args = parser.parse_args(argv)
    print(f"{args.tokens}-token prompt, PYTHONHASHSEED={os.environ.get('PYTHONHASHSEED', 'random')}")
    for line in index_lines(args.tokens, args.backends):
        print(line)
    if (args.model / "tokenizer.json").is_file():
        print(template_line(args.model, args.tokens))
    else:
        print(f"tokenization: no tokenizer.json at {args.model} (--model DIR)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
