"""Every model a run's steps can use (a step's own `model`, a `fallback_model`, a named model on
another server) is asked for at its server before the run creates anything, without loading
it: a missing one refuses `coder run` (and `coder resume`) up front, exit 3, naming the steps
and the fix, instead of stopping the run when its step comes. Real `coder` commands against
the fake Ollama and OpenAI-compatible servers, checked with the git CLI."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import coder, git
from tests.fake_ollama import DEFAULT_MODELS, FakeOllama, down_url
from tests.fake_openai import FakeOpenAI
from tests.helpers import done, state_of, taskfile

MODEL = "qwen2.5-coder:7b"  # the fake Ollama's model, coder's default
TOOLS = {"capabilities": ["completion", "tools"]}

STEPS = """
id: models
title: t
graph:
  - {id: s1, kind: analyze, goal: look}
  - {id: s2, kind: edit, goal: change, model: "qwen2.5-coder:14b", depends_on: [s1]}
  - {id: s3, kind: analyze, goal: look again, fallback_model: "qwen2.5-coder:32b",
     retries: 2, depends_on: [s2]}
  - {id: s4, kind: doc, goal: write it up, fallback_model: "qwen2.5-coder:32b",
     retries: 3, depends_on: [s3]}
"""


def configure(home: Path, **values: Any) -> None:
    path = home / ".config" / "coder" / "config.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(values))


def nothing_created(repo: Path, task_id: str) -> None:
    """No branch, no worktree, no manifest or checkpoint of the run."""
    assert git(repo, "branch", "--list", f"agent/{task_id}*") == ""
    assert len(git(repo, "worktree", "list").splitlines()) == 1
    coder_dir = repo / ".coder"
    assert not list(coder_dir.glob(f"tasks/{task_id}.json"))
    assert not list(coder_dir.glob(f"state/{task_id}.*"))
    assert not (coder_dir / "worktrees" / task_id).exists()


def loaded_nothing(server: FakeOllama) -> None:
    """The server was only asked what it has: no chat (which loads a model), no embed."""
    paths = {r.path for r in server.requests}
    assert "/api/tags" in paths
    assert not paths & {"/api/chat", "/api/generate", "/api/embed"}, paths


def test_a_missing_step_model_refuses_the_run_before_anything_is_created(
    fake: FakeOllama, sample: Path
) -> None:
    path = taskfile(sample, STEPS)
    code, out, err = coder(sample, "run", "--autonomous", "-f", str(path))
    assert code == 3, out + err
    assert (
        f"model 'qwen2.5-coder:14b' is not available on {fake.url}, used as the model of step s2"
        in err
    )
    assert (
        f"model 'qwen2.5-coder:32b' is not available on {fake.url}, used as the "
        "fallback_model of steps s3, s4" in err
    )
    assert "(2 missing)" in err
    assert f"`OLLAMA_HOST={fake.url} ollama pull qwen2.5-coder:14b`" in err
    assert f"`OLLAMA_HOST={fake.url} ollama pull qwen2.5-coder:32b`" in err
    assert "Traceback" not in err
    nothing_created(sample, "models")
    loaded_nothing(fake)  # not even the run's own model: the check comes before warm-up
    assert not (sample / ".coder" / "locks" / "models.lock").exists()


def test_models_the_server_has_pass_the_check_by_the_names_ollama_resolves(
    sample: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`tiny` is `tiny:latest`, `library/big:14b` is `big:14b`: the run starts and each step
    goes to its own model."""
    models = {**DEFAULT_MODELS, "tiny:latest": TOOLS, "big:14b": TOOLS}
    with FakeOllama(models=models) as server:
        monkeypatch.setenv("OLLAMA_HOST", server.url)
        server.enqueue(done("looked"), done("looked again"))
        path = taskfile(
            sample,
            """
            id: fine
            title: t
            fallback_model: library/big:14b
            graph:
              - {id: s1, kind: analyze, goal: look, model: tiny}
              - {id: s2, kind: analyze, goal: look again, depends_on: [s1]}
            """,
        )
        code, out, err = coder(sample, "run", "--autonomous", "-f", str(path))
    assert code == 0, out + err
    chats = [b["model"] for b in server.chat_bodies() if b.get("messages")]
    assert chats[-2:] == ["tiny", MODEL]
    assert state_of(sample, "fine")["status"] == "success"


def test_a_named_model_missing_at_its_own_server(
    fake: FakeOllama, sample: Path, isolated_home: Path
) -> None:
    """A fallback_model naming a model on an OpenAI-compatible server that does not serve it:
    refused up front, naming the named model's field to fix."""
    with FakeOpenAI(models={"qwen-14b": {}}) as gpu:
        configure(
            isolated_home,
            models={"big": {"provider": "openai", "base_url": gpu.url, "model": "qwen-32b"}},
        )
        path = taskfile(
            sample,
            "id: named\ntitle: t\nfallback_model: big\npolicies: {retries: 2}\n"
            "graph:\n  - {id: s1, kind: edit, goal: g}\n",
        )
        code, out, err = coder(sample, "run", "--autonomous", "-f", str(path))
        assert code == 3, out + err
        assert (
            f"model 'qwen-32b' (named model big) is not served at {gpu.url} (it serves: "
            "qwen-14b), used as the fallback_model of step s1" in err
        )
        assert "models.big.model in coder.config.json" in err
        assert [r.path for r in gpu.requests] == ["/v1/models"]  # asked, nothing loaded
    nothing_created(sample, "named")
    loaded_nothing(fake)


@pytest.mark.parametrize("retries", [None, 0, 1])
def test_a_fallback_model_a_step_cannot_reach_is_not_required(
    fake: FakeOllama, sample: Path, retries: int | None
) -> None:
    """The fallback takes over at a step's third attempt: with fewer than 2 retries a step
    never gets there, so a missing fallback_model does not stop the run."""
    fake.enqueue(done("looked"))
    extra = "" if retries is None else f", retries: {retries}"
    path = taskfile(
        sample,
        f"""
        id: unreachable
        title: t
        fallback_model: "qwen2.5-coder:32b"
        graph:
          - {{id: s1, kind: analyze, goal: look{extra}}}
        """,
    )
    code, out, err = coder(sample, "run", "--autonomous", "-f", str(path))
    assert code == 0, out + err
    assert state_of(sample, "unreachable")["status"] == "success"


@pytest.mark.parametrize("retries", ["steps", "policies"])
def test_a_fallback_model_a_step_can_reach_is_required(
    fake: FakeOllama, sample: Path, retries: str
) -> None:
    """retries: 2 (the step's, or the task's policies.retries) reaches the third attempt."""
    own = ", retries: 2" if retries == "steps" else ""
    policies = "policies: {retries: 2}" if retries == "policies" else ""
    path = taskfile(
        sample,
        f"""
        id: reachable
        title: t
        fallback_model: "qwen2.5-coder:32b"
        {policies}
        graph:
          - {{id: s1, kind: analyze, goal: look, retries: 1}}
          - {{id: s2, kind: analyze, goal: look again{own}, depends_on: [s1]}}
        """,
    )
    code, out, err = coder(sample, "run", "--autonomous", "-f", str(path))
    assert code == 3, out + err
    assert (
        f"model 'qwen2.5-coder:32b' is not available on {fake.url}, used as the "
        "fallback_model of step s2" in err
    )
    assert "s1" not in err.split("used as")[1]  # s1 (retries: 1) cannot reach it
    nothing_created(sample, "reachable")
    loaded_nothing(fake)


def test_warm_up_loads_only_the_models_the_steps_start_with(
    sample: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The only model step names its own model: the run's default model (which Ollama would
    load, perhaps unloading the one needed) is neither warmed up nor primed nor asked about;
    the step's model is warmed up before the step's first call."""
    models = {**DEFAULT_MODELS, "tiny:latest": TOOLS}
    with FakeOllama(models=models) as server:
        monkeypatch.setenv("OLLAMA_HOST", server.url)
        server.enqueue(done("looked"))
        path = taskfile(
            sample,
            """
            id: own
            title: t
            graph:
              - {id: s0, kind: shell, cmd: "true"}
              - {id: s1, kind: analyze, goal: look, model: tiny, depends_on: [s0]}
            """,
        )
        code, out, err = coder(sample, "run", "--autonomous", "-f", str(path))
        assert code == 0, out + err
        named = [
            (r.path, (r.body or {}).get("model") or (r.body or {}).get("name"))
            for r in server.requests
            if isinstance(r.body, dict)
        ]
        assert not [n for n in named if n[1] == MODEL], named
        chats = [b for b in server.chat_bodies()]
        assert chats[0]["model"] == "tiny" and not chats[0].get("messages")  # the warm-up load
        assert all(b["model"] == "tiny" for b in chats)


def test_a_named_models_server_that_does_not_answer(
    fake: FakeOllama, sample: Path, isolated_home: Path
) -> None:
    dead = down_url() + "/v1"
    configure(isolated_home, models={"big": {"provider": "openai", "base_url": dead, "model": "q"}})
    path = taskfile(
        sample, "id: dead\ntitle: t\ngraph:\n  - {id: s1, kind: edit, goal: g, model: big}\n"
    )
    code, out, err = coder(sample, "run", "--autonomous", "-f", str(path))
    assert code == 3, out + err
    assert dead in err and "(used as the model of step s1)" in err
    assert "fix models.big.base_url in coder.config.json" in err
    nothing_created(sample, "dead")
    assert fake.requests == []  # no step uses the config's model: its server is not asked


def test_resume_checks_the_models_of_the_steps_still_to_run(
    sample: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A done step's model may be gone; a model of a step still to run may not."""
    models = {**DEFAULT_MODELS, "tiny:latest": TOOLS, "other:latest": TOOLS}
    with FakeOllama(models=models) as server:
        monkeypatch.setenv("OLLAMA_HOST", server.url)
        server.enqueue(done("looked"))
        path = taskfile(
            sample,
            """
            id: later
            title: t
            graph:
              - {id: s1, kind: analyze, goal: look, model: tiny}
              - {id: s2, kind: shell, cmd: "test -f go", depends_on: [s1]}
              - {id: s3, kind: analyze, goal: look again, model: other, depends_on: [s2]}
            """,
        )
        code, out, err = coder(sample, "run", "--autonomous", "-f", str(path))
        assert code == 1, out + err  # s2 failed; s3 never ran
        before = state_of(sample, "later")
        assert before["steps"]["s1"]["status"] == "success"
        (branch,) = git(
            sample, "branch", "--list", "--format=%(refname:short)", "agent/later*"
        ).split()
        tip = git(sample, "rev-parse", branch)
        del server.models["tiny:latest"], server.models["other:latest"]
        chats = len(server.chat_bodies())
        code, out, err = coder(sample, "resume", "-t", "later")
        assert code == 3, out + err
        assert "model 'other' is not available" in err and "the model of step s3" in err
        assert "tiny" not in err  # s1 is done: its model is not needed
        assert len(server.chat_bodies()) == chats  # nothing loaded
        after = state_of(sample, "later")
        assert after["steps"]["s3"]["status"] == "pending" and after["steps"]["s3"]["attempts"] == 0
        assert git(sample, "rev-parse", branch) == tip


def test_a_replay_asks_no_server_for_the_step_models(sample: Path, isolated_home: Path) -> None:
    """Under --replay the recording answers: a step model no server has is no reason to stop."""
    recording = sample.parent / "rec.json"
    reply = {
        "content": "",
        "tool_calls": [
            {"name": "step_complete", "arguments": {"summary": "ok", "files_changed": []}}
        ],
    }
    recording.write_text(json.dumps({"model": MODEL, "calls": [{"step": "s1", "reply": reply}]}))
    configure(isolated_home, ollama_host=down_url())
    path = taskfile(
        sample, "id: rep\ntitle: t\ngraph:\n  - {id: s1, kind: analyze, goal: g, model: nowhere}\n"
    )
    code, out, err = coder(
        sample, "run", "--autonomous", "--replay", str(recording), "-f", str(path)
    )
    assert code == 0, out + err
