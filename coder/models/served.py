"""Before a run starts: is every model its steps can use on its server?

A step may name its own `model`, a task or a step a `fallback_model`, and any of those may be a
named model on another server (config `models`). `require_served` asks each server which
models it serves (`list_models`: Ollama's GET /api/tags, an OpenAI-compatible GET /v1/models)
and loads none of them (a chat would make Ollama load the model, perhaps unloading another);
the provider says whether the model is among them and what the fix is (`Provider.serves`,
`Provider.missing`). A model a server lacks is refused up front, as the run's own model is
at warm-up, instead of when its step comes, after earlier steps spent their time.

    require_served(cfg, uses)   ModelMissing naming each missing model, the steps that use it
                                and the fix; HostUnreachable when no endpoint of a model's
                                server answers
    place_hint(cfg, name, hint) a server's hint that names the config field to fix for a
                                named model (`models.NAME.base_url`, not `base_url`)
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from coder.display import listed
from coder.errors import HostUnreachable, ModelMissing
from coder.models.factory import model_config, named_models, provider_of

if TYPE_CHECKING:
    from coder.config import Config

# model name (as the taskfile writes it) -> role ("model", "fallback_model") -> step ids
Uses = Mapping[str, Mapping[str, Sequence[str]]]

LIST_TIMEOUT_S = 30.0  # a listing is quick; a server that takes longer is in trouble


def require_served(cfg: Config, uses: Uses) -> None:
    """Refuse (ModelMissing, exit 3) when a server lacks a model of `uses`; every missing
    model is named with its steps and its fix. An endpoint that refuses connections is left
    out when another of its server answered (the run's router does the same); when none
    answers, HostUnreachable names the steps that need that server."""
    listings: dict[tuple[str, str, str], list[str] | HostUnreachable] = {}  # one ask each
    missing: list[str] = []
    fixes: list[str] = []
    for model, roles in uses.items():
        place, name = model_config(cfg, model)
        place = place.updated({"request_timeout": LIST_TIMEOUT_S})
        provider = provider_of(place)
        down: list[HostUnreachable] = []
        answered = 0
        for url in provider.endpoints(place):
            key = (provider.name, url, str(place.api_key_env))
            if key not in listings:
                lister = provider.open(place, url, name)
                try:
                    listings[key] = lister.list_models()
                except HostUnreachable as exc:
                    listings[key] = exc
                finally:
                    lister.close()
            served = listings[key]
            if isinstance(served, HostUnreachable):
                down.append(served)
                continue
            answered += 1
            if provider.serves(served, name):
                continue
            what = f"model '{name}'" + (f" (named model {model})" if name != model else "")
            field = (
                f"models.{model}.model in coder.config.json"
                if name != model
                else "the taskfile (or model in coder.config.json)"
            )
            problem, fix = provider.missing(url, name, served, field)
            missing.append(f"{what} {problem}, {_used(roles)}")
            fixes.append(fix)
        if down and not answered:
            first = down[0]
            raise HostUnreachable(
                f"{first.message} ({_used(roles)})",
                hint=place_hint(cfg, model, first.hint),
                endpoint=first.endpoint,
            )
    if missing:
        more = f" ({len(missing)} missing)" if len(missing) > 1 else ""
        raise ModelMissing("; ".join(missing) + more, hint="; ".join(dict.fromkeys(fixes)))


def _used(roles: Mapping[str, Sequence[str]]) -> str:
    """'used as the model of steps s1, s2 and the fallback_model of step s3'."""
    parts = []
    for role, ids in roles.items():
        shown = listed(ids, 6)
        if ids:
            parts.append(f"the {role} of step{'s' if len(ids) > 1 else ''} {shown}")
    return "used as " + " and ".join(parts)


def place_hint(cfg: Config, name: str | None, hint: str | None) -> str | None:
    """`hint` (a provider's, about the config's server) for the server of named model
    `name`: the fields to fix are the named model's (`models.NAME.base_url`, ...) where it
    is on a server of its own; its `model` field in any case."""
    entry = named_models(cfg).get(name or "")
    if not hint:
        return hint
    if entry is None:
        return _where_set(cfg, hint)
    fields = "model"
    if "provider" in entry or "base_url" in entry:
        fields = "base_url|api_key_env|model"
        hint = hint.replace(
            "OLLAMA_HOST / ollama_host in coder.config.json",
            f"models.{name}.base_url in coder.config.json",
        )
    field = rf"(?<![\w.])({fields}) in coder\.config\.json"
    return re.sub(field, rf"models.{name}.\1 in coder.config.json", hint)


_SERVER_FIELDS = ("base_url", "ollama_host", "api_key_env", "model", "num_ctx")


def _where_set(cfg: Config, hint: str) -> str:
    """`hint` with each "FIELD in coder.config.json" naming where FIELD's value comes from
    (your user config, CODER_CONFIG's file, a variable), not the project's file it is not in."""
    for field in _SERVER_FIELDS:
        source = cfg.sources.get(field, "default")
        kind, _, where = source.partition(" ")
        if kind in ("default", "project", "flag"):  # the project file is the place to set it
            continue
        place = f"the variable {where}" if kind == "env" else where.removeprefix("file ")
        hint = hint.replace(f"{field} in coder.config.json", f"{field} in {place}")
    return hint
