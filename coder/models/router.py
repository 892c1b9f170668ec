"""Several endpoints behind one model source: step affinity, spreading, failover.

The distributed part is the inference engine's job (vLLM, SGLang, llama.cpp, several Ollama
hosts); coder's is to route so each server's prompt cache stays warm:

- a step keeps to one endpoint for all its calls (`for_step` pins it), so its growing prefix
  stays in that server's KV cache, and to one of that endpoint's slots (coder.models.slots);
- an endpoint takes as many requests at once as it has slots (its server's `total_slots`, the
  config's `slots`, else 1): the rest wait for their step's slot;
- parallel steps spread: a new step goes to the endpoint with the fewest steps pinned to it and
  requests in flight for each of its slots (ties: the order of the config);
- an endpoint that refuses connections (HostUnreachable) is left out for `cooldown_s`, and the
  step's call goes on at another endpoint, reported to the caller as an `EndpointDown` event;
  only when every endpoint refused does the call fail (HostUnreachable naming them all).

With one endpoint all this reduces to a pass-through.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import Counter
from collections.abc import Callable, Collection, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import replace
from typing import Any, TypeVar

from coder.errors import Abandoned, CoderError, HostUnreachable
from coder.models import bounds
from coder.models.provider import (
    ChatEvent,
    ChatResult,
    EndpointDown,
    Message,
    ModelFacts,
    ModelProvider,
    ToolSchema,
    cut_at_first_token,
)
from coder.models.slots import Slots
from coder.schemas import JsonSchema

T = TypeVar("T")
MakeProvider = Callable[[str, str], ModelProvider]  # (endpoint, model) -> provider
COOLDOWN_S = 30.0


class Router:
    """The run's models over `endpoints`; `model` is the default one."""

    def __init__(
        self,
        make: MakeProvider,
        endpoints: list[str],
        model: str,
        *,
        cooldown_s: float = COOLDOWN_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not endpoints:
            raise ValueError("a router needs at least one endpoint")
        self.make = make
        self.endpoints = list(dict.fromkeys(endpoints))
        self.model = model
        self.cooldown_s = cooldown_s
        self._clock = clock
        self._lock = threading.Lock()
        self._providers: dict[tuple[str, str], ModelProvider] = {}
        self._down_until: dict[str, float] = {}
        self._pinned: Counter[str] = Counter()
        self._in_flight: Counter[str] = Counter()
        self._slots: dict[str, Slots] = {}

    # -- the Models seam -------------------------------------------------------------------

    def for_step(self, step_id: str, model: str | None = None) -> StepProvider:
        """A provider pinned to one endpoint for the step's calls; close it when the step
        ends (that releases the pin, not the connection)."""
        return StepProvider(self, step_id, model or self.model)

    def warm_up(self, model: str | None = None) -> ModelFacts:
        """Warm `model` (else the default one) on every endpoint at once. Endpoints that
        refuse are left out (named in the facts' `endpoints_down`); a missing model anywhere
        is an error, as is no endpoint answering. The facts are those of the first endpoint
        that answered."""
        name = model or self.model
        # Made here, not in the pool: making one imports its SDK, and an SDK imported by
        # several threads at once can meet a module another thread has half initialised.
        providers = [self.provider(endpoint, name) for endpoint in self.endpoints]
        if len(providers) == 1:
            return self.learn(self.endpoints[0], providers[0].warm_up())

        def warm(provider: ModelProvider) -> ModelFacts | HostUnreachable:
            try:
                return provider.warm_up()
            except HostUnreachable as exc:
                return exc

        with ThreadPoolExecutor(len(providers)) as pool:
            results = list(pool.map(warm, providers))
        facts = [
            self.learn(e, r) for e, r in zip(self.endpoints, results) if isinstance(r, ModelFacts)
        ]
        down = [e for e, r in zip(self.endpoints, results) if isinstance(r, HostUnreachable)]
        for endpoint in down:
            self.mark_down(endpoint)
        if not facts:
            raise self.all_down(results)
        extra = {**facts[0].extra, "endpoints": self.endpoints}
        if down:
            extra["endpoints_down"] = down
        total = sum(f.slots or 1 for f in facts)  # what the endpoints that answered serve
        return replace(facts[0], slots=total, extra=extra)

    def learn(self, endpoint: str, facts: ModelFacts) -> ModelFacts:
        """The endpoint's slots, as its warm-up found them (the server's, or the config's)."""
        if facts.slots:
            self.slots(endpoint, facts.slots)
        return facts

    def prime(
        self,
        messages: list[Message],
        tools: list[ToolSchema],
        model: str | None = None,
        width: int = 1,
    ) -> None:
        """Send the run's shared prefix (system message and tools) for `model` (else the
        default one) to every endpoint that is up, cut at the first token, so the first
        step's first call finds it in the server's cache: to `width` slots of each (as many
        as it has, at most: each step starts on a slot of its own); a failure here is left
        for the real calls to report, and a bound the caller is in (coder.models.bounds)
        ends it."""

        def send(provider: ModelProvider, slots: Slots, slot: int) -> None:
            with contextlib.suppress(CoderError, Abandoned), slots.use(slot):
                provider.chat(messages, tools=tools, on_event=cut_at_first_token)

        now = self._clock()
        up = [e for e in self.endpoints if self._down_until.get(e, 0.0) <= now]
        sends = [
            (self.provider(endpoint, model or self.model), self.slots(endpoint), slot)
            for endpoint in up
            for slot in range(min(max(1, width), self.slots(endpoint).size))
        ]
        with ThreadPoolExecutor(max(1, len(sends))) as pool:  # within the caller's bound
            for future in [pool.submit(bounds.in_context(send), *s) for s in sends]:
                future.result()

    def close(self) -> None:
        with self._lock:
            providers, self._providers = list(self._providers.values()), {}
        for provider in providers:
            provider.close()

    # -- routing ---------------------------------------------------------------------------

    def provider(self, endpoint: str, model: str) -> ModelProvider:
        with self._lock:
            key = (endpoint, model)
            if key not in self._providers:
                self._providers[key] = self.make(endpoint, model)
            return self._providers[key]

    def slots(self, endpoint: str, size: int = 1) -> Slots:
        """The endpoint's slots (made on first use; `size`: it serves at least that many)."""
        with self._lock:
            if endpoint not in self._slots:
                self._slots[endpoint] = Slots(size)
            found = self._slots[endpoint]
        found.grow(size)
        return found

    def pick(self, exclude: Collection[str] = (), *, even_down: bool = False) -> str | None:
        """The least busy endpoint for its slots that is up and not excluded (None: there is
        none); it counts as pinned until `release`. `even_down`: when every endpoint is
        cooling down, take one anyway (it may be back)."""
        with self._lock:
            now = self._clock()
            left = [e for e in self.endpoints if e not in exclude]
            up = [e for e in left if self._down_until.get(e, 0.0) <= now]
            up = up or (left if even_down else [])
            if not up:
                return None
            size = {e: self._slots[e].size if e in self._slots else 1 for e in up}
            chosen = min(up, key=lambda e: (self._pinned[e] + self._in_flight[e]) / size[e])
            self._pinned[chosen] += 1
            return chosen

    def release(self, endpoint: str) -> None:
        with self._lock:
            self._pinned[endpoint] -= 1

    @contextmanager
    def in_flight(self, endpoint: str) -> Iterator[None]:
        with self._lock:
            self._in_flight[endpoint] += 1
        try:
            yield
        finally:
            with self._lock:
                self._in_flight[endpoint] -= 1

    def mark_down(self, endpoint: str) -> None:
        with self._lock:
            self._down_until[endpoint] = self._clock() + self.cooldown_s

    def all_down(self, failures: list[Any]) -> HostUnreachable:
        if len(self.endpoints) == 1 and isinstance(failures[0], HostUnreachable):
            return failures[0]
        reasons = "; ".join(f.message for f in failures if isinstance(f, HostUnreachable))
        hint = next((f.hint for f in failures if isinstance(f, HostUnreachable)), None)
        return HostUnreachable(
            f"no model server answers ({', '.join(self.endpoints)}): {reasons}",
            hint=hint,
            endpoint=", ".join(self.endpoints),
        )


class StepProvider:
    """A `ModelProvider` for one step: every call goes to the step's endpoint, on the step's
    slot there, and moves to another endpoint only when that one refuses connections."""

    def __init__(self, router: Router, step_id: str, model: str) -> None:
        self.router = router
        self.step_id = step_id
        self.model = model
        self._endpoint: str | None = None
        self._slot = 0

    @property
    def endpoint(self) -> str:
        if self._endpoint is None:
            self._settle(self.router.pick(even_down=True))
            assert self._endpoint is not None  # a router has at least one endpoint
        return self._endpoint

    def _settle(self, endpoint: str | None) -> None:
        """Leave the endpoint and slot the step had; take `endpoint` (as `pick` pinned it;
        None: none) and a slot of its own there."""
        if self._endpoint is not None:
            self.router.slots(self._endpoint).release(self._slot)
            self.router.release(self._endpoint)
        self._endpoint = endpoint
        if endpoint is not None:
            self._slot = self.router.slots(endpoint).assign()

    def chat(
        self,
        messages: list[Message],
        *,
        tools: list[ToolSchema] | None = None,
        format: JsonSchema | str | None = None,
        on_event: Callable[[ChatEvent], None] | None = None,
    ) -> ChatResult:
        return self._failover(
            lambda p: p.chat(messages, tools=tools, format=format, on_event=on_event), on_event
        )

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        return self._failover(lambda p: p.embed(texts), None)

    def _failover(
        self, action: Callable[[ModelProvider], T], on_event: Callable[[ChatEvent], None] | None
    ) -> T:
        """`action` at the step's endpoint; at the next one up when that one refuses."""
        emit = on_event or (lambda event: None)
        failures: list[Any] = []
        while True:
            endpoint = self.endpoint
            provider = self.router.provider(endpoint, self.model)
            try:
                with self.router.slots(endpoint).use(self._slot), self.router.in_flight(endpoint):
                    return action(provider)
            except HostUnreachable as exc:
                failures.append(exc)
                self.router.mark_down(endpoint)
                self._settle(None)
                tried = {f.endpoint for f in failures} | {endpoint}
                following = self.router.pick(exclude=tried)
                if following is None:
                    raise self.router.all_down(failures) from None
                self._settle(following)
                emit(EndpointDown(endpoint, exc.message, following, self.router.cooldown_s))

    def warm_up(self) -> ModelFacts:
        endpoint = self.endpoint
        return self.router.learn(endpoint, self.router.provider(endpoint, self.model).warm_up())

    def close(self) -> None:
        self._settle(None)


class ModelSet:
    """Models at several places: the config's own server and each named model's (config
    `models`), one Router per place, made on first use (with that place's default model). A
    model name is resolved to its place and the name the server there knows it by; `model`
    is the run's default."""

    def __init__(
        self,
        resolve: Callable[[str], tuple[str, str]],  # model -> (place, name at that place)
        make_router: Callable[[str], Router],
        model: str,
    ) -> None:
        self.model = model
        self._resolve = resolve
        self._make_router = make_router
        self._lock = threading.Lock()
        self._routers: dict[str, Router] = {}

    def router(self, place: str) -> Router:
        with self._lock:
            if place not in self._routers:
                self._routers[place] = self._make_router(place)
            return self._routers[place]

    def for_step(self, step_id: str, model: str | None = None) -> StepProvider:
        place, name = self._resolve(model or self.model)
        return self.router(place).for_step(step_id, name)

    def warm_up(self, model: str | None = None) -> ModelFacts:
        place, name = self._resolve(model or self.model)
        return self.router(place).warm_up(name)

    def prime(
        self,
        messages: list[Message],
        tools: list[ToolSchema],
        model: str | None = None,
        width: int = 1,
    ) -> None:
        place, name = self._resolve(model or self.model)
        self.router(place).prime(messages, tools, name, width)

    def close(self) -> None:
        with self._lock:
            routers, self._routers = list(self._routers.values()), {}
        for router in routers:
            router.close()
