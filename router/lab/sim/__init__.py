"""A vLLM engine simulator: the lab's backend when no GPU is at hand.

Layers, bottom up:

* `token_ids` — text → token ids (4 characters a token, prefix-stable) and the prompt-size
                heuristic the router shares;
* `kv`        — paged KV blocks: prefix sharing by chained hashes, refcounts, LRU eviction,
                copy-on-write, compact spans and allocation layouts;
* `scheduler`, `engine` — vLLM's continuous-batching step (decodes first, chunked prefill,
                prefix-cache hits, preemption by recompute) with a calibratable step-time model
                (`timing`, presets in `presets/`);
* `runner`, `server`, `serve` — real time: an asyncio driver and a pure-ASGI OpenAI-compatible
                app with vLLM's routes, metrics (`engine_metrics`) and `--api-key` behaviour,
                many per process;
* `vclock`    — virtual time: the same engines on an event heap, requests placed by a
                caller-supplied `pick(backends, request) -> index` (the router's routing);
* `calibrate`, `compare`, `cost` — fit a preset to a real vLLM, check the simulator against
                it, and measure what the simulator costs; `timedstream` is their probe client,
                which times each token of a streamed completion.

Command line: `lane-router sim --port P` / `--ports A-B` / `--config PROFILE.yaml`,
`lane-router sim calibrate --url URL --out FILE`, `lane-router sim compare --real URL --sim URL`.
"""
