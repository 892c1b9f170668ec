"""`coder run`, `coder plan` and `coder doctor` against OpenAI-compatible servers (the fake,
through the real `openai` SDK): the same journeys as with Ollama, the server's cache figures in
the summary, `show` and `--json`, and a run that goes on when its endpoint dies."""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.agent.test_agent_run import FEATURE, feature_script
from tests.conftest import coder, git
from tests.fake_ollama import FakeOllama, Reply, down_url
from tests.fake_openai import MODEL, FakeOpenAI
from tests.helpers import call, done, state_of, taskfile
from tests.plan.test_plan import PROMPT, answer, plan_doc
from tests.prefix_cache import is_priming


def configure(home: Path, base_url: str | list[str], **extra: Any) -> None:
    path = home / ".config" / "coder" / "config.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        json.dumps({"provider": "openai", "base_url": base_url, "model": MODEL, **extra})
    )


@pytest.fixture
def server(isolated_home: Path) -> Iterator[FakeOpenAI]:
    with FakeOpenAI() as fake:
        configure(isolated_home, fake.url)
        yield fake


def events(repo: Path, task_id: str) -> list[dict[str, Any]]:
    log = repo / ".coder" / "logs" / f"{task_id}.jsonl"
    return [json.loads(line) for line in log.read_text().splitlines() if line]


def test_a_run_with_the_servers_cache_figures(server: FakeOpenAI, sample: Path) -> None:
    server.enqueue(*feature_script())
    code, out, err = coder(sample, "run", "--autonomous", "-f", str(taskfile(sample, FEATURE)))
    assert code == 0, out + err
    assert server.pending == 0
    assert git(sample, "show", "agent/mul-add-multiply-to-calc:calc.py").count("def multiply") == 1
    state = state_of(sample, "mul")
    usage = [state["steps"][s]["usage"] for s in ("s1", "s2", "s4")]
    primed, *steps = server.cache.cached  # the warm prefix came first, then 6 step calls
    prompts = server.cache.prompt[1:]
    assert primed == 0 and steps[0] > 0  # so the first step's first call found it cached
    assert [u["cached_tokens"] for u in usage] == [
        sum(steps[0:2]),
        sum(steps[2:4]),
        sum(steps[4:6]),
    ]
    assert all(u["cache_reports"] == 2 for u in usage)
    share = sum(steps) / sum(prompts)
    assert f"{share:.0%} of prompt tokens from the server's cache ({sum(steps)} tokens)" in out
    shown = json.loads(coder(sample, "show", "-t", "mul", "--json")[1])
    assert shown["usage"]["cache_share"] == pytest.approx(share)
    assert shown["usage"]["cached_tokens"] == sum(steps)
    assert "of prompt tokens from the server's cache" in coder(sample, "show", "-t", "mul")[1]


def test_the_warm_prefix_is_taken_in_while_the_run_does_other_work(
    server: FakeOpenAI, sample: Path
) -> None:
    """The warm prefix goes out as the run opens and only the first model request waits for
    it: a shell step before the first model step runs meanwhile, and that request finds the
    prefix in the server's cache."""
    slow = 3.0
    server.priming = Reply(content="ok", delay_s=slow)
    asked: list[float] = []
    server.answer = lambda body: asked.append(time.time()) or None  # then the script answers
    server.enqueue(done("nothing to find"))
    task = """
        id: warm
        title: A shell step, then a model step
        graph:
          - {id: s1, kind: shell, cmd: "echo hello"}
          - {id: s2, kind: analyze, goal: Find where the operations live, depends_on: [s1]}
    """
    code, out, err = coder(sample, "run", "--autonomous", "-f", str(taskfile(sample, task)))
    assert code == 0, out + err
    log = {(e["event"], e.get("step_id")): at(e) for e in events(sample, "warm")}
    # the shell step ran while the prefix was on its way; the model step's request waited
    assert asked[0] - log[("step.started", "s1")] > slow / 2
    primed, first, *_ = server.cache.cached
    assert primed == 0 and first > 0


def at(event: dict[str, Any]) -> float:
    from datetime import datetime

    return datetime.fromisoformat(event["timestamp"].replace("Z", "+00:00")).timestamp()


def test_tool_results_name_their_call(server: FakeOpenAI, sample: Path) -> None:
    server.enqueue(call("fs_write", path="y.txt", content="y\n"), done("wrote y", "y.txt"))
    path = taskfile(sample, "id: ids\ntitle: t\ngraph:\n  - {kind: edit, goal: write y}\n")
    assert coder(sample, "run", "--autonomous", "-f", str(path))[0] == 0
    second = server.chat_bodies()[1]["messages"]
    assistant, result = second[-2], second[-1]
    assert result["role"] == "tool" and result["tool_call_id"] == assistant["tool_calls"][0]["id"]
    assert assistant["tool_calls"][0]["id"].startswith("call_")  # the server's id, kept


def test_code_search_ranks_with_the_servers_embeddings(
    server: FakeOpenAI, sample: Path, isolated_home: Path
) -> None:
    embedder = "nomic-embed-text-v1.5"
    server.models[embedder] = {"capabilities": ["embedding"]}
    configure(isolated_home, server.url, embedding_model=embedder)
    server.enqueue(call("code_search", query="add two numbers"), done("add is in calc.py"))
    path = taskfile(sample, "id: emb\ntitle: t\ngraph:\n  - {kind: analyze, goal: find add}\n")
    code, out, err = coder(sample, "run", "--autonomous", "-f", str(path))
    assert code == 0, out + err
    embedded = [r.body for r in server.requests if r.path == "/v1/embeddings"]
    assert embedded and all(b["model"] == embedder for b in embedded)
    assert embedded[-1]["input"] == ["add two numbers"]
    result = server.chat_bodies()[1]["messages"][-1]
    assert result["role"] == "tool" and result["content"].startswith("calc.py:")
    assert "embeddings unavailable" not in result["content"]


def test_named_models_on_another_server_for_a_step_and_for_escalation(
    server: FakeOpenAI, sample: Path, isolated_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`model: big` sends a step to the named model's own server (its provider, URL and
    API key); `fallback_model: big` moves a failing step there from its third attempt; the
    named model's key is redacted like the config's."""
    key = "bigbox-passphrase-one"
    monkeypatch.setenv("BIGBOX", key)  # a name that does not look secret
    with FakeOpenAI(models={"qwen-32b": {"capabilities": ["tools"]}}) as gpu:
        big = {"provider": "openai", "base_url": gpu.url, "model": "qwen-32b"}
        configure(isolated_home, server.url, models={"big": {**big, "api_key_env": "BIGBOX"}})
        gpu.enqueue(done("looked on the big one"), done(f"fixed, the key is {key}"))
        prose = "I am not sure what to do here."
        server.enqueue(prose, prose, prose, prose)
        path = taskfile(
            sample,
            """
            id: named
            title: t
            graph:
              - {id: s1, kind: analyze, goal: look, model: big}
              - {id: s2, kind: analyze, goal: look again, fallback_model: big, retries: 2,
                 depends_on: [s1]}
            """,
        )
        code, out, err = coder(sample, "run", "--autonomous", "-f", str(path))
        assert code == 0, out + err
        assert server.pending == 0 and gpu.pending == 0
        at_gpu = [r for r in gpu.requests if r.path == "/v1/chat/completions"]
        primed, chats = at_gpu[:1], at_gpu[1:]  # s1 runs first on big: the warm prefix goes there
        assert len(gpu.chat_bodies()) == 2 and is_priming(primed[0].body)
        assert [r.body["model"] for r in chats] == ["qwen-32b", "qwen-32b"]
        assert all(r.headers.get("authorization") == f"Bearer {key}" for r in at_gpu)
        assert not [r for r in server.requests if is_priming(r.body or {})]
        assert {b["model"] for b in server.chat_bodies()} == {MODEL}
        assert len(server.chat_bodies()) == 4  # s2's two attempts on the default model
    state = state_of(sample, "named")
    assert any("uses fallback_model big" in r for r in state["steps"]["s2"]["reasons"])
    log = (sample / ".coder" / "logs" / "named.jsonl").read_text()
    assert key not in log and key not in json.dumps(state) and "fixed, the key is" in log


def test_a_plan(server: FakeOpenAI, sample: Path) -> None:
    server.enqueue(answer(plan_doc()))
    code, out, err = coder(sample, "plan", PROMPT)
    assert code == 0, out + err
    assert (sample / "tasks" / "add-multiply.yaml").is_file()
    assert f"Planning with {MODEL} at {server.url}" in err + out
    fmt = server.chat_bodies()[0]["response_format"]
    assert fmt["type"] == "json_schema" and fmt["json_schema"]["schema"]["type"] == "object"


def test_a_missing_model_and_an_unreachable_server_exit_3(
    server: FakeOpenAI, sample: Path, isolated_home: Path
) -> None:
    path = taskfile(sample, "title: t\nmodel: llama9-70b\ngraph:\n  - {kind: edit, goal: g}\n")
    code, _, err = coder(sample, "run", "--autonomous", "-f", str(path))
    assert code == 3 and f"model 'llama9-70b' is not served at {server.url}" in err
    url = down_url() + "/v1"
    configure(isolated_home, url)
    code, _, err = coder(
        sample,
        "run",
        "--autonomous",
        "-f",
        str(taskfile(sample, "title: t\ngraph:\n  - {kind: edit, goal: g}\n")),
    )
    assert code == 3 and url in err
    assert not list((sample / ".coder" / "tasks").glob("*"))  # nothing was started


def test_the_run_goes_on_when_its_endpoint_dies(sample: Path, isolated_home: Path) -> None:
    """Two endpoints; the step's endpoint is killed after its first reply: the step's next
    call goes to the other endpoint, with the whole conversation, and the run ends green."""
    with FakeOpenAI() as first, FakeOpenAI() as second:
        configure(isolated_home, [first.url, second.url])
        first.enqueue(call("fs_write", path="y.txt", content="y\n"))
        second.enqueue(done("wrote y", "y.txt"))

        def kill_first_after_its_reply() -> None:
            deadline = time.monotonic() + 60
            while len(first.cache.cached) < 2 and time.monotonic() < deadline:  # prime + 1
                time.sleep(0.01)
            time.sleep(0.05)  # let the reply finish
            first.stop()

        killer = threading.Thread(target=kill_first_after_its_reply)
        killer.start()
        path = taskfile(sample, "id: fo\ntitle: t\ngraph:\n  - {kind: edit, goal: write y}\n")
        try:
            code, out, err = coder(sample, "run", "--autonomous", "-f", str(path))
        finally:
            killer.join()
        assert code == 0, out + err
        assert second.pending == 0
        moved = second.chat_bodies()[0]["messages"]
        assert moved[-1]["role"] == "tool" and "y.txt" in json.dumps(moved[-2])
    down = [e for e in events(sample, "fo") if e["event"] == "model.endpoint_down"]
    assert (
        len(down) == 1
        and down[0]["endpoint"] == first.url
        and down[0]["next_endpoint"] == second.url
    )
    assert down[0]["level"] == "warning"


def test_doctor_checks_each_endpoint(sample: Path, isolated_home: Path) -> None:
    dead = down_url() + "/v1"
    with FakeOpenAI() as fake:
        configure(isolated_home, [fake.url, dead])
        code, out, _ = coder(sample, "doctor", "--json")
    found = {c["name"]: c for c in json.loads(out)["checks"]}
    assert code == 0  # runs fail over to the endpoint that answers: not a failure
    assert found[f"model server ({fake.url})"]["status"] == "ok"
    assert found[f"model ({fake.url})"]["status"] == "ok"
    assert found[f"context window ({fake.url})"]["detail"].startswith("num_ctx 32768")
    protocol = found[f"tool protocol ({fake.url})"]
    assert protocol["status"] == "ok"  # llama.cpp's /apply-template shows the tools arrive
    assert protocol["detail"] == (
        "native: the chat template puts the tools into the prompt (/apply-template)"
    )
    dead_check = found[f"model server ({dead})"]
    assert dead_check["status"] == "warn" and dead in dead_check["detail"]
    assert dead_check["detail"].endswith("; runs use the other endpoints")
    # the fix names where base_url is set: the user config, not the project's file
    config = isolated_home / ".config" / "coder" / "config.json"
    assert f"fix base_url in {config}" in dead_check["fix"]
    with FakeOpenAI():  # every endpoint down: a failure again
        configure(isolated_home, [dead, down_url() + "/v1"])
        code, out, _ = coder(sample, "doctor", "--json")
    assert code == 3
    assert {
        c["status"] for c in json.loads(out)["checks"] if c["name"].startswith("model server")
    } == {"fail"}


def test_doctor_checks_the_embedding_model_and_names_an_unset_key(
    sample: Path, isolated_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with FakeOpenAI() as fake:
        fake.models["nomic-embed-text-v1.5"] = {"capabilities": ["embedding"]}
        configure(isolated_home, fake.url, embedding_model="nomic-embed-text-v1.5")
        found = {c["name"]: c for c in json.loads(coder(sample, "doctor", "--json")[1])["checks"]}
        assert found["embedding model"]["status"] == "ok"
        assert found["embedding model"]["detail"] == (
            "nomic-embed-text-v1.5 embeds (16 dimensions); code_search is hybrid"
        )
        assert found["context window"]["detail"].startswith(
            "num_ctx 32768 (as the server reports it)"
        )
        configure(isolated_home, fake.url, embedding_model=MODEL)  # a chat model
        found = {c["name"]: c for c in json.loads(coder(sample, "doctor", "--json")[1])["checks"]}
        assert found["embedding model"]["status"] == "warn"
        assert "code_search ranks by BM25 alone" in found["embedding model"]["detail"]
        assert "--embeddings" in found["embedding model"]["fix"]
        monkeypatch.delenv("CODER_TEST_KEY", raising=False)
        configure(isolated_home, fake.url, api_key_env="CODER_TEST_KEY")
        code, out, err = coder(sample, "doctor", "--json")
    assert code == 3 and "Traceback" not in err
    found = {c["name"]: c for c in json.loads(out)["checks"]}
    assert found["model server"]["status"] == "fail"
    assert found["model server"]["detail"] == "api_key_env names CODER_TEST_KEY, which is not set"
    assert "export CODER_TEST_KEY=" in found["model server"]["fix"]


def test_doctor_checks_each_named_model_at_its_server(sample: Path, isolated_home: Path) -> None:
    dead = down_url() + "/v1"
    with FakeOpenAI() as fake, FakeOllama() as local:
        local_embedder = {"provider": "ollama", "base_url": local.url, "model": "qwen2.5-coder:7b"}
        named = {
            "big": {"provider": "openai", "base_url": dead, "model": "qwen-32b"},
            "same": {"model": MODEL},  # another model on the config's server
            "embedder": local_embedder,  # checked as the embedding model, not for tools
        }
        configure(isolated_home, fake.url, models=named, embedding_model="embedder")
        code, out, _ = coder(sample, "doctor", "--json")
    found = {c["name"]: c for c in json.loads(out)["checks"]}
    assert code == 3
    assert found["model server"]["status"] == "ok" and found["model"]["status"] == "ok"
    assert found["model server (big)"]["status"] == "fail"
    assert dead in found["model server (big)"]["detail"]
    assert found["model server (big)"]["fix"].endswith(
        "fix models.big.base_url in coder.config.json"
    )  # the named model's own field, not the config's base_url
    assert found["model (same)"]["status"] == "ok"
    assert not any("embedder" in name for name in found)
    assert found["embedding model"]["status"] == "ok"
    assert found["embedding model"]["detail"].startswith("qwen2.5-coder:7b embeds (16 dim")


def test_summaries_when_the_context_folds_keep_the_conversation_valid(
    isolated_home: Path, make_repo
) -> None:
    """Summaries on an OpenAI-compatible server: every request stays well formed (each tool
    result answers a call of the assistant message before it; no two user or assistant
    messages in a row) and the facts of the summarised turns reach the last request."""
    from coder.agent import summarize
    from tests.agent.test_agent_budgets import FACT, FACTS, PAGE, PAGES
    from tests.helpers import quoting_summaries

    lines = [f"line {i}: " + "lorem ipsum dolor sit amet " * 3 for i in range(PAGE * PAGES)]
    for i in FACTS:
        lines[i] = f"FACT {i}: value{i}"
    repo = make_repo({"big.txt": "\n".join(lines) + "\n", "README.md": "# r\n"})
    with FakeOpenAI(models={MODEL: {"context_length": 8192, "capabilities": ["tools"]}}) as fake:
        configure(isolated_home, fake.url)
        fake.answer = quoting_summaries(FACT)
        pages = [
            call("fs_read", path="big.txt", offset=1 + PAGE * i, limit=PAGE) for i in range(PAGES)
        ]
        fake.enqueue(*pages, done("read the file in pages"))
        path = taskfile(repo, "id: oai\ntitle: t\ngraph:\n  - {kind: analyze, goal: read it}\n")
        code, out, err = coder(repo, "run", "--autonomous", "-f", str(path))
        assert code == 0, out + err
        requests = fake.chat_bodies()
    assert any(r["messages"][-1]["content"] == summarize.PROMPT for r in requests)
    for body in requests:
        messages = body["messages"]
        roles = [m["role"] for m in messages]
        assert not any(a == b != "tool" for a, b in zip(roles, roles[1:])), roles
        for before, message in zip(messages, messages[1:]):
            if message["role"] == "tool" and before["role"] == "assistant":
                assert message["tool_call_id"] in {c["id"] for c in before["tool_calls"]}
    last = "\n".join(str(m.get("content") or "") for m in requests[-1]["messages"])
    assert re.findall(FACT, last) == [f"FACT {i}: value{i}" for i in FACTS]
