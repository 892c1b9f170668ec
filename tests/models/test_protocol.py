"""`tool_protocol: auto` decides from the server's evidence (the fake servers over HTTP): Ollama's
capabilities, llama.cpp's /apply-template, the one-token probe; the decision is remembered;
`coder doctor` says which protocol each model uses and why, `coder run --dry-run` what it knows
without asking a server."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from coder.config import Config, as_config
from coder.models import protocol
from coder.models.factory import make_provider
from tests.conftest import coder
from tests.fake_ollama import FakeOllama, Reply
from tests.fake_openai import FakeOpenAI
from tests.helpers import taskfile

SMALL = {"smollm2": {"context_length": 8192, "capabilities": ["tools"], "template_tools": False}}
TASK = "id: t\ntitle: t\ngraph:\n  - {kind: edit, goal: do it}\n"


def settings(**values: Any) -> Config:
    return as_config({"tool_protocol": "auto", **values})


def decided(cfg: Config, tmp_path: Path) -> protocol.Choice:
    provider = make_provider(cfg, str(cfg.base_url or cfg.ollama_host), str(cfg.model))
    try:
        facts = provider.probe()
    finally:
        provider.close()
    path = tmp_path / protocol.CACHE_FILE
    return protocol.decide(cfg, str(cfg.model), facts, protocol.Remembered(path))


def test_ollama_capabilities_decide(tmp_path: Path) -> None:
    models = {
        "coder:7b": {"capabilities": ["completion", "tools"]},
        "base:1b": {"capabilities": ["completion", "insert"]},
    }
    with FakeOllama(models=models) as fake:
        native = decided(settings(ollama_host=fake.url, model="coder:7b"), tmp_path)
        text = decided(settings(ollama_host=fake.url, model="base:1b"), tmp_path)
    assert native == protocol.Choice(
        "native", "the server lists tools among the model's capabilities"
    )
    assert text == protocol.Choice(
        "text", "the model's capabilities (completion, insert) do not include tools"
    )
    remembered = json.loads((tmp_path / protocol.CACHE_FILE).read_text())
    assert remembered[f"ollama {fake.url} base:1b"]["protocol"] == "text"


def test_apply_template_shows_whether_the_tools_reach_the_prompt(tmp_path: Path) -> None:
    with FakeOpenAI() as fake:  # a tool-aware template
        native = decided(
            settings(provider="openai", base_url=fake.url, model="qwen2.5-coder-7b-instruct"),
            tmp_path,
        )
        templates = [r.body for r in fake.requests if r.path == "/apply-template"]
    assert native.protocol == "native" and "/apply-template" in native.reason
    assert [bool(b.get("tools")) for b in templates] == [False, True]
    assert fake.chat_bodies() == []  # nothing generated
    with FakeOpenAI(models=SMALL) as fake:
        text = decided(settings(provider="openai", base_url=fake.url, model="smollm2"), tmp_path)
    assert text.protocol == "text" and "renders the same prompt" in text.reason
    no_jinja = {"old": {"capabilities": []}}  # llama.cpp without --jinja refuses tools
    with FakeOpenAI(models=no_jinja) as fake:
        refused = decided(settings(provider="openai", base_url=fake.url, model="old"), tmp_path)
    assert refused == protocol.Choice(
        "text", "the server refuses tools (/apply-template: tools param requires --jinja flag)"
    )


def test_elsewhere_a_one_token_probe_counts_the_prompt(tmp_path: Path) -> None:
    for models, expected in ((SMALL, "text"), (None, "native")):
        with FakeOpenAI(models=models, templates=False) as fake:  # as vLLM: no /apply-template
            fake.enqueue("a", "b")
            model = next(iter(fake.models))
            cfg = settings(provider="openai", base_url=fake.url, model=model)
            choice = decided(cfg, tmp_path / expected)
            probes = fake.chat_bodies()
        assert choice.protocol == expected, choice
        assert [p["max_tokens"] for p in probes] == [1, 1] and "tools" in probes[1]
    assert "tokens with a tool" in choice.reason


def test_a_server_refusing_tools_in_the_probe_means_text(tmp_path: Path) -> None:
    with FakeOpenAI(models={"plain": {"capabilities": []}}, templates=False) as fake:
        fake.enqueue("a")  # the plain probe; the one with a tool is refused (vLLM's 400)
        choice = decided(settings(provider="openai", base_url=fake.url, model="plain"), tmp_path)
    assert choice.protocol == "text" and "--enable-auto-tool-choice" in choice.reason


def test_no_evidence_is_native_unproven_and_not_remembered(tmp_path: Path) -> None:
    with FakeOpenAI(templates=False) as fake:
        fake.enqueue(Reply(http_status=400, error="nope"))
        cfg = settings(provider="openai", base_url=fake.url, model="qwen2.5-coder-7b-instruct")
        choice = decided(cfg, tmp_path)
    assert choice.protocol == "native" and not choice.proven
    assert not (tmp_path / protocol.CACHE_FILE).exists()


def test_a_remembered_choice_asks_nothing_and_the_setting_wins(tmp_path: Path) -> None:
    with FakeOpenAI(models=SMALL) as fake:
        cfg = settings(provider="openai", base_url=fake.url, model="smollm2")
        decided(cfg, tmp_path)
        before = len(fake.requests)
        again = decided(cfg, tmp_path)
        assert len(fake.requests) == before + 2  # the probe of the facts (/v1/models, /props)
        assert again.reason.startswith("remembered: the chat template drops the tools")
        assert (
            decided(
                settings(
                    provider="openai", base_url=fake.url, model="smollm2", tool_protocol="native"
                ),
                tmp_path,
            ).protocol
            == "native"
        )


def test_doctor_says_which_protocol_and_why(sample: Path, isolated_home: Path) -> None:
    with FakeOpenAI(models=SMALL) as fake:
        (sample / "coder.config.json").write_text(
            json.dumps({"provider": "openai", "base_url": fake.url, "model": "smollm2"})
        )
        code, out, _ = coder(sample, "doctor")
        found = {c["name"]: c for c in json.loads(coder(sample, "doctor", "--json")[1])["checks"]}
    assert found["tool protocol"]["status"] == "ok"
    assert found["tool protocol"]["detail"].startswith(
        "text: the tools are described in the system prompt (the chat template drops the tools"
    )
    assert "tool protocol     text: the tools are described" in out
    # doctor remembers nothing (its test probe makes `.coder/worktrees/`, and removes its own)
    assert not (sample / ".coder" / "cache" / "tool-protocols.json").exists()


def test_doctor_fails_native_set_for_a_model_without_tools(sample: Path) -> None:
    models = {
        "base:1b": {"capabilities": ["completion"]},
        "coder:7b": {"capabilities": ["completion", "tools"]},
    }
    with FakeOllama(models=models) as fake:
        (sample / "coder.config.json").write_text(
            json.dumps(
                {
                    "ollama_host": fake.url,
                    "model": "base:1b",
                    "tool_protocol": "native",
                    "models": {"big": {"model": "coder:7b", "tool_protocol": "text"}},
                }
            )
        )
        code, out, _ = coder(sample, "doctor", "--json")
    found = {c["name"]: c for c in json.loads(out)["checks"]}
    assert code == 3
    assert found["tool protocol"]["status"] == "fail"
    assert "its requests would be refused" in found["tool protocol"]["detail"]
    assert '"tool_protocol": "auto"' in found["tool protocol"]["fix"]
    big = found["tool protocol (big)"]  # a named model's own setting
    assert big["status"] == "ok" and "tool_protocol: text (from project file" in big["detail"]


def test_dry_run_shows_what_it_knows_without_asking(sample: Path) -> None:
    path = taskfile(sample, TASK)
    with FakeOllama() as fake:
        config = sample / "coder.config.json"
        config.write_text(json.dumps({"ollama_host": fake.url}))
        out = coder(sample, "run", "--dry-run", "-f", str(path))[1]
        assert "  tools     auto: decided when the run starts" in out
        config.write_text(json.dumps({"ollama_host": fake.url, "tool_protocol": "text"}))
        plan = json.loads(coder(sample, "run", "--dry-run", "--json", "-f", str(path))[1])
        assert [r.path for r in fake.requests] == []  # a dry run asks no server
    assert plan["model"]["tool_protocol"] == "text"
    assert plan["model"]["tool_protocol_reason"].startswith("tool_protocol: text (from project")
    remembered = sample / ".coder" / "cache" / protocol.CACHE_FILE
    remembered.parent.mkdir(parents=True)
    key = f"ollama {fake.url} qwen2.5-coder:7b"
    remembered.write_text(json.dumps({key: {"protocol": "text", "reason": "no tools"}}))
    config.write_text(json.dumps({"ollama_host": fake.url}))
    out = coder(sample, "run", "--dry-run", "-f", str(path))[1]
    assert "  tools     text: remembered: no tools" in out


def test_a_bad_setting_is_named_with_its_place(sample: Path) -> None:
    (sample / "coder.config.json").write_text(
        json.dumps({"models": {"a": {"model": "x", "tool_protocol": "maybe"}}})
    )
    code, _, err = coder(sample, "doctor")
    assert code == 2
    assert "coder.config.json:1:50: models.a.tool_protocol: 'maybe' is not one of" in err
    assert "['native', 'text', 'auto']" in err and "Traceback" not in err
