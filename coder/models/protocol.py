"""Which tool protocol a model is driven with: `native` (the server's tool calling) or `text`
(the tools described in the system prompt, calls written as JSON: coder.agent.texttools).

`tool_protocol` in the config (per named model too) says `native`, `text` or `auto` (the
default). `auto` decides once per model and server, from evidence, in this order:

1. Ollama's `capabilities` for the model (`/api/show`): `tools` among them, or not;
2. on an OpenAI-compatible server, llama.cpp's `/apply-template` renders a conversation with
   and without a tool: an identical prompt means the chat template drops `tools`, so the
   model never learns they exist; a refusal of the tools says the same;
3. elsewhere, a one-token probe: the same request with and without a tool, the prompt tokens
   the server counts compared (equal: the tools never reached the prompt);
4. no evidence: native, not proven; the agent loop goes over to text after the model's first
   reply in prose that names a tool (`NativeTools.fallback`), and that is remembered.

A decision from evidence is remembered in `.coder/cache/tool-protocols.json`, keyed by the
provider, the first endpoint and the model, so it is taken once; delete the file (or set
`tool_protocol`) to decide again.
"""

from __future__ import annotations

import contextlib
import json
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal, TypedDict

from coder import yamldoc
from coder.config import api_key
from coder.errors import CoderError
from coder.files import nofollow
from coder.files.durable import make_private_dirs, write_atomic
from coder.models.factory import endpoints, provider_of
from coder.project import coder_dir

if TYPE_CHECKING:
    from coder.config import Config
    from coder.models.provider import Message, ModelFacts, ToolSchema

ToolProtocol = Literal["native", "text"]
FIXED: dict[str, ToolProtocol] = {"native": "native", "text": "text"}  # the settings not auto
CACHE_FILE = "tool-protocols.json"
TIMEOUT_S = 15.0


class Probe(TypedDict, total=False):
    """A probe's request body (the rest is the endpoint's business)."""

    model: str
    messages: list[Message]
    tools: list[ToolSchema]
    max_tokens: int
    stream: bool


PROBE_TOOL: ToolSchema = {
    "type": "function",
    "function": {
        "name": "coder_probe_weather",
        "description": "Look up the weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "description": "The city."}},
            "required": ["city"],
        },
    },
}
PROBE_MESSAGES: list[Message] = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "What is the weather in Paris?"},
]
FALLBACK_NOTE = "text after a first reply in prose that names a tool"


@dataclass(frozen=True)
class Choice:
    """The protocol a model uses and why. `proven`: set in the config or shown by evidence;
    an unproven native choice falls back to text (see the module docstring)."""

    protocol: ToolProtocol
    reason: str
    proven: bool = True


def cache_path(project_root: Path | None) -> Path | None:
    """Where the decisions are remembered: the project's `.coder/cache/` (None outside one)."""
    if project_root is None:
        return None

    return coder_dir(project_root) / "cache" / CACHE_FILE


def server_key(cfg: Config, model: str) -> str:
    """What a decision is remembered by: provider, first endpoint, model (the config of the
    model's own server: coder.models.factory.model_config)."""
    try:
        first = endpoints(cfg)[0]
    except CoderError:
        first = "?"
    return f"{cfg.provider} {first} {model}"


class Remembered:
    """The decisions remembered in one file (thread-safe). It is a cache: a file that does
    not read is treated as empty, an entry not of the shape `put` writes is ignored (and
    left out when the file is written again), and a file that cannot be written is left."""

    _lock = threading.Lock()

    def __init__(self, path: Path | None, *, write: bool = True) -> None:
        self.path, self.write = path, write

    def get(self, key: str) -> Choice | None:
        entry = self._read().get(key)
        return None if entry is None else Choice(FIXED[entry["protocol"]], entry["reason"])

    def put(self, key: str, choice: Choice) -> None:
        if self.path is None or not self.write:
            return

        with self._lock:
            data = self._read()
            data[key] = {"protocol": choice.protocol, "reason": choice.reason}
            text = json.dumps(data, indent=1, sort_keys=True) + "\n"
            with contextlib.suppress(OSError):
                make_private_dirs(self.path.parent)
                write_atomic(self.path, text.encode("utf-8"), crash_point=None)

    def _read(self) -> dict[str, dict[str, str]]:
        """The well-formed entries: {"protocol": "native" | "text", "reason": text}."""
        if self.path is None:
            return {}
        try:
            data = yamldoc.loads_json(nofollow.read_bytes(self.path).decode("utf-8"))
        except (OSError, ValueError):
            return {}
        if not isinstance(data, dict):
            return {}
        return {
            key: entry
            for key, entry in data.items()
            if isinstance(entry, dict)
            and entry.keys() == {"protocol", "reason"}
            and entry["protocol"] in ("native", "text")
            and isinstance(entry["reason"], str)
        }


def decide(cfg: Config, model: str, facts: ModelFacts, remembered: Remembered) -> Choice:
    """The protocol for `model` on the server `cfg` configures (its own config: a named
    model's, from model_config), whose facts `facts` the provider reported."""
    if facts.provider == "replay" and cfg.tool_protocol == "auto":
        return Choice("native", "a replay asks no server; " + FALLBACK_NOTE, proven=False)
    choice = known(cfg, model, remembered)
    if choice is None:
        choice = evidence(cfg, model, facts)
        if choice.proven:
            remembered.put(server_key(cfg, model), choice)
    return choice


def known(cfg: Config, model: str, remembered: Remembered) -> Choice | None:
    """The protocol known without asking the server: set in the config, or remembered from
    an earlier decision; None: `auto` decides when a run starts."""
    fixed = FIXED.get(cfg.tool_protocol)
    if fixed is not None:
        where = cfg.sources.get("tool_protocol", "the config")
        return Choice(fixed, f"tool_protocol: {fixed} (from {where})")
    found = remembered.get(server_key(cfg, model))
    return None if found is None else Choice(found.protocol, f"remembered: {found.reason}")


def learned(cfg: Config, model: str, reason: str, remembered: Remembered) -> Choice:
    """The model answered in prose naming a tool under an unproven native choice: text from
    now on, remembered."""
    choice = Choice("text", reason)
    if cfg.tool_protocol == "auto":
        remembered.put(server_key(cfg, model), choice)
    return choice


def evidence(cfg: Config, model: str, facts: ModelFacts) -> Choice:
    """What the server shows about `model` and tools (see the module docstring)."""
    if facts.capabilities:
        if "tools" in facts.capabilities:
            return Choice("native", "the server lists tools among the model's capabilities")
        listed = ", ".join(facts.capabilities)
        return Choice("text", f"the model's capabilities ({listed}) do not include tools")
    if provider_of(cfg).tool_probe and facts.endpoint:
        try:
            key = api_key(cfg)
        except CoderError:
            key = None
        found = template_evidence(facts.endpoint, key) or probe_evidence(facts.endpoint, model, key)
        if found is not None:
            return found
    return Choice(
        "native", "the server does not say whether the model calls tools; " + FALLBACK_NOTE, False
    )


def template_evidence(base_url: str, key: str | None) -> Choice | None:
    """llama.cpp's `/apply-template` (beside /v1) with and without a tool; None where the
    server has no such endpoint."""
    root = base_url.rstrip("/").removesuffix("/v1")
    plain = _post(f"{root}/apply-template", {"messages": PROBE_MESSAGES}, key)
    if plain is None or plain[0] != 200 or not isinstance(plain[1].get("prompt"), str):
        return None
    with_tools = _post(
        f"{root}/apply-template", {"messages": PROBE_MESSAGES, "tools": [PROBE_TOOL]}, key
    )
    if with_tools is None:
        return None
    status, body = with_tools
    if status != 200:
        return Choice("text", f"the server refuses tools (/apply-template: {_error(body)})")
    if body.get("prompt") == plain[1]["prompt"]:
        return Choice(
            "text",
            "the chat template drops the tools: /apply-template renders the same prompt "
            "with and without them",
        )
    return Choice("native", "the chat template puts the tools into the prompt (/apply-template)")


def probe_evidence(base_url: str, model: str, key: str | None) -> Choice | None:
    """One-token requests with and without a tool: the prompt tokens the server counts say
    whether the tools reached the prompt; None when it does not count them."""
    url = f"{base_url.rstrip('/')}/chat/completions"
    request: Probe = {"model": model, "messages": PROBE_MESSAGES, "max_tokens": 1, "stream": False}
    plain = _post(url, request, key)
    if plain is None or plain[0] != 200:
        return None
    with_tools = _post(url, {**request, "tools": [PROBE_TOOL]}, key)
    if with_tools is None:
        return None
    status, body = with_tools
    if status == 400:
        return Choice("text", f"the server refuses tools ({_error(body)})")
    without, counted = _prompt_tokens(plain[1]), _prompt_tokens(body)
    if status != 200 or without is None or counted is None:
        return None
    if counted <= without:
        return Choice(
            "text",
            f"the tools never reach the prompt ({counted} prompt tokens with a tool, "
            f"{without} without)",
        )
    return Choice(
        "native", f"the tools reach the prompt ({counted} tokens with a tool, {without} without)"
    )


def _post(url: str, body: Probe, key: str | None) -> tuple[int, dict[str, object]] | None:
    """The status and the JSON object a server answered (any JSON: each reader checks what
    it reads), None when it did not answer JSON."""
    import httpx

    headers = {"Authorization": f"Bearer {key}"} if key else {}
    try:
        response = httpx.post(url, json=body, headers=headers, timeout=TIMEOUT_S)
        data = response.json()
    except (httpx.HTTPError, ValueError):
        return None
    return response.status_code, data if isinstance(data, dict) else {}


def _error(body: dict[str, object]) -> str:
    inner = body.get("error", body)
    message = inner.get("message") if isinstance(inner, dict) else inner
    return str(message or "an error")[:200]


def _prompt_tokens(body: dict[str, object]) -> int | None:
    usage = body.get("usage")
    value = usage.get("prompt_tokens") if isinstance(usage, dict) else None
    return value if isinstance(value, int) and value > 0 else None
