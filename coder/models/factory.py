"""One place that builds model providers from the configuration.

    open_models(cfg, r)       the run's models: a Router over the configured endpoints (one
                              provider per endpoint and model, built on first use), a ModelSet
                              of such Routers when the config names models on other servers
                              (`models`), wrapped for --record, or a recording for --replay;
                              every request redacted by `r` (models/redacting.py)
    model_config(cfg, name)   the config of the server a (named) model is on, and its name there
    make_provider(cfg, e, m)  one provider for model `m` at endpoint `e` (doctor checks each)
    endpoints(cfg)            the configured endpoints, normalized
    provider_of(cfg)          the `Provider` the config names (PROVIDERS)
    open_embedder(cfg, r)     texts -> vectors with `embedding_model` through the configured
                              provider's `embed` (hybrid code_search), or None when unset; the
                              texts redacted by `r`

Adding a provider is one module plus one line: a class in coder/models/ that is both a
`ModelProvider` (its instances) and a `Provider` (the class: `open`, `endpoints`, `serves`,
`missing` and its labels), for a streaming server a `StreamingProvider` with its three hooks
(coder.models.streaming), and its name in PROVIDERS below (the `provider` enum of
schemas/config.schema.json lists it too; a test holds the two equal).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from coder import config as config_mod
from coder.errors import InvalidInput
from coder.models.ollama import OllamaProvider
from coder.models.openai import OpenAIProvider
from coder.models.provider import Provider
from coder.models.redacting import RedactedModels, RedactedProvider, Scrubber
from coder.models.replay import RecordingModels, ReplayModels
from coder.models.router import ModelSet, Router

if TYPE_CHECKING:
    from coder.config import Config
    from coder.models.provider import Models, ServerProvider
    from coder.redact import Redactor


PROVIDERS: Mapping[str, Provider] = {p.name: p for p in (OllamaProvider, OpenAIProvider)}


def provider_of(cfg: Config) -> Provider:
    """The provider the config names (`provider`)."""
    name = cfg.provider
    if name not in PROVIDERS:
        raise InvalidInput(
            f"unknown provider {name!r}", hint=f"use one of: {', '.join(sorted(PROVIDERS))}"
        )
    return PROVIDERS[name]


def endpoints(cfg: Config) -> list[str]:
    """`base_url` (one URL or a list), else the provider's default (Ollama: `ollama_host`)."""
    return provider_of(cfg).endpoints(cfg)


def named_models(cfg: Config) -> dict[str, dict[str, Any]]:
    """The config's named models (`models`: name -> {model, provider?, base_url?, ...})."""
    found = cfg.models or {}
    return dict(found) if isinstance(found, dict) else {}


def model_config(cfg: Config, name: str) -> tuple[Config, str]:
    """What a model name stands for: a named model is the config of its own server and the
    name that server knows the model by; any other name is that model on the config's server.
    A named model that names its own `provider` or `base_url` takes nothing of the config's
    server (neither its base_url, its API key nor its slots); one that names neither is
    another model on the config's server (with its own num_ctx, max_output_tokens, ... where
    it sets them)."""

    entry = named_models(cfg).get(name)
    if entry is None:
        return cfg, name
    values = dict(cfg.values)
    if "provider" in entry or "base_url" in entry:
        values.update(base_url=None, api_key_env=None, slots=None)
    values.update(entry)
    origin = f"{cfg.sources.get('models', 'config')}, models.{name}"
    sources = {**cfg.sources, **dict.fromkeys(entry, origin)}
    return cfg.updated(values, sources), str(entry["model"])


def make_provider(cfg: Config, endpoint: str, model: str | None = None) -> ServerProvider:
    return provider_of(cfg).open(cfg, endpoint, model or cfg.model)


def open_models(
    cfg: Config,
    *,
    redactor: Redactor,
    model: str | None = None,
    replay: Path | None = None,
    record: Path | None = None,
) -> Models:
    """The models of a run (or a plan): `model` is the default one (else the config's). With
    named models (`models`), a step's model may be one of them: a ModelSet routes each model
    to its own server. Every request passes `redactor` last, right before the provider."""
    default = model or str(cfg.model)
    named = named_models(cfg)

    def router(place: str) -> Router:
        """The Router of the config's server (place "") or of a named model's."""
        place_cfg, place_model = model_config(cfg, place) if place else (cfg, default)
        return Router(
            lambda endpoint, name: make_provider(place_cfg, endpoint, name),
            endpoints(place_cfg),
            place_model,
        )

    def resolve(name: str) -> tuple[str, str]:
        return (name, model_config(cfg, name)[1]) if name in named else ("", name)

    models: Models
    if replay is not None:
        models = ReplayModels(replay)
    elif named:
        models = ModelSet(resolve, router, default)
    else:
        models = router("")
    if record is not None:
        models = RecordingModels(models, record)
    return RedactedModels(models, redactor)


Embedder = Callable[[Sequence[str]], list[list[float]]]


def open_embedder(cfg: Config | Mapping[str, Any], *, redactor: Redactor) -> Embedder | None:
    """Texts -> vectors through `embed` of the configured provider with `embedding_model`
    (Ollama's /api/embed, an OpenAI-compatible server's /v1/embeddings; a named model on its
    own server), at the configured endpoints (one that refuses is left out, as for chats);
    None when no embedding model is configured. Each call opens its providers and closes them
    after (a search makes at most two calls); an endpoint that refused stays left out for the
    router's cooldown. A missing endpoint or API key is raised by the call, not here, so what
    only wanted BM25 never fails for it. The texts pass `redactor` first."""
    settings = config_mod.as_config(cfg)  # a plain mapping: tests, bench
    model = settings.embedding_model
    if not model:
        return None

    settings, name = model_config(settings, str(model))  # a named model: its own server
    routers: list[Router] = []  # one, made at the first call; it remembers dead endpoints
    scrub = Scrubber(redactor)

    def embed(texts: Sequence[str]) -> list[list[float]]:
        if not routers:
            make = lambda endpoint, model: make_provider(settings, endpoint, model)  # noqa: E731
            routers.append(Router(make, endpoints(settings), name))
        provider = RedactedProvider(routers[0].for_step("embeddings"), scrub)
        try:
            return provider.embed(texts)
        finally:
            provider.close()
            routers[0].close()  # the connections; what is down stays down for its cooldown

    return embed
