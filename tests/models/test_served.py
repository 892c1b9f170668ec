"""`require_served`: each model a run's steps can use, asked for at its server through the real
clients (`list_models`: Ollama's /api/tags, an OpenAI-compatible /v1/models), loading none.
The run-level journeys (nothing created, resume, replay) are in tests/run/test_models_checked.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from coder import config as config_mod
from coder.errors import HostUnreachable, ModelMissing
from coder.models.factory import make_provider
from coder.models.served import place_hint, require_served
from tests.fake_ollama import DEFAULT_MODELS, FakeOllama, down_url
from tests.fake_openai import MODEL, FakeOpenAI


def load(tmp_path: Path, **values: object) -> config_mod.Config:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(values))
    return config_mod.load(tmp_path, env={"CODER_CONFIG": str(path)})


def test_the_openai_provider_lists_what_the_server_serves(tmp_path: Path) -> None:
    with FakeOpenAI(models={MODEL: {}, "qwen-32b": {}}) as server:
        cfg = load(tmp_path, provider="openai", base_url=server.url)
        provider = make_provider(cfg, server.url)
        try:
            assert sorted(provider.list_models()) == sorted([MODEL, "qwen-32b"])
        finally:
            provider.close()
        assert [r.path for r in server.requests] == ["/v1/models"]


def test_each_endpoint_of_a_server_is_asked_and_a_refusing_one_is_left_out(
    tmp_path: Path,
) -> None:
    dead = down_url()
    with FakeOllama() as has, FakeOllama(models={"other:1b": {}}) as lacks:
        uses = {"qwen2.5-coder": {"model": ["s1"]}}  # :latest, which neither has
        has.models["qwen2.5-coder:latest"] = {}
        require_served(load(tmp_path, base_url=[dead, has.url]), uses)  # one answers: enough
        with pytest.raises(ModelMissing) as missing:
            require_served(load(tmp_path, base_url=[has.url, lacks.url]), uses)
        assert missing.value.message == (
            f"model 'qwen2.5-coder' is not available on {lacks.url}, used as the model of step s1"
        )
        assert missing.value.hint == f"run `OLLAMA_HOST={lacks.url} ollama pull qwen2.5-coder`"
        for server in (has, lacks):
            assert {r.path for r in server.requests} == {"/api/tags"}
    with pytest.raises(HostUnreachable, match=r"\(used as the model of step s1\)$"):
        require_served(load(tmp_path, base_url=[dead]), uses)


def test_an_ollama_without_models_lacks_them_and_a_silent_openai_server_is_trusted(
    tmp_path: Path,
) -> None:
    uses = {"m": {"model": ["s1"]}}
    with FakeOllama(models={}) as empty:
        with pytest.raises(ModelMissing, match="model 'm' is not available"):
            require_served(load(tmp_path, base_url=empty.url), uses)
    with FakeOpenAI(models={}) as silent:  # lists nothing: it does not say, as at warm-up
        require_served(load(tmp_path, provider="openai", base_url=silent.url), uses)


def test_a_model_used_twice_is_named_once_with_each_use(tmp_path: Path) -> None:
    with FakeOllama(models=DEFAULT_MODELS) as server:
        cfg = load(tmp_path, base_url=server.url)
        uses = {"big:14b": {"model": ["s2"], "fallback_model": ["s1", "s3"]}}
        with pytest.raises(ModelMissing) as missing:
            require_served(cfg, uses)
    assert missing.value.message.endswith(
        "used as the model of step s2 and the fallback_model of steps s1, s3"
    )
    many = {"big:14b": {"model": [f"s{i}" for i in range(1, 10)]}}
    with pytest.raises(HostUnreachable) as down:
        require_served(load(tmp_path, base_url=down_url()), many)
    assert down.value.message.endswith("steps s1, s2, s3, s4, s5, s6 and 3 more)")


def test_a_hint_names_the_named_models_own_fields(tmp_path: Path) -> None:
    cfg = load(
        tmp_path,
        models={
            "big": {"provider": "openai", "base_url": "http://gpu:8000/v1", "model": "q"},
            "local": {"provider": "ollama", "model": "q"},
            "small": {"model": "q:1b"},
        },
    )
    openai_hint = "start the server (...) or fix base_url in coder.config.json"
    assert place_hint(cfg, "big", openai_hint).endswith(
        "fix models.big.base_url in coder.config.json"
    )
    assert place_hint(cfg, "big", "set api_key_env in coder.config.json to ...") == (
        "set models.big.api_key_env in coder.config.json to ..."
    )
    ollama_hint = (
        "start it with `ollama serve` or set OLLAMA_HOST / ollama_host in coder.config.json"
    )
    assert place_hint(cfg, "local", ollama_hint) == (
        "start it with `ollama serve` or set models.local.base_url in coder.config.json"
    )
    # on the config's own server: its server fields are the config's, its model is its own
    assert place_hint(cfg, "small", openai_hint) == openai_hint
    assert place_hint(cfg, "small", "set model in coder.config.json") == (
        "set models.small.model in coder.config.json"
    )
    assert place_hint(cfg, None, openai_hint) == openai_hint
    assert place_hint(cfg, "qwen-7b", openai_hint) == openai_hint  # not a named model
