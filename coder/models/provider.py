"""The model-provider seam: typed values in and out of one chat call, and one small Protocol.

Messages are plain dicts in Ollama's shape (each provider converts them to its wire format),
so a transcript can be stored and replayed as is (`Message`):

    {"role": "system" | "user", "content": str}
    {"role": "assistant", "content": str, "thinking"?: str,
     "tool_calls"?: [{"id": str, "function": {"name": str, "arguments": {...}}}]}
    {"role": "tool", "tool_name": str, "tool_call_id"?: str, "content": str}

Tool-call ids are kept across turns (OpenAI-compatible servers require the tool result to name
the call it answers); the agent loop gives every call an id, the server's when it sent one.
`ChatResult.as_message()` builds the assistant message. Tools are function schemas
(`ToolSchema`): `{"type": "function", "function": {"name", "description", "parameters"}}`.

Errors a provider raises live in `coder.errors` (ModelUnavailable and its two kinds,
HostUnreachable and ModelMissing, exit 3; ModelError, the step fails).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, Required, TypedDict

from coder.errors import StopReply
from coder.models.usage import Usage as Usage
from coder.models.usage import UsageRecord as UsageRecord
from coder.models.usage import cache_share as cache_share
from coder.schemas import JsonSchema

# A tool call's arguments: JSON as the model wrote it, checked against the tool's schema
# (coder.tools.registry) before a handler reads it.
Arguments = dict[str, Any]


class CallFunction(TypedDict):
    name: str
    arguments: Arguments


class WireCall(TypedDict, total=False):
    """A tool call inside an assistant message."""

    id: str
    function: Required[CallFunction]


class Message(TypedDict, total=False):
    """One message of a conversation (the shapes in the module docstring)."""

    role: Required[str]  # "system" | "user" | "assistant" | "tool"
    content: str
    thinking: str
    tool_calls: list[WireCall]
    tool_name: str
    tool_call_id: str


class FunctionSchema(TypedDict):
    name: str
    description: str
    parameters: JsonSchema  # of the arguments


class ToolSchema(TypedDict):
    """A tool as the model is shown it."""

    type: str  # "function"
    function: FunctionSchema


if TYPE_CHECKING:
    from coder.config import Config


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: Arguments
    id: str | None = None  # the server's call id, when it sent one


@dataclass(frozen=True)
class ModelFacts:
    """What a provider learned about its model when it warmed up (`warm_up()`)."""

    provider: str
    model: str
    endpoint: str = ""
    version: str | None = None  # the server's, where it says
    arch: str | None = None
    context_length: int | None = None  # trained / served context length, where reported
    num_ctx: int | None = None  # the context coder budgets for (and sends, for Ollama)
    allocated_ctx: int | None = None  # what the server allocated, where it says
    capabilities: tuple[str, ...] = ()
    max_output_tokens: int | None = None
    # requests served at once (the server's slots, or the config's `slots`; a router's facts:
    # over its endpoints), where known (coder.models.slots)
    slots: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)  # provider-specific (recording, ...)

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["capabilities"] = list(self.capabilities)
        extra = data.pop("extra")
        return {**{k: v for k, v in data.items() if v is not None}, **extra}


@dataclass(frozen=True)
class ChatResult:
    content: str
    tool_calls: tuple[ToolCall, ...]
    thinking: str
    usage: Usage
    done_reason: str | None  # "stop", "length" (hit max_output_tokens), "cut" (StopReply)

    def as_message(self) -> Message:
        """The assistant message to append to the conversation."""
        message: Message = {"role": "assistant", "content": self.content}
        if self.thinking:
            message["thinking"] = self.thinking
        if self.tool_calls:
            message["tool_calls"] = [tool_call_message(c) for c in self.tool_calls]
        return message


def tool_call_message(call: ToolCall) -> WireCall:
    function: CallFunction = {"name": call.name, "arguments": call.arguments}
    return {"id": call.id, "function": function} if call.id else {"function": function}


# Streaming events, delivered in order to `on_event` while a chat is in flight.


@dataclass(frozen=True)
class TextDelta:
    text: str


@dataclass(frozen=True)
class ToolCallEvent:
    call: ToolCall


@dataclass(frozen=True)
class Retrying:
    """A transient failure; the call is repeated after `delay_s`. Deltas already delivered
    belong to the abandoned attempt (a live display should reset). Providers log nothing, so
    this is how callers learn about retries."""

    attempt: int
    reason: str
    delay_s: float


@dataclass(frozen=True)
class EndpointDown:
    """An endpoint refused the connection; it is left out for `for_s` seconds and the call
    goes on at `next_endpoint` (deltas already delivered belong to the abandoned attempt)."""

    endpoint: str
    reason: str
    next_endpoint: str
    for_s: float


@dataclass(frozen=True)
class Done:
    result: ChatResult


ChatEvent = TextDelta | ToolCallEvent | Retrying | EndpointDown | Done


class ModelProvider(Protocol):
    """A model at one place. `chat` streams internally, calls `on_event` per event, and
    returns the accumulated result; it raises ModelUnavailable or ModelError, never a
    transport error. `embed` turns texts into vectors (the model must be an embedding
    model; same errors). `warm_up` checks the server and the model (ModelUnavailable with
    the fix when either is missing) and loads it; `close` releases connections. What a run
    asks of a model, and all a router, a recording or a redacting wrapper passes on."""

    model: str

    def chat(
        self,
        messages: list[Message],
        *,
        tools: list[ToolSchema] | None = None,
        format: JsonSchema | str | None = None,
        on_event: Callable[[ChatEvent], None] | None = None,
    ) -> ChatResult: ...

    def embed(self, texts: Sequence[str]) -> list[list[float]]: ...

    def warm_up(self) -> ModelFacts: ...

    def close(self) -> None: ...


class ServerProvider(ModelProvider, Protocol):
    """A provider as its class opens it (`Provider.open`): also what is asked of the server
    before a run and by `coder doctor`, loading no model. `list_models` names the models
    the server serves (empty: it does not say); `probe` the facts about the model that
    `warm_up` would load (ModelMissing when the server lacks it)."""

    def list_models(self) -> list[str]: ...

    def probe(self) -> ModelFacts: ...


class Provider(Protocol):
    """A kind of model server, as `provider` in coder.config.json names it: a provider class,
    one entry of `coder.models.factory.PROVIDERS`. Everything that treats servers differently
    asks it: the factory (`open`, `endpoints`), the check that every model is served before a
    run (`serves`, `missing`), `coder doctor` and the dry run (the labels below)."""

    name: str  # the config's `provider`
    host_label: str  # what `coder doctor` calls its server: "ollama host"
    server_name: str  # said before the server's version: "Ollama 0.5.1"; "" for none
    caps_context: bool  # an unset num_ctx is the model's own, capped by `max_num_ctx`
    # its server can be asked whether tools reach the prompt (coder.models.protocol: llama.cpp's
    # /apply-template, else a one-token request), where the model's capabilities do not say
    tool_probe: bool

    def open(self, cfg: Config, endpoint: str, model: str) -> ServerProvider:
        """The provider for `model` at `endpoint`, set up from the config."""
        ...

    def endpoints(self, cfg: Config) -> list[str]:
        """The configured endpoints (`base_url`, or the provider's default), normalized."""
        ...

    def serves(self, served: Sequence[str], name: str) -> bool:
        """Whether model `name` is among those a server listed (`list_models`)."""
        ...

    def missing(self, url: str, name: str, served: Sequence[str], field: str) -> tuple[str, str]:
        """Model `name` is not among `served` at `url`: what is wrong (after "model 'x' "),
        and the fix (`field`: where the config or the taskfile names the model)."""
        ...


class Models(Protocol):
    """Where a run gets its providers: the factory's router over the configured endpoints, a
    recording, or a fake. `for_step` gives the provider for one step's calls (a step keeps
    to one endpoint, so its prefix stays in that server's cache; recordings file replies
    under the step); close that provider when the step ends. `warm_up` and `prime` load a
    model (Ollama: perhaps unloading another), so a run names the ones its steps use."""

    model: str  # the default model

    def for_step(self, step_id: str, model: str | None = None) -> ModelProvider: ...

    def warm_up(self, model: str | None = None) -> ModelFacts:
        """Check and load `model` (else the default one) at its server."""
        ...

    def prime(
        self,
        messages: list[Message],
        tools: list[ToolSchema],
        model: str | None = None,
        width: int = 1,
    ) -> None:
        """Put the run's shared prefix into the prompt caches of the servers of `model` (else
        the default one), best effort: into as many slots of each server (`width`: the most
        steps that can ask at once; coder.models.slots) as it has."""
        ...

    def close(self) -> None: ...


def cut_at_first_token(event: ChatEvent) -> None:
    """An `on_event` that ends a reply at its first token (a priming request)."""
    if isinstance(event, (TextDelta, ToolCallEvent)):
        raise StopReply


def estimate_tokens(text: str) -> int:
    """A rough token count for text a reply streamed (used when a stream was cut short)."""
    return max(1, len(text) // 4) if text else 0
