"""`OpenAIProvider`: any OpenAI-compatible server (llama.cpp's `llama-server`, vLLM, SGLang, LM
Studio, a LiteLLM proxy) through the official `openai` SDK, imported only when this provider
is used (it costs about twice `ollama`'s import time; `coder --help` never pays it).

What it takes care of:
- messages converted from coder's transcript shape (coder.models.provider) to the wire's:
  tool calls with their ids and JSON-string arguments, tool results naming their call;
- streaming with usage (`stream_options.include_usage`); tool-call deltas put together by
  index; a stream that ends without its final chunk (no `finish_reason`, or no `[DONE]` and
  no usage) is a dropped stream, retried;
- the server's cache figures: `usage.prompt_tokens_details.cached_tokens`, else llama.cpp's
  `timings.cache_n`; llama.cpp's `timings` also give prompt and generation times. llama.cpp
  (found by its `/props`) is asked for them on every chunk (`timings_per_token`), so a reply
  coder cuts short still records the prompt's tokens, cache and time; elsewhere such a call
  counts as not reported (no prompt tokens, no cache report), never as 0 cached tokens;
- the context size where the server reports it (vLLM `max_model_len` in /v1/models,
  llama.cpp `/props`), else `num_ctx` from the config, else DEFAULT_CONTEXT;
- `embed` through /v1/embeddings, with the same error handling;
- structured output (`format`: a JSON schema -> `response_format` json_schema; "json" ->
  json_object), `max_output_tokens` as `max_tokens`;
- errors mapped to the same user-facing errors as Ollama's: nothing listening ->
  HostUnreachable naming the URL; model not served -> ModelMissing naming what the server
  serves; 429/5xx, timeouts, dropped or malformed streams -> retried, then ModelError
  (ModelStalled, exit 3, when every attempt timed out); other refusals -> ModelError at once.
  The SDK's own retries are off: ours report `Retrying`;
- a request made within a step's bound (coder.models.bounds) ends when the step's time runs
  out or the run is stopped: its connection (one per request) is shut down, so the server
  stops generating.
"""

from __future__ import annotations

import importlib
import json
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import closing
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Self, TypeVar, cast

from coder import yamldoc
from coder.errors import (
    CoderError,
    HostUnreachable,
    InvalidInput,
    ModelError,
    ModelMissing,
    ModelUnavailable,
    StopReply,
    Transient,
)
from coder.models import bounds, retry
from coder.models.provider import (
    ChatEvent,
    ChatResult,
    Done,
    Message,
    ModelFacts,
    TextDelta,
    ToolCall,
    ToolCallEvent,
    ToolSchema,
    Usage,
    estimate_tokens,
)

if TYPE_CHECKING:
    import openai

    from coder.config import Config
    from coder.schemas import JsonSchema

T = TypeVar("T")
DEFAULT_CONTEXT = 8192
CONNECT_TIMEOUT_S = 10.0
HOST_HINT = (
    "start the server (e.g. `llama-server -m MODEL.gguf --jinja --port 8080`, `vllm serve "
    "MODEL`) or fix base_url in coder.config.json"
)


def to_wire(messages: list[Message]) -> list[dict[str, Any]]:
    """coder's transcript messages as OpenAI chat messages."""
    wire: list[dict[str, Any]] = []
    for m in messages:
        role = m["role"]
        if role == "assistant":
            out: dict[str, Any] = {"role": "assistant", "content": m.get("content") or ""}
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


def _answered_call(wire: list[dict[str, Any]], message: Message) -> str:
    """The id of the latest call to the tool a result without an id answers (transcripts
    written before ids were kept)."""
    for m in reversed(wire):
        for c in reversed(m.get("tool_calls") or []):
            if c["function"]["name"] == message.get("tool_name"):
                return str(c["id"])
    return "call_unknown"


@dataclass
class _Partial:
    """A tool call being put together from its deltas."""

    id: str | None = None
    name: str = ""
    arguments: list[str] = field(default_factory=list)


class OpenAIProvider:
    """A `ModelProvider` for one model at one OpenAI-compatible endpoint (`base_url` is the
    /v1 URL). Close it (or use `with`). The class is the `Provider` named "openai"
    (coder.models.factory.PROVIDERS)."""

    name: ClassVar[str] = "openai"
    host_label: ClassVar[str] = "model server"
    server_name: ClassVar[str] = ""
    caps_context: ClassVar[bool] = False
    tool_probe: ClassVar[bool] = True

    @classmethod
    def open(cls, cfg: Config, endpoint: str, model: str) -> OpenAIProvider:
        from coder.config import api_key

        return cls(
            model,
            endpoint,
            api_key=api_key(cfg),
            num_ctx=cfg.num_ctx,
            temperature=float(cfg.temperature),
            seed=cfg.seed,
            max_output_tokens=cfg.max_output_tokens,
            request_timeout=float(cfg.request_timeout),
        )

    @staticmethod
    def endpoints(cfg: Config) -> list[str]:
        """`base_url` (one URL or a list): an OpenAI-compatible server has no default."""
        configured = cfg.base_url
        if configured is None:
            raise InvalidInput(
                f"provider {cfg.provider!r} needs base_url",
                hint='set "base_url" in coder.config.json, e.g. "http://127.0.0.1:8080/v1"',
            )
        return [
            u.rstrip("/") for u in ([configured] if isinstance(configured, str) else configured)
        ]

    @staticmethod
    def serves(served: Sequence[str], name: str) -> bool:
        """A server that lists none does not say: given the benefit of the doubt, as at
        warm-up."""
        return not served or name in served

    @staticmethod
    def missing(url: str, name: str, served: Sequence[str], field: str) -> tuple[str, str]:
        shown = ", ".join(sorted(served)[:10])
        fix = f"name a model it serves in {field}, or serve {name} there"
        return f"is not served at {url} (it serves: {shown})", fix

    def __init__(
        self,
        model: str,
        base_url: str,
        *,
        api_key: str | None = None,
        num_ctx: int | None = None,
        temperature: float = 0.2,
        seed: int | None = None,
        max_output_tokens: int | None = None,
        request_timeout: float = 600,
        retries: int = 3,
        backoff: float = 0.5,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.model = model
        self.base_url = base_url.rstrip("/")
        self.api_key = api_key
        self.temperature = temperature
        self.seed = seed
        self.max_output_tokens = max_output_tokens
        self.request_timeout = request_timeout
        self.retry = retry.RetryPolicy(retries, backoff, sleep)
        self._num_ctx = num_ctx
        self._facts: ModelFacts | None = None
        self._timings_per_token = False  # set by probe() when the server is llama.cpp
        importlib.import_module("openai")  # in the thread that makes it (coder.models.router)
        self._client: openai.OpenAI | None = None

    # -- life cycle ---------------------------------------------------------------------------

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _sdk(self) -> openai.OpenAI:
        if self._client is None:
            import openai

            self._client = openai.OpenAI(
                base_url=self.base_url,
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
                    f"model '{self.model}' is not served at {self.base_url} (it serves: "
                    f"{', '.join(sorted(served)[:10])})",
                    hint="set model in coder.config.json to one of those, or start the "
                    "server with this model",
                )
            entry = served.get(self.model)
            reported = _int((entry.model_extra or {}).get("max_model_len")) if entry else None
            props = self._llama_cpp_props()
            self._timings_per_token = bool(props)  # llama.cpp: the prompt's figures on each chunk
            reported = reported or _int(
                (props.get("default_generation_settings") or {}).get("n_ctx") or props.get("n_ctx")
            )
            self._facts = ModelFacts(
                provider=self.name,
                model=self.model,
                endpoint=self.base_url,
                version=str(props["build_info"]) if props.get("build_info") else None,
                context_length=reported,
                num_ctx=self._num_ctx or reported or DEFAULT_CONTEXT,
                max_output_tokens=self.max_output_tokens,
            )
        return self._facts

    def list_models(self) -> list[str]:
        """The ids of the models the server serves (GET /v1/models: nothing is loaded)."""
        return [m.id for m in self._retrying(lambda: self._sdk().models.list().data)]

    def warm_up(self) -> ModelFacts:
        """OpenAI-compatible servers load their model when they start: the probe is enough."""
        return self.probe()

    def context_length(self) -> int:
        return self.probe().num_ctx or DEFAULT_CONTEXT

    def _llama_cpp_props(self) -> dict[str, Any]:
        """llama.cpp's GET /props (at the server's root, beside /v1), or {} elsewhere."""
        import httpx

        root = self.base_url.removesuffix("/v1")
        try:
            response = httpx.get(f"{root}/props", timeout=CONNECT_TIMEOUT_S)
            data = response.json() if response.status_code == 200 else {}
        except (httpx.HTTPError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    # -- chat ---------------------------------------------------------------------------------

    def chat(
        self,
        messages: list[Message],
        *,
        tools: list[ToolSchema] | None = None,
        format: JsonSchema | str | None = None,
        on_event: Callable[[ChatEvent], None] | None = None,
    ) -> ChatResult:
        """Stream one model turn; see `ModelProvider.chat`."""
        emit = on_event or (lambda event: None)
        request = self._request(messages, tools, format)
        result = self._retrying(lambda: self._stream(request, emit), emit)
        emit(Done(result))
        return result

    def _request(
        self,
        messages: list[Message],
        tools: list[ToolSchema] | None,
        format: JsonSchema | str | None,
    ) -> dict[str, Any]:
        request: dict[str, Any] = {
            "model": self.model,
            "messages": to_wire(messages),
            "stream": True,
            "stream_options": {"include_usage": True},
            "temperature": self.temperature,
        }
        if tools:
            request["tools"] = tools
        if self.seed is not None:
            request["seed"] = self.seed
        if self.max_output_tokens is not None:
            request["max_tokens"] = self.max_output_tokens
        if self._timings_per_token:  # llama.cpp only: other servers may refuse unknown fields
            request["extra_body"] = {"timings_per_token": True}
        if isinstance(format, dict):
            request["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": "answer", "schema": format},
            }
        elif format == "json":
            request["response_format"] = {"type": "json_object"}
        return request

    def _stream(self, request: dict[str, Any], emit: Callable[[ChatEvent], None]) -> ChatResult:
        started = time.monotonic()
        chunks = cast(Iterator[Any], self._sdk().chat.completions.create(**request))
        content: list[str] = []
        partial: dict[int, _Partial] = {}
        finish: str | None = None
        usage: Any = None
        timings: dict[str, Any] = {}
        first_token: float | None = None
        with closing(cast(Any, chunks)):  # closing the stream stops the server generating
            try:
                for chunk in chunks:
                    if chunk.usage is not None:
                        usage = chunk.usage
                    timings = (chunk.model_extra or {}).get("timings") or timings
                    for choice in chunk.choices[:1]:
                        delta = choice.delta
                        if delta.content:
                            first_token = first_token or time.monotonic()
                            content.append(delta.content)
                            emit(TextDelta(delta.content))
                        for d in delta.tool_calls or ():
                            first_token = first_token or time.monotonic()
                            piece = partial.setdefault(d.index, _Partial())
                            piece.id = piece.id or d.id
                            if d.function is not None:
                                piece.name += d.function.name or ""
                                piece.arguments.append(d.function.arguments or "")
                        finish = choice.finish_reason or finish
            except StopReply:  # what the server said of the prompt so far, else "not reported"
                text = "".join(content)
                ended = time.monotonic()
                cut = (
                    _usage(None, timings, started, first_token or ended, ended)
                    if "prompt_n" in timings
                    else Usage(eval_tokens=estimate_tokens(text), total_s=ended - started, calls=1)
                )
                return ChatResult(text, (), "", cut, "cut")
        if finish is None:
            raise Transient("the stream ended before its final chunk")
        calls, unparsed = _assemble(partial)
        for call in calls:
            emit(ToolCallEvent(call))
        text = "".join(content) + unparsed
        ended = time.monotonic()
        return ChatResult(
            text,
            tuple(calls),
            "",
            _usage(usage, timings, started, first_token or ended, ended),
            "length" if finish == "length" else "stop",
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
                f"{self.base_url} answered {len(data)} embeddings for {len(texts)} texts "
                f"({self.model})"
            )
        return [list(d.embedding) for d in data]

    # -- errors -------------------------------------------------------------------------------

    def _retrying(
        self, action: Callable[[], T], emit: Callable[[ChatEvent], None] | None = None
    ) -> T:
        def failed(reason: str, stalled: bool) -> CoderError:
            attempts = self.retry.attempts
            if stalled:
                return retry.stalled(self.base_url, self.model, attempts, reason, "its log")
            return ModelError(
                f"the call to {self.model} at {self.base_url} failed after {attempts} "
                f"attempt(s): {reason}",
                hint="see the model server's log",
            )

        return self.retry.run(action, self._classify, failed, emit)

    def _classify(self, exc: Exception) -> str | None:
        """The reason to retry `exc`, or None if it is not ours; raises for fatal failures."""
        import openai

        if isinstance(exc, Transient):
            return str(exc)
        if isinstance(exc, openai.APITimeoutError):
            return retry.TimedOut("timed out")
        if isinstance(exc, openai.APIConnectionError):
            if _refused(exc):
                raise HostUnreachable(
                    f"cannot reach the model server at {self.base_url}: {exc.__cause__ or exc}",
                    hint=HOST_HINT,
                    endpoint=self.base_url,
                )
            return f"connection failed: {exc.__cause__ or exc}"
        if isinstance(exc, openai.APIStatusError):
            return self._classify_status(exc)
        if isinstance(exc, openai.APIError):  # an error event inside the stream
            return f"error in the stream: {exc.message}"
        if isinstance(exc, (json.JSONDecodeError, UnicodeDecodeError)):
            return f"malformed stream: {exc}"
        return None

    def _classify_status(self, exc: openai.APIStatusError) -> str:
        status, message = exc.status_code, _message(exc)
        if status == 404 and "model" in message.lower():
            raise ModelMissing(
                f"model '{self.model}' is not available at {self.base_url}: {message}",
                hint=f"check model in coder.config.json against `GET {self.base_url}/models`",
            )
        if status == 404:
            raise ModelUnavailable(
                f"{self.base_url} answered 404 ({message}); is it an OpenAI-compatible /v1 URL?",
                hint=HOST_HINT,
            )
        if status in (401, 403):
            raise ModelUnavailable(
                f"{self.base_url} refused the API key (HTTP {status}: {message})",
                hint="set api_key_env in coder.config.json to the name of the variable that "
                "holds the key, and export it",
            )
        if status == 501:  # not implemented: asking again will not help
            hint = (
                "start llama-server with --embeddings, or serve an embedding model"
                if "embedding" in message.lower()
                else None
            )
            raise ModelError(f"{self.base_url} does not support this: {message}", hint=hint)
        if status == 429 or status >= 500:
            return f"HTTP {status}: {message}"
        hint = None
        if "tool" in message.lower():
            hint = "the server may need tool calling enabled (llama.cpp: --jinja)"
        raise ModelError(f"the server refused the request for {self.model}: {message}", hint=hint)


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


def _assemble(partial: dict[int, _Partial]) -> tuple[list[ToolCall], str]:
    """Finished tool calls, in index order; a call whose arguments are not JSON goes back as
    text (the loop treats it as an attempt at the tool format and asks again)."""
    calls, unparsed = [], ""
    for _, p in sorted(partial.items()):
        raw = "".join(p.arguments).strip() or "{}"
        try:
            arguments = yamldoc.loads_json(raw)
        except ValueError:
            arguments = None
        if isinstance(arguments, dict) and p.name:
            calls.append(ToolCall(p.name, arguments, p.id))
        else:
            unparsed += f'\n{{"name": {json.dumps(p.name)}, "arguments": {raw}}}'
    return calls, unparsed


def _usage(
    usage: Any, timings: dict[str, Any], started: float, first: float, ended: float
) -> Usage:
    """Usage from the server's figures; times from llama.cpp's timings, else the wall clock
    (time to the first token is the prompt's)."""
    prompt = int(getattr(usage, "prompt_tokens", 0) or 0)
    generated = int(getattr(usage, "completion_tokens", 0) or 0)
    details = getattr(usage, "prompt_tokens_details", None)
    cached = getattr(details, "cached_tokens", None)
    if cached is None and "cache_n" in timings:
        cached = timings["cache_n"]
    if not prompt and timings:
        prompt = int(timings.get("prompt_n", 0)) + int(timings.get("cache_n", 0))
    if not generated and timings:
        generated = int(timings.get("predicted_n", 0))
    prompt_s = timings["prompt_ms"] / 1000 if "prompt_ms" in timings else first - started
    eval_s = timings["predicted_ms"] / 1000 if "predicted_ms" in timings else ended - first
    return Usage(
        prompt_tokens=prompt,
        eval_tokens=generated,
        prompt_s=max(0.0, prompt_s),
        eval_s=max(0.0, eval_s),
        total_s=ended - started,
        calls=1,
        cached_tokens=int(cached or 0),
        cache_reports=int(cached is not None),
    )


def _int(value: Any) -> int | None:
    try:
        return int(value) if value else None
    except (TypeError, ValueError):
        return None
