"""Named models (config `models`): a step's model, a fallback_model or the embedding_model may
name a model on its own server (provider, endpoints, API key). Resolution and routing here;
the end-to-end runs against two fake servers are in test_openai_run.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from coder import config as config_mod
from coder.models.factory import model_config, open_models
from coder.models.redacting import RedactedModels
from coder.models.router import ModelSet
from coder.redact import Redactor

BIG = {"provider": "openai", "base_url": "http://127.0.0.1:8000/v1", "model": "qwen-32b"}


def load(tmp_path: Path, **values: object) -> config_mod.Config:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(values))
    return config_mod.load(tmp_path, env={"CODER_CONFIG": str(path)})


def test_a_named_model_on_its_own_server_takes_nothing_of_the_configs(tmp_path: Path) -> None:
    cfg = load(
        tmp_path,
        provider="openai",
        base_url="http://127.0.0.1:8080/v1",
        api_key_env="MAIN_KEY",
        num_ctx=8192,
        models={"big": BIG, "small": {"model": "qwen-1.5b", "num_ctx": 4096}},
    )
    big, name = model_config(cfg, "big")
    assert name == "qwen-32b" and big["model"] == "qwen-32b"
    assert big["base_url"] == BIG["base_url"] and big["api_key_env"] is None  # not MAIN_KEY
    assert big["num_ctx"] == 8192  # what is not about the server is the config's
    assert big.sources["base_url"].endswith(", models.big")
    small, name = model_config(cfg, "small")  # neither provider nor base_url: the same server
    assert name == "qwen-1.5b" and small["num_ctx"] == 4096
    assert (small["base_url"], small["api_key_env"]) == ("http://127.0.0.1:8080/v1", "MAIN_KEY")
    assert model_config(cfg, "qwen-7b") == (cfg, "qwen-7b")  # any other name: as it is


def test_the_schema_wants_a_model_and_a_base_url_for_openai(tmp_path: Path) -> None:
    from coder.errors import InvalidInput

    with pytest.raises(InvalidInput, match="models"):
        load(tmp_path, models={"big": {"provider": "openai", "model": "m"}})
    with pytest.raises(InvalidInput, match="model"):
        load(tmp_path, models={"big": {"base_url": "http://127.0.0.1:1/v1"}})


def test_steps_go_to_the_server_of_their_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from coder.models import factory
    from coder.models.fake import FakeProvider

    made: list[tuple[str, str, str]] = []  # (provider, endpoint, model)

    def recording(real: Any) -> Any:
        class Recording(real):  # type: ignore[misc, valid-type]
            """The real provider's endpoints, a fake model at each."""

            @classmethod
            def open(cls, cfg: config_mod.Config, endpoint: str, model: str) -> FakeProvider:
                made.append((real.name, endpoint, model))
                return FakeProvider(model=model)

        return Recording

    for provider in ("ollama", "openai"):
        monkeypatch.setitem(factory.PROVIDERS, provider, recording(factory.PROVIDERS[provider]))
    cfg = load(tmp_path, model="qwen-7b", models={"big": BIG})
    models = open_models(cfg, redactor=Redactor())
    assert isinstance(models, RedactedModels) and isinstance(models.inner, ModelSet)
    steps = [
        models.for_step("s1").inner,
        models.for_step("s2", "big").inner,
        models.for_step("s3", "q14").inner,
    ]
    assert [s.model for s in steps] == ["qwen-7b", "qwen-32b", "q14"]
    providers = [step.router.provider(step.endpoint, step.model) for step in steps]
    assert made == [
        ("ollama", "http://127.0.0.1:11434", "qwen-7b"),
        ("openai", "http://127.0.0.1:8000/v1", "qwen-32b"),
        ("ollama", "http://127.0.0.1:11434", "q14"),
    ]
    assert models.warm_up().model == "qwen-7b"  # the run's default, on its server
    assert (
        open_models(cfg, redactor=Redactor(), model="big").warm_up().model == "qwen-32b"
    )  # a task's model
    models.close()
    assert all(p.closed for p in providers)


def test_without_named_models_a_run_has_one_router(tmp_path: Path) -> None:
    from coder.models.router import Router

    assert isinstance(open_models(load(tmp_path), redactor=Redactor()).inner, Router)


def test_a_named_model_elsewhere_waits_for_trust(make_repo) -> None:
    remote = {"models": {"big": {**BIG, "base_url": "http://gpu-box.example:8000/v1"}}}
    repo = make_repo({"coder.config.json": json.dumps(remote)})
    cfg = config_mod.load(repo)
    assert cfg.untrusted == remote and cfg["models"] == {}
    local = {"models": {"big": BIG, "small": {"model": "qwen-1.5b"}}}
    repo = make_repo({"coder.config.json": json.dumps(local)}, name="local")
    assert config_mod.load(repo)["models"] == local["models"]  # this machine: no trust needed
