"""`OpenAIProvider`: any OpenAI-compatible server (llama.cpp's `llama-server`, vLLM, SGLang, LM
Studio, a LiteLLM proxy) through the official `openai` SDK, imported only when this provider
is used (it costs about twice `ollama`'s import time; `coder --help` never pays it).

What it takes care of (the chat's streaming, retries, failures, usage and bounds are the
base's, coder.models.streaming):
- messages converted from coder's transcript shape (coder.models.provider) to the wire's:
  tool calls with their ids and JSON-string arguments, tool results naming their call;
- streaming with usage (`stream_options.include_usage`); tool-call deltas sent in parts by
  index; a stream that ends without its final chunk (no `finish_reason`, or no `[DONE]` and
  no usage) is a dropped stream, retried;
- the server's cache figures: `usage.prompt_tokens_details.cached_tokens`, else llama.cpp's
  `timings.cache_n`; llama.cpp's `timings` also give prompt and generation times. llama.cpp
  (found by its `/props`) is asked for them on every chunk (`timings_per_token`), so a reply
  coder cuts short still records the prompt's tokens, cache and time; elsewhere such a call
  counts as not reported (no prompt tokens, no cache report), never as 0 cached tokens;
- the context size where the server reports it (vLLM `max_model_len` in /v1/models,
  llama.cpp `/props`), else `num_ctx` from the config, else DEFAULT_CONTEXT;
- the requests it serves at once: the config's `slots`, else llama.cpp's `total_slots` in
  `/props` (coder.models.slots); to llama.cpp each request names the slot the router gave its
  step (`id_slot`, a slot the server has) and asks for its prompt cache (`cache_prompt`, off by
  default in older servers), so a step's prefix stays in its own slot's cache;
- `embed` through /v1/embeddings, with the same error handling;
- structured output (`format`: a JSON schema -> `response_format` json_schema; "json" ->
  json_object), `max_output_tokens` as `max_tokens`;
- the SDK's errors named for the base (its own retries are off: the base's report
  `Retrying`), and two refusals of its own: a refused API key, a feature not implemented
  (llama.cpp's embeddings without `--embeddings`);
- the SDK's HTTP client set up so that a step's bound can end each request.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Literal, Required, TypedDict, Unpack, cast

from coder.config import api_key
from coder.errors import ModelError, ModelMissing, ModelUnavailable
from coder.models import bounds, sampling, slots
from coder.models.provider import Message, ModelFacts, ToolSchema
from coder.models.streaming import (
    CONNECT_TIMEOUT_S,
    DEFAULT_CONTEXT,
    CallPart,
    Chunks,
    Failure,
    Fault,
    Figures,
    Piece,
    Settings,
    StreamingProvider,
    settings_of,
)

if TYPE_CHECKING:
    import openai
    from openai.types import CompletionUsage
    from openai.types.chat import ChatCompletionChunk

    from coder.config import Config
    from coder.schemas import JsonSchema

HOST_HINT = (
    "start the server (e.g. `llama-server -m MODEL.gguf --jinja --port 8080`, `vllm serve "
    "MODEL`) or fix base_url in coder.config.json"
)


class WireFunction(TypedDict):
    name: str
    arguments: str  # JSON text


class WireCall(TypedDict):
    id: str
    type: Literal["function"]
    function: WireFunction


class WireMessage(TypedDict, total=False):
    """A chat message as an OpenAI-compatible server takes it."""

    role: Required[str]
    content: str
    tool_calls: list[WireCall]
    tool_call_id: str


class ChatRequest(TypedDict, total=False):
    """The keyword arguments of `chat.completions.create` coder sends."""

    model: Required[str]
    messages: Required[list[WireMessage]]
    stream: Required[bool]
    stream_options: dict[str, bool]
    temperature: float
    tools: list[ToolSchema]
    seed: int
    max_tokens: int
    extra_body: dict[str, bool | int]  # llama.cpp's own fields
    response_format: dict[str, object]


class Timings(TypedDict, total=False):
    """llama.cpp's `timings` of a chunk (tokens, milliseconds)."""

    prompt_n: int
    cache_n: int
    predicted_n: int
    prompt_ms: float
    predicted_ms: float


class Props(TypedDict, total=False):
    """What coder reads of llama.cpp's GET /props."""

    total_slots: int
    n_ctx: int
    default_generation_settings: dict[str, object]
    build_info: str


def to_wire(messages: list[Message]) -> list[WireMessage]:
    """coder's transcript messages as OpenAI chat messages."""
    wire: list[WireMessage] = []
    for m in messages:
        role = m["role"]
        if role == "assistant":
            out: WireMessage = {"role": "assistant", "content": m.get("content") or ""}
            calls = m.get("tool_calls") or []
            if calls:
                out["tool_calls"] = [
                    {
                        "id": c.get("id") or f"call_{len(wire)}_{i}",
                        "type": "function",
                        "function": {
                            "name": c["function"]["name"],
                            "arguments": json.dumps(c["function"].get("arguments") or {}),
                        },
                    }
                    for i, c in enumerate(calls)
                ]
            wire.append(out)
        elif role == "tool":
            wire.append(
                {
                    "role": "tool",
                    "tool_call_id": m.get("tool_call_id") or _answered_call(wire, m),
                    "content": m.get("content", ""),
                }
            )
        else:
            wire.append({"role": role, "content": m.get("content", "")})
    return wire


def _answered_call(wire: list[WireMessage], message: Message) -> str:
    """The id of the latest call to the tool a result without an id answers (transcripts
    written before ids were kept)."""
    for m in reversed(wire):
        for c in reversed(m.get("tool_calls") or []):
            if c["function"]["name"] == message.get("tool_name"):
                return str(c["id"])
    return "call_unknown"


class OpenAIProvider(StreamingProvider[ChatRequest, "ChatCompletionChunk"]):
    """A `ModelProvider` for one model at one OpenAI-compatible endpoint (`base_url` is the
    /v1 URL). Close it (or use `with`). The class is the `Provider` named "openai"
    (coder.models.factory.PROVIDERS); its labels, `endpoints`, `serves` and `missing` are
    the base's."""

    name: ClassVar[str] = "openai"
    tool_probe: ClassVar[bool] = True
    host_hint: ClassVar[str] = HOST_HINT
    tools_hint: ClassVar[str | None] = (
        "the server may need tool calling enabled (llama.cpp: --jinja)"
    )
    # An empty answer is not asked again (as it never was; Ollama's small models are why
    # the base does).
    asks_again_when_empty: ClassVar[bool] = False

    @classmethod
    def open(cls, cfg: Config, endpoint: str, model: str) -> OpenAIProvider:
        return cls(model, endpoint, api_key=api_key(cfg), **settings_of(cfg))

    def __init__(
        self,
        model: str,
        base_url: str,
        *,
        api_key: str | None = None,
        **settings: Unpack[Settings],
    ) -> None:
        super().__init__(model, base_url.rstrip("/"), **settings)
        self.api_key = api_key
        self._facts: ModelFacts | None = None
        self._timings_per_token = False  # set by probe() when the server is llama.cpp
        self._server_slots = 0  # llama.cpp's slots: a request may name one (`id_slot`)
        importlib.import_module("openai")  # in the thread that makes it (coder.models.router)
        self._client: openai.OpenAI | None = None

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None
        super().close()

    def _sdk(self) -> openai.OpenAI:
        if self._client is None:
            import openai

            self._client = openai.OpenAI(
                base_url=self.endpoint,
                api_key=self.api_key or "not-needed",  # local servers take any key
                max_retries=0,
                timeout=openai.Timeout(self.request_timeout, connect=CONNECT_TIMEOUT_S),
                # a step's bound can end each request (coder.models.bounds)
                default_headers=bounds.ONE_CONNECTION_PER_REQUEST,
                http_client=openai.DefaultHttpxClient(
                    event_hooks={"request": [bounds.trace_requests]}
                ),
            )
        return self._client

    # -- facts --------------------------------------------------------------------------------

    def probe(self) -> ModelFacts:
        """The server's models (the configured one must be among them) and context size."""
        if self._facts is None:
            listed = self._retrying(lambda: self._sdk().models.list().data)
            served = {m.id: m for m in listed}
            if served and self.model not in served:
                raise ModelMissing(
                    f"model '{self.model}' is not served at {self.endpoint} (it serves: "
                    f"{', '.join(sorted(served)[:10])})",
                    hint="set model in coder.config.json to one of those, or start the "
                    "server with this model",
                )
            entry = served.get(self.model)
            reported = _int((entry.model_extra or {}).get("max_model_len")) if entry else None
            props = self._llama_cpp_props()
            self._timings_per_token = bool(props)  # llama.cpp: the prompt's figures on each chunk
            self._server_slots = _int(props.get("total_slots")) or 0
            reported = reported or _int(
                (props.get("default_generation_settings") or {}).get("n_ctx") or props.get("n_ctx")
            )
            self._facts = ModelFacts(
                provider=self.name,
                model=self.model,
                endpoint=self.endpoint,
                version=str(props["build_info"]) if props.get("build_info") else None,
                context_length=reported,
                num_ctx=self.num_ctx or reported or DEFAULT_CONTEXT,
                max_output_tokens=self.max_output_tokens,
                slots=self.slots or self._server_slots or None,
            )
        return self._facts

    def list_models(self) -> list[str]:
        """The ids of the models the server serves (GET /v1/models: nothing is loaded)."""
        return [m.id for m in self._retrying(lambda: self._sdk().models.list().data)]

    def context_length(self) -> int:
        return self.probe().num_ctx or DEFAULT_CONTEXT

    def _llama_cpp_props(self) -> Props:
        """llama.cpp's GET /props (at the server's root, beside /v1), or {} elsewhere."""
        import httpx

        root = self.endpoint.removesuffix("/v1")
        try:
            response = httpx.get(f"{root}/props", timeout=CONNECT_TIMEOUT_S)
            data = response.json() if response.status_code == 200 else {}
        except (httpx.HTTPError, ValueError):
            return {}
        return cast(Props, data) if isinstance(data, dict) else {}

    # -- chat (the hooks of StreamingProvider) ------------------------------------------------

    def request(
        self,
        messages: list[Message],
        tools: list[ToolSchema] | None,
        format: JsonSchema | str | None,
    ) -> ChatRequest:
        request: ChatRequest = {
            "model": self.model,
            "messages": to_wire(messages),
            "stream": True,
            "stream_options": {"include_usage": True},
            "temperature": self.temperature,
        }
        if tools:
            request["tools"] = tools
        seed = sampling.seed(self.seed)  # a candidate's own (coder.run.candidates)
        if seed is not None:
            request["seed"] = seed
        if self.max_output_tokens is not None:
            request["max_tokens"] = self.max_output_tokens
        if self._timings_per_token:  # llama.cpp only: other servers may refuse unknown fields
            request["extra_body"] = {"timings_per_token": True, "cache_prompt": True}
            slot = slots.current()
            if slot is not None and slot < self._server_slots:  # the step's own slot
                request["extra_body"]["id_slot"] = slot
        if isinstance(format, dict):
            request["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": "answer", "schema": format},
            }
        elif format == "json":
            request["response_format"] = {"type": "json_object"}
        return request

    def open_stream(self, request: ChatRequest) -> Chunks[ChatCompletionChunk]:
        # our wire shape, not the SDK's narrower per-role message types (a compatible server
        # takes any content as a string): the SDK sends the mapping as it is
        sent = self._sdk().chat.completions.create(**cast(Any, request))
        return cast("Chunks[ChatCompletionChunk]", sent)

    def read(self, chunk: ChatCompletionChunk) -> Piece:
        """A delta of the first choice (tool calls in parts by index), and the server's
        figures: `usage` (on the last chunk), llama.cpp's `timings` (on the last, or on each)."""
        timings = cast(Timings, (chunk.model_extra or {}).get("timings") or {})
        figures = _figures(chunk.usage, timings)
        if not chunk.choices:
            return Piece(figures=figures)
        choice = chunk.choices[0]
        parts = tuple(
            CallPart(
                d.index,
                d.id,
                (d.function.name or "") if d.function else "",
                (d.function.arguments or "") if d.function else "",
            )
            for d in choice.delta.tool_calls or ()
        )
        finish = choice.finish_reason
        return Piece(
            text=choice.delta.content or "",
            parts=parts,
            end=None if not finish else "length" if finish == "length" else "stop",
            figures=figures,
        )

    # -- embeddings -------------------------------------------------------------------------

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        """One vector per text, through POST /v1/embeddings (an embedding model the server
        serves: llama.cpp's `llama-server --embeddings`, vLLM with an embedding model, LM
        Studio, a LiteLLM proxy). Floats are asked for by name: the SDK's default, base64,
        is not spoken by every server."""
        if not texts:
            return []
        response = self._retrying(
            lambda: self._sdk().embeddings.create(
                model=self.model, input=list(texts), encoding_format="float"
            )
        )
        data = sorted(response.data, key=lambda d: d.index)
        if len(data) != len(texts):
            raise ModelError(
                f"{self.endpoint} answered {len(data)} embeddings for {len(texts)} texts "
                f"({self.model})"
            )
        return [list(d.embedding) for d in data]

    # -- errors -------------------------------------------------------------------------------

    def failure(self, exc: Exception) -> Failure | None:
        """The SDK's errors (its transport is its own httpx, whose errors it wraps)."""
        import openai

        if isinstance(exc, openai.APITimeoutError):
            return Failure(Fault.TIMED_OUT)
        if isinstance(exc, openai.APIConnectionError):
            fault = Fault.UNREACHABLE if _refused(exc) else Fault.DROPPED
            return Failure(fault, str(exc.__cause__ or exc))
        if isinstance(exc, openai.APIStatusError):
            return Failure(Fault.REFUSED, _message(exc), exc.status_code)
        if isinstance(exc, openai.APIError):  # an error event inside the stream
            return Failure(Fault.IN_STREAM, exc.message)
        return None

    def refused(self, status: int, message: str) -> str:
        """The base's rules, and a refused key, and a feature not implemented."""
        if status in (401, 403):
            raise ModelUnavailable(
                f"{self.endpoint} refused the API key (HTTP {status}: {message})",
                hint="set api_key_env in coder.config.json to the name of the variable that "
                "holds the key, and export it",
            )
        if status == 501:  # not implemented: asking again will not help
            hint = (
                "start llama-server with --embeddings, or serve an embedding model"
                if "embedding" in message.lower()
                else None
            )
            raise ModelError(f"{self.endpoint} does not support this: {message}", hint=hint)
        return super().refused(status, message)


def _refused(exc: Exception) -> bool:
    """Nothing listens there (connect refused, no route, DNS): the cause is a ConnectError."""
    cause = exc.__cause__
    return cause is not None and any(
        t.__name__ in ("ConnectError", "ConnectTimeout") for t in type(cause).__mro__
    )


def _message(exc: openai.APIStatusError) -> str:
    body = exc.body
    if isinstance(body, dict):
        inner = body.get("error", body)
        if isinstance(inner, dict) and inner.get("message"):
            return str(inner["message"])
        if isinstance(inner, str):
            return inner
    return str(exc.message)


def _figures(usage: CompletionUsage | None, timings: Timings) -> Figures | None:
    """What a chunk says of the call's cost: `usage`, where it says, before llama.cpp's
    `timings`."""
    if usage is None and not timings:
        return None
    found = Figures(
        prompt_tokens=(
            int(timings["prompt_n"]) + int(timings.get("cache_n", 0))
            if "prompt_n" in timings
            else None
        ),
        eval_tokens=int(timings["predicted_n"]) if "predicted_n" in timings else None,
        cached_tokens=int(timings["cache_n"]) if "cache_n" in timings else None,
        prompt_s=timings["prompt_ms"] / 1000 if "prompt_ms" in timings else None,
        eval_s=timings["predicted_ms"] / 1000 if "predicted_ms" in timings else None,
    )
    if usage is None:
        return found
    details = usage.prompt_tokens_details
    cached = details.cached_tokens if details is not None else None
    return found.updated(
        Figures(
            prompt_tokens=usage.prompt_tokens or None,
            eval_tokens=usage.completion_tokens or None,
            cached_tokens=cached,
        )
    )


def _int(value: Any) -> int | None:
    try:
        return int(value) if value else None
    except (TypeError, ValueError):
        return None
