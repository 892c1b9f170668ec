"""The one door to a model (coder.models.redacting): every chat, warm prefix and embedding
request that open_models / open_embedder make is redacted right before the provider, through
the real ollama client against the fake server; redaction is deterministic (the prefix stays
byte-identical) and a secret registered mid-run is redacted from then on."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from coder import config as config_mod
from coder.models.factory import open_embedder, open_models
from coder.redact import Redactor
from tests.fake_ollama import DEFAULT_MODELS, FakeOllama, Reply

KNOWN = "plain-looking-Val42ue"  # a passed-through value: no key format finds it
LATER = "found-later-Qx93zz"
TOKEN = "ghp_" + "a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7R8"


def _config(tmp_path: Path, url: str, **extra: object) -> config_mod.Config:
    path = tmp_path / "coder.json"
    path.write_text(json.dumps({"ollama_host": url, **extra}))
    return config_mod.load(tmp_path, env={"CODER_CONFIG": str(path)})


def test_every_request_passes_the_redactor(tmp_path: Path) -> None:
    redactor = Redactor([KNOWN])
    with FakeOllama() as server:
        models = open_models(_config(tmp_path, server.url), redactor=redactor)
        system = {"role": "system", "content": f"rules; the map lists docs/{KNOWN}.md"}
        tools = [
            {
                "type": "function",
                "function": {
                    "name": "ext__deploy",
                    "description": f"deploys with {TOKEN}",
                    "parameters": {"type": "object", "properties": {}},
                },
            }
        ]
        models.prime([system], tools)
        server.enqueue(Reply(content="ok"), Reply(content="ok"), Reply(content="ok"))
        provider = models.for_step("s1")
        first = {"role": "user", "content": f"Step s1: likely relevant code:\n- {KNOWN}.txt:1-3"}
        call = {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"function": {"name": "fs_read", "arguments": {"path": KNOWN}}}],
        }
        provider.chat([system, first], tools=tools)
        provider.chat([system, first, call], tools=tools)
        redactor.add(LATER)  # a `.env` file the model read deeper down
        provider.chat([system, first, call, {"role": "tool", "content": LATER}], tools=tools)
        provider.close()
        models.close()
        bodies = [r.body for r in server.requests if r.path == "/api/chat" and r.body]
    sent = json.dumps(bodies)
    assert KNOWN not in sent and TOKEN not in sent and LATER not in sent
    assert "[REDACTED:known_secret]" in sent and "[REDACTED:github_token]" in sent
    chats = [b for b in bodies if b.get("messages")]
    assert len(chats) == 4  # the warm prefix and the three turns
    # the same prefix, byte for byte, in every request (the server's cache stays warm)
    prefixes = {json.dumps([b["messages"][0], b["tools"]]) for b in chats}
    assert len(prefixes) == 1
    assert chats[2]["messages"][:2] == chats[1]["messages"][:2]


def test_embedding_texts_pass_the_redactor(tmp_path: Path) -> None:
    models = {**DEFAULT_MODELS, "nomic-embed-text:latest": {"capabilities": ["embedding"]}}
    with FakeOllama(models=models) as server:
        cfg = _config(tmp_path, server.url, embedding_model="nomic-embed-text")
        embed = open_embedder(cfg, redactor=Redactor([KNOWN]))
        assert embed is not None
        assert len(embed([f"def f(): return '{KNOWN}'", f"key {TOKEN}"])) == 2
        sent = json.dumps([r.body for r in server.requests if r.path == "/api/embed"])
    assert sent.count("[REDACTED") == 2 and KNOWN not in sent and TOKEN not in sent


def test_a_plan_passes_the_redactor_too(
    tmp_path: Path, make_repo, monkeypatch: pytest.MonkeyPatch
) -> None:
    from coder.errors import PlanFailed
    from coder.plan.planner import PlanOptions, plan
    from coder.plan.spec import Spec

    repo = make_repo({"README.md": "# r\n", ".env": f"DEPLOY_TOKEN={KNOWN}\n"})
    with FakeOllama() as server:
        monkeypatch.setenv("OLLAMA_HOST", server.url)
        server.enqueue(Reply(content="{}"), Reply(content="{}"), Reply(content="{}"))
        with pytest.raises(PlanFailed):  # the drafts are no taskfile: what was sent matters
            plan(
                Spec(text=f"rotate the deploy token {KNOWN} and {TOKEN}", source="prompt"),
                cwd=repo,
                options=PlanOptions(dry_run=True),
            )
        sent = json.dumps(server.chat_bodies())
    assert "rotate the deploy token" in sent
    assert KNOWN not in sent and TOKEN not in sent
