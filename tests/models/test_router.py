"""Several endpoints: step affinity, spreading, failover (in-process fakes; the end-to-end
failover of a run against two HTTP fakes is in test_openai_run.py)."""

from __future__ import annotations

import threading
import time
from dataclasses import replace

import pytest

from coder.errors import Abandoned, HostUnreachable, ModelMissing
from coder.models import bounds, slots
from coder.models.fake import FakeProvider
from coder.models.provider import ChatEvent, EndpointDown, ModelFacts
from coder.models.router import Router
from coder.models.slots import Slots

USER = [{"role": "user", "content": "hi"}]


class Endpoints:
    """One FakeProvider per (endpoint, model), and a clock the test moves."""

    def __init__(self) -> None:
        self.made: dict[tuple[str, str], FakeProvider] = {}
        self.now = 0.0

    def make(self, endpoint: str, model: str) -> FakeProvider:
        self.made[(endpoint, model)] = FakeProvider(model=model)
        return self.made[(endpoint, model)]

    def router(self, *urls: str, cooldown_s: float = 30) -> Router:
        return Router(self.make, list(urls), "m", cooldown_s=cooldown_s, clock=lambda: self.now)

    def at(self, endpoint: str, model: str = "m") -> FakeProvider:
        return self.made[(endpoint, model)]


def test_a_step_keeps_to_its_endpoint_and_parallel_steps_spread() -> None:
    e = Endpoints()
    router = e.router("a", "b")
    s1, s2, s3 = router.for_step("s1"), router.for_step("s2"), router.for_step("s3")
    assert [s.endpoint for s in (s1, s2, s3)] == ["a", "b", "a"]
    router.provider("a", "m").enqueue("one", "two")
    assert [s1.chat(USER).content, s1.chat(USER).content] == ["one", "two"]
    assert len(e.at("a").history) == 2 and s1.endpoint == "a"  # both calls on a
    s1.close()
    s3.close()
    assert router.for_step("s4").endpoint == "a"  # a is free again; b still has s2


def test_a_step_may_use_its_own_model() -> None:
    e = Endpoints()
    router = e.router("a")
    step = router.for_step("s1", "big")
    router.provider("a", "big").enqueue("from big")
    assert step.chat(USER).content == "from big" and step.model == "big"
    assert set(e.made) == {("a", "big")}


def test_a_refusing_endpoint_is_left_out_and_the_step_goes_on_elsewhere() -> None:
    e = Endpoints()
    router = e.router("a", "b")
    step = router.for_step("s1")
    router.provider("a", "m").enqueue(HostUnreachable("cannot reach a", endpoint="a"))
    router.provider("b", "m").enqueue("from b")
    events: list[ChatEvent] = []
    assert step.chat(USER, on_event=events.append).content == "from b"
    assert events[0] == EndpointDown("a", "cannot reach a", "b", 30)
    assert step.endpoint == "b"
    assert router.for_step("s2").endpoint == "b"  # a is cooling down
    e.now = 31
    assert router.for_step("s3").endpoint == "a"  # back after the cooldown


def test_every_endpoint_refusing_fails_naming_them_all() -> None:
    e = Endpoints()
    router = e.router("a", "b")
    router.provider("a", "m").enqueue(HostUnreachable("cannot reach a", endpoint="a"))
    router.provider("b", "m").enqueue(HostUnreachable("cannot reach b", endpoint="b"))
    with pytest.raises(HostUnreachable) as err:
        router.for_step("s1").chat(USER)
    assert "no model server answers (a, b)" in err.value.message
    assert "cannot reach a" in err.value.message and "cannot reach b" in err.value.message


def test_one_endpoint_passes_its_error_through() -> None:
    router = Endpoints().router("a")
    router.provider("a", "m").enqueue(HostUnreachable("cannot reach a", hint="start it"))
    with pytest.raises(HostUnreachable) as err:
        router.for_step("s1").chat(USER)
    assert (err.value.message, err.value.hint) == ("cannot reach a", "start it")


def test_other_errors_do_not_fail_over() -> None:
    router = Endpoints().router("a", "b")
    router.provider("a", "m").enqueue(ModelMissing("no such model at a"))
    with pytest.raises(ModelMissing):
        router.for_step("s1").chat(USER)


def test_warm_up_warms_every_endpoint_and_leaves_out_the_dead() -> None:
    class Dead(FakeProvider):
        def warm_up(self):  # type: ignore[no-untyped-def]
            raise HostUnreachable("cannot reach b", endpoint="b")

    def make(endpoint: str, model: str) -> FakeProvider:
        return Dead(model=model) if endpoint == "b" else FakeProvider(model=model, num_ctx=4096)

    router = Router(make, ["a", "b"], "m")
    facts = router.warm_up()
    assert facts.num_ctx == 4096 and facts.extra == {
        "endpoints": ["a", "b"],
        "endpoints_down": ["b"],
    }
    assert router.for_step("s1").endpoint == "a"
    only_dead = Router(lambda e, m: Dead(model=m), ["b", "c"], "m")
    with pytest.raises(HostUnreachable, match="no model server answers"):
        only_dead.warm_up()


def test_close_closes_every_provider() -> None:
    e = Endpoints()
    router = e.router("a", "b")
    router.provider("a", "m"), router.provider("b", "x")
    router.close()
    assert all(p.closed for p in e.made.values())


def test_embed_keeps_to_the_step_endpoint_and_fails_over_like_chat() -> None:
    e = Endpoints()
    router = e.router("a", "b")
    step = router.for_step("s1", "embedder")
    router.provider("a", "embedder").enqueue(HostUnreachable("cannot reach a", endpoint="a"))
    vectors = step.embed(["parse the config"])
    assert len(vectors) == 1 and len(vectors[0]) == 16
    assert e.at("b", "embedder").embedded == [["parse the config"]]  # moved to b
    assert step.endpoint == "b" and router.for_step("s2").endpoint == "b"  # a cools down


def test_providers_are_made_before_the_pool_so_no_two_threads_import_an_sdk_at_once() -> None:
    """Making a provider imports its SDK; the openai SDK imported by several warm-up threads
    at once met a half-initialised httpx (`partially initialized module 'httpx'`)."""
    import threading

    makers: list[str] = []

    def make(endpoint: str, model: str) -> FakeProvider:
        makers.append(threading.current_thread().name)
        return FakeProvider(model=model)

    router = Router(make, ["a", "b", "c"], "m")
    router.warm_up()
    router.prime([{"role": "system", "content": "x"}], [], model="other")
    assert makers == [threading.current_thread().name] * 6


class Slotted(FakeProvider):
    """A fake at an endpoint with `slots`, noting the slot each chat was made on."""

    def __init__(self, model: str, slots: int) -> None:
        super().__init__(model=model)
        self.slots = slots
        self.on_slots: list[int | None] = []

    def warm_up(self, model: str | None = None) -> ModelFacts:
        return replace(super().warm_up(model), slots=self.slots)

    def chat(self, messages, **kwargs):  # type: ignore[no-untyped-def]
        self.on_slots.append(slots.current())
        return super().chat(messages, **kwargs)


def test_each_step_gets_a_slot_of_its_own_and_steps_spread_by_the_slots() -> None:
    made: dict[str, Slotted] = {}

    def make(endpoint: str, model: str) -> Slotted:
        made[endpoint] = Slotted(model, {"a": 3, "b": 1}[endpoint])
        return made[endpoint]

    router = Router(make, ["a", "b"], "m")
    assert router.warm_up().slots == 4  # over the endpoints
    router.prime([{"role": "system", "content": "x"}], [], width=2)  # two steps at once at most
    assert sorted(made["a"].on_slots) == [0, 1] and made["b"].on_slots == [0]
    made["a"].on_slots.clear(), made["b"].on_slots.clear()
    steps = [router.for_step(f"s{i}") for i in range(1, 5)]
    assert [s.endpoint for s in steps] == ["a", "b", "a", "a"]  # a has three times b's room
    for step in steps:
        router.provider(step.endpoint, "m").enqueue("one", "two")
        step.chat(USER), step.chat(USER)
    assert made["a"].on_slots == [0, 0, 1, 1, 2, 2] and made["b"].on_slots == [0, 0]
    steps[2].close()
    late = router.for_step("s5")
    assert late.endpoint == "a"
    router.provider("a", "m").enqueue("three")
    late.chat(USER)
    assert made["a"].on_slots[-1] == 1  # the slot s3 left


def test_a_request_waits_for_its_slot_within_its_bound() -> None:
    pool = Slots(1)
    stop = threading.Event()
    waited: list[BaseException] = []

    def second() -> None:
        with bounds.within(cancel=stop):
            try:
                with pool.use(0):
                    pass
            except Abandoned as exc:
                waited.append(exc)

    with pool.use(0):  # a first request holds the one slot
        waiting = threading.Thread(target=second)
        waiting.start()
        time.sleep(0.3)
        assert waiting.is_alive()  # it waits for the slot
        stop.set()  # the run's stop
        waiting.join(2)
    assert not waiting.is_alive() and isinstance(waited[0], Abandoned) and waited[0].stopped
