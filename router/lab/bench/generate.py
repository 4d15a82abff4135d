"""A seeded, reproducible trace of the mixed workload: open-loop Poisson arrivals per class, and
agent sessions whose later steps are sent only after the previous answer (plus think time).

Every request carries what a real client of its class would send — tools and tool messages in
agent steps, the same document text in RAG prompts, long prompts, large non-streamed generations,
a stable `X-Client-Id` — and never a class label.

Randomness is split per class into an arrival stream and a shape stream, both seeded from the
workload seed. Arrival times are unit-rate draws scaled by the class rate, so the same seed at
another offered load yields the same requests in the same order, only closer together or further
apart: every point of a rate sweep sees the same work.
"""

from __future__ import annotations

import hashlib
import math
import random
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import Any

from router.lab.bench.text import TextSource
from router.lab.bench.workload import ClassSpec, Documents, Session, TenantSpec, TokenDist, WorkloadSpec

CLIENT_HEADER = "x-client-id"
_TOOL_NAMES = ("search_index", "read_file", "run_query", "fetch_page", "call_api", "list_items")


@dataclass(frozen=True, slots=True)
class Request:
    """One HTTP request of the trace. `arrival` is seconds from the start of the run. A session
    step after the first is sent `think_s` after the previous step's answer arrived; its
    `arrival` is the session's."""

    request_id: str
    cls: str
    arrival: float
    body: dict[str, Any]
    client_id: str
    stream: bool
    prompt_tokens: int
    output_tokens: int
    read_rate: float | None = None  # tokens/s the client reads a stream at (slow readers)
    session: str | None = None
    step: int = 0
    think_s: float = 0.0
    read_bytes_per_s: float | None = None  # bytes/s a slow reader takes instead (lane experiments)
    extra_headers: tuple[tuple[str, str], ...] = ()
    tenant: str = ""  # the workload tenant (API key) that sends it, if the workload names tenants

    @property
    def headers(self) -> tuple[tuple[str, str], ...]:
        """`X-Client-Id` when the request names its client (else the router knows it by its
        address), and the request's own headers."""
        client = ((CLIENT_HEADER, self.client_id),) if self.client_id else ()
        return client + self.extra_headers

    @property
    def wire_id(self) -> str:
        return wire_id(self.request_id)

    @property
    def slow(self) -> bool:
        return self.read_rate is not None or self.read_bytes_per_s is not None


def wire_id(request_id: str) -> str:
    """The X-Request-Id sent for `request_id`: opaque, unlike the id, which names the class."""
    return hashlib.blake2b(request_id.encode(), digest_size=8).hexdigest()


@dataclass(frozen=True, slots=True)
class SessionPlan:
    """A multi-step agent session: `steps[0]` arrives at `arrival`, each later one `think_s`
    after its predecessor finished."""

    session_id: str
    cls: str
    arrival: float
    steps: tuple[Request, ...]


Item = Request | SessionPlan


@dataclass(frozen=True, slots=True)
class Trace:
    workload: WorkloadSpec
    rate: float
    duration: float
    model: str
    items: tuple[Item, ...] = field(repr=False)

    def requests(self) -> Iterator[Request]:
        """Every request of the trace, session steps included, in item order."""
        for item in self.items:
            if isinstance(item, SessionPlan):
                yield from item.steps
            else:
                yield item

    @property
    def request_count(self) -> int:
        return sum(len(i.steps) if isinstance(i, SessionPlan) else 1 for i in self.items)

    def digest(self) -> str:
        """A fingerprint of the whole trace (times, bodies, clients), for reproducibility checks."""
        h = hashlib.sha256()
        for r in self.requests():
            h.update(f"{r.request_id}|{r.arrival:.9f}|{r.think_s:.9f}|{r.client_id}|".encode())
            h.update(repr(r.body).encode())
        return h.hexdigest()


def draw(dist: TokenDist, rng: random.Random) -> int:
    if dist.dist == "fixed":
        return dist.low
    if dist.dist == "uniform":
        return rng.randint(dist.min, dist.max)
    assert dist.median is not None
    mu = math.log(dist.median)
    for _ in range(64):
        value = round(math.exp(rng.gauss(mu, dist.sigma)))
        if dist.min <= value <= dist.max:
            return value
    return min(dist.max, max(dist.min, round(dist.median)))


def zipf_weights(n: int, s: float) -> list[float]:
    return [1.0 / (k**s) for k in range(1, n + 1)]


def client_id(seed: int, cls: str, k: int) -> str:
    # Opaque: the identity says nothing about the class it belongs to.
    return "c" + hashlib.blake2b(f"{seed}:{cls}:{k}".encode(), digest_size=6).hexdigest()


class Generator:
    def __init__(self, spec: WorkloadSpec, model: str, seed: int | None = None) -> None:
        self.spec = spec
        self.model = spec.model or model
        self.seed = spec.seed if seed is None else seed
        self.text = TextSource(self.seed)
        self._documents: dict[str, list[str]] = {}

    def trace(self, rate: float, duration: float) -> Trace:
        if rate <= 0 or duration <= 0:
            raise ValueError("rate and duration must be > 0")
        items: list[Item] = []
        if self.spec.tenants:
            for tenant in self.spec.tenants:
                items.extend(self._tenant_items(tenant, rate, duration))
        else:
            for cls, cspec in self.spec.classes.items():
                items.extend(self._class_items(cls.value, cspec, rate, duration))
        items.sort(
            key=lambda i: (i.arrival, i.steps[0].request_id if isinstance(i, SessionPlan) else i.request_id)
        )
        return Trace(workload=self.spec, rate=rate, duration=duration, model=self.model, items=tuple(items))

    # ---- per class ---------------------------------------------------------------------------
    def _class_items(self, cls: str, spec: ClassSpec, rate: float, duration: float) -> Iterator[Item]:
        # Sessions arrive at the rate that makes their steps the class's share of requests.
        arrivals_per_s = rate * spec.share / spec.mean_steps
        times = random.Random(f"{self.seed}:{cls}:time")
        shapes = random.Random(f"{self.seed}:{cls}:shape")
        unit = 0.0
        n = 0
        while True:
            unit += times.expovariate(1.0)
            t = unit / arrivals_per_s
            if t >= duration:
                return
            yield self._item(cls, spec, n, t, shapes)
            n += 1

    # ---- per tenant --------------------------------------------------------------------------
    def _tenant_items(self, tenant: TenantSpec, rate: float, duration: float) -> Iterator[Item]:
        """The tenant's requests of each of its classes: Poisson at its rate × the class share,
        squeezed into its bursts if it has any; `--rate` scales the tenants given a share."""
        for cls, share in self.spec.tenant_classes(tenant).items():
            spec = self.spec.spec(cls)
            if tenant.output_tokens is not None:
                spec = spec.model_copy(update={"output_tokens": tenant.output_tokens})
            arrivals_per_s = tenant.rate_at(rate) * share / spec.mean_steps
            times = random.Random(f"{self.seed}:{tenant.name}:{cls}:time")
            shapes = random.Random(f"{self.seed}:{tenant.name}:{cls}:shape")
            on_time = 0.0
            n = 0
            while True:
                on_time += times.expovariate(1.0) / arrivals_per_s
                t = tenant.bursts.at(on_time * tenant.bursts.duty) if tenant.bursts else on_time
                if t >= duration:
                    break
                yield _of_tenant(self._item(cls, spec, n, t, shapes, tenant.name), tenant.name)
                n += 1

    def _item(
        self, cls: str, spec: ClassSpec, n: int, t: float, rng: random.Random, tenant: str = ""
    ) -> Item:
        rid = f"{tenant}-{cls}-{n:06d}" if tenant else f"{cls}-{n:06d}"
        if spec.session is not None:
            return self._session(cls, spec, spec.session, n, t, rng, rid)
        client = self._client(f"{tenant}:{cls}" if tenant else cls, spec, rng)
        output = draw(spec.output_tokens, rng)
        if spec.documents is not None:
            assert spec.question_tokens is not None
            messages, prompt = self._rag_messages(cls, spec.documents, spec.question_tokens, rid, rng)
        else:
            assert spec.prompt_tokens is not None
            prompt = draw(spec.prompt_tokens, rng)
            messages = [{"role": "user", "content": self.text.unique(prompt, rng, f"[{self._tag(rid)}] ")}]
        read_rate = self._read_rate(cls, spec, client)
        return Request(
            request_id=rid,
            cls=cls,
            arrival=t,
            body=self._body(messages, output, spec.stream),
            client_id=client,
            stream=spec.stream,
            prompt_tokens=prompt,
            output_tokens=output,
            read_rate=read_rate,
        )

    def _tag(self, name: str) -> str:
        # Opaque: prompts must not tell the router which class wrote them.
        return hashlib.blake2b(f"{self.seed}:{name}".encode(), digest_size=5).hexdigest()

    def _client(self, cls: str, spec: ClassSpec, rng: random.Random) -> str:
        if spec.slow_readers is not None:
            return client_id(self.seed, f"{cls}:slow", rng.randrange(spec.slow_readers.clients))
        return client_id(self.seed, cls, rng.randrange(spec.clients))

    def _read_rate(self, cls: str, spec: ClassSpec, client: str) -> float | None:
        readers = spec.slow_readers
        if readers is None:
            return None
        # A device's reading speed is a property of the device: fixed per client identity.
        r = random.Random(f"{self.seed}:{cls}:reader:{client}")
        return r.uniform(readers.tokens_per_s.min, readers.tokens_per_s.max)

    def _body(
        self, messages: list[dict[str, Any]], output: int, stream: bool, **extra: Any
    ) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self.model,
            "messages": messages,
            "max_tokens": output,
            "ignore_eos": True,
            "stream": stream,
            **extra,
        }
        if stream:
            body["stream_options"] = {"include_usage": True}
        return body

    # ---- RAG ---------------------------------------------------------------------------------
    def _document_texts(self, cls: str, docs: Documents) -> list[str]:
        texts = self._documents.get(cls)
        if texts is None:
            rng = random.Random(f"{self.seed}:{cls}:documents")
            texts = [self.text.unique(docs.tokens, rng, f"Document {k + 1}. ") for k in range(docs.count)]
            self._documents[cls] = texts
        return texts

    def _rag_messages(
        self, cls: str, docs: Documents, question: TokenDist, rid: str, rng: random.Random
    ) -> tuple[list[dict[str, Any]], int]:
        texts = self._document_texts(cls, docs)
        doc = rng.choices(texts, weights=zipf_weights(docs.count, docs.zipf))[0]
        q_tokens = draw(question, rng)
        q = self.text.unique(q_tokens, rng, f"\n\nQuestion [{self._tag(rid)}]: ")
        messages: list[dict[str, Any]] = [{"role": "user", "content": doc + q}]
        if docs.instructions:
            rules = self.text.text(docs.instructions, 0, "Answer from the document. ")
            messages.insert(0, {"role": "system", "content": rules})
        return messages, docs.instructions + docs.tokens + q_tokens

    # ---- agent sessions ----------------------------------------------------------------------
    def _session(
        self,
        cls: str,
        spec: ClassSpec,
        session: Session,
        n: int,
        t: float,
        rng: random.Random,
        sid: str = "",
    ) -> SessionPlan:
        sid = sid or f"{cls}-{n:06d}"
        client = client_id(self.seed, cls, rng.randrange(spec.clients))
        steps = draw(session.steps, rng)
        initial = draw(session.initial_tokens, rng)
        tools = self._tools(session.tools)
        # The agent's instructions are shared by its sessions (half of the first prompt); the task
        # is the session's own.
        system_tokens = initial // 2
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": self.text.text(system_tokens, 0, "You are an agent. ")},
            {
                "role": "user",
                "content": self.text.unique(initial - system_tokens, rng, f"Task [{self._tag(sid)}]: "),
            },
        ]
        prompt = initial
        out: list[Request] = []
        for k in range(steps):
            output = draw(spec.output_tokens, rng)
            think = 0.0 if k == 0 else rng.uniform(session.think_s.min, session.think_s.max)
            out.append(
                Request(
                    request_id=f"{sid}-s{k}",
                    cls=cls,
                    arrival=t,
                    body=self._body(list(messages), output, spec.stream, tools=tools),
                    client_id=client,
                    stream=spec.stream,
                    prompt_tokens=prompt,
                    output_tokens=output,
                    session=sid,
                    step=k,
                    think_s=think,
                )
            )
            # What the next step re-sends: the model's tool call (its answer, in size) and the
            # tool's result.
            tool = tools[rng.randrange(len(tools))]["function"]["name"]
            call_id = f"call_{self._tag(f'{sid}-{k}')}"
            args_chars = max(2, output * 4 - len(tool))
            messages.append(
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": call_id,
                            "type": "function",
                            "function": {"name": tool, "arguments": self._arguments(args_chars, rng)},
                        }
                    ],
                }
            )
            result = draw(session.step_tokens, rng)
            messages.append(
                {
                    "role": "tool",
                    "tool_call_id": call_id,
                    "content": self.text.unique(result, rng, f"[{call_id}] "),
                }
            )
            prompt += output + result
        return SessionPlan(sid, cls, t, tuple(out))

    def _arguments(self, chars: int, rng: random.Random) -> str:
        head = '{"q": "'
        body = self.text.text(max(1, chars), rng.randrange(self.text.corpus_chars))
        return (head + body)[: max(0, chars - 2)] + '"}'

    @staticmethod
    def _tools(count: int) -> list[dict[str, Any]]:
        return [
            {
                "type": "function",
                "function": {
                    "name": _TOOL_NAMES[i % len(_TOOL_NAMES)] + ("" if i < len(_TOOL_NAMES) else f"_{i}"),
                    "description": "A tool the agent may call.",
                    "parameters": {
                        "type": "object",
                        "properties": {"q": {"type": "string"}},
                        "required": ["q"],
                    },
                },
            }
            for i in range(count)
        ]


def _of_tenant(item: Item, tenant: str) -> Item:
    if isinstance(item, SessionPlan):
        return replace(item, steps=tuple(replace(step, tenant=tenant) for step in item.steps))
    return replace(item, tenant=tenant)


def generate(
    spec: WorkloadSpec, *, model: str, rate: float, duration: float, seed: int | None = None
) -> Trace:
    """The trace of `spec` at `rate` requests/s over `duration` seconds of arrivals."""
    return Generator(spec, model, seed).trace(rate, duration)
