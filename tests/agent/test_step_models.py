"""Per-step models and escalation to `fallback_model`, end to end against the fake Ollama."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import coder
from tests.fake_ollama import DEFAULT_MODELS, FakeOllama
from tests.helpers import chat_requests, done, state_of, taskfile

BIG = "qwen2.5-coder:14b"
SMALL = "qwen2.5-coder:1.5b"


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch):
    conf = next(iter(DEFAULT_MODELS.values()))
    with FakeOllama(models={**DEFAULT_MODELS, BIG: conf, SMALL: conf}) as server:
        monkeypatch.setenv("OLLAMA_HOST", server.url)
        yield server


def test_a_step_may_name_its_own_model(fake: FakeOllama, sample: Path) -> None:
    fake.enqueue(done("looked"), done("looked again"))
    path = taskfile(
        sample,
        f"""
        id: own
        title: t
        graph:
          - {{id: s1, kind: analyze, goal: look}}
          - {{id: s2, kind: analyze, goal: look again, model: "{SMALL}"}}
        """,
    )
    code, out, err = coder(sample, "run", "--autonomous", "-f", str(path))
    assert code == 0, out + err
    assert [r["model"] for r in chat_requests(fake)] == ["qwen2.5-coder:7b", SMALL]


def test_a_step_that_failed_twice_escalates_to_the_fallback_model(
    fake: FakeOllama, sample: Path
) -> None:
    prose = "I am not sure what to do here."
    fake.enqueue(prose, prose, prose, prose, done("looked, finally"))
    path = taskfile(
        sample,
        f"""
        id: esc
        title: t
        fallback_model: "{BIG}"
        graph:
          - {{id: s1, kind: analyze, goal: look, retries: 2}}
        """,
    )
    code, out, err = coder(sample, "run", "--autonomous", "-f", str(path))
    assert code == 0, out + err
    models = [r["model"] for r in chat_requests(fake)]
    assert models == ["qwen2.5-coder:7b"] * 4 + [BIG]
    reasons = state_of(sample, "esc")["steps"]["s1"]["reasons"]
    assert (
        f"attempt 3 uses fallback_model {BIG} after 2 failed attempts with qwen2.5-coder:7b"
        in reasons
    )
    log = (sample / ".coder" / "logs" / "esc.jsonl").read_text().splitlines()
    escalated = [json.loads(line) for line in log if '"model.escalated"' in line]
    assert len(escalated) == 1 and escalated[0]["model"] == BIG


def test_fallback_model_is_only_for_model_steps(sample: Path) -> None:
    path = taskfile(
        sample, "title: t\ngraph:\n  - {kind: shell, cmd: 'true', fallback_model: big}\n"
    )
    code, out, err = coder(sample, "validate", "-f", str(path))
    assert code == 2 and "`fallback_model` is only used by" in out + err
