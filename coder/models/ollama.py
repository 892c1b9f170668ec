"""`OllamaProvider`: the model provider backed by a local Ollama server, through the official
`ollama` client (imported lazily: it costs ~150 ms, and `coder --help` must stay fast).

What it takes care of, so callers don't have to:
- `num_ctx` is always sent (Ollama's default is small and it truncates prompts silently): the
  configured value, else the model's trained context length capped at `max_num_ctx`.
- the same `options` and `keep_alive` on every request, so the loaded model (and its KV cache)
  is reused instead of reloaded;
- `max_output_tokens` is sent as `num_predict`, so a rambling reply ends (done_reason length);
- `embed` goes to /api/embed with the same error handling as `chat`;
- failures are classified: host unreachable -> HostUnreachable, model not pulled ->
  ModelMissing with the exact `ollama pull` (both exit 3); 5xx, mid-stream errors, dropped
  connections, timeouts, malformed NDJSON -> retried with bounded exponential backoff, then
  ModelError (ModelStalled, exit 3, when every attempt timed out); other refusals (400) ->
  ModelError at once;
- a request made within a step's bound (coder.models.bounds) ends when the step's time runs
  out or the run is stopped: its connection (one per request) is shut down, and Ollama stops
  generating when its client goes.

It logs nothing: retries are reported to the caller as `Retrying` events.
"""

from __future__ import annotations

import importlib
import json
import time
from collections.abc import Callable, Generator, Sequence
from contextlib import closing
from dataclasses import replace
from typing import TYPE_CHECKING, Any, ClassVar, Self, TypeVar, cast

from coder.errors import (
    CoderError,
    HostUnreachable,
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
    import ollama

    from coder.config import Config
    from coder.schemas import JsonSchema

T = TypeVar("T")

DEFAULT_HOST = "http://127.0.0.1:11434"
CONNECT_TIMEOUT_S = 10.0  # a local server accepts at once; a long connect wait helps no one
HOST_HINT = "start it with `ollama serve` or set OLLAMA_HOST / ollama_host in coder.config.json"


def full_name(name: str) -> str:
    """A model name as Ollama resolves it: registry.ollama.ai/library/qwen2.5-coder:latest for
    `qwen2.5-coder` (no tag is `:latest`, no namespace `library/`, any case)."""
    name = name.strip().lower()
    if ":" not in name.rsplit("/", 1)[-1]:
        name += ":latest"
    parts = name.split("/")
    if len(parts) == 1:
        parts.insert(0, "library")
    if len(parts) == 2:
        parts.insert(0, "registry.ollama.ai")
    return "/".join(parts)


def normalize_host(host: str | None) -> str:
    """`scheme://host:port` for the forms Ollama accepts (one rule, in coder.config)."""
    from coder.config import normalize_host as normalize

    return normalize(host) if host and host.strip() else DEFAULT_HOST


def pull_command(host: str, model: str) -> str:
    prefix = "" if host == DEFAULT_HOST else f"OLLAMA_HOST={host} "
    return f"{prefix}ollama pull {model}"


def _seconds(value: int | None) -> float:
    return (value or 0) / 1e9


class OllamaProvider:
    """A `ModelProvider` for one model on one Ollama host. Close it (or use `with`). The
    class is the `Provider` named "ollama" (coder.models.factory.PROVIDERS)."""

    name: ClassVar[str] = "ollama"
    host_label: ClassVar[str] = "ollama host"
    server_name: ClassVar[str] = "Ollama"
    caps_context: ClassVar[bool] = True
    tool_probe: ClassVar[bool] = False

    @classmethod
    def open(cls, cfg: Config, endpoint: str, model: str) -> OllamaProvider:
        return cls(
            model,
            endpoint,
            num_ctx=cfg.num_ctx,
            max_num_ctx=int(cfg.max_num_ctx),
            temperature=float(cfg.temperature),
            seed=cfg.seed,
            keep_alive=str(cfg.keep_alive),
            max_output_tokens=cfg.max_output_tokens,
            request_timeout=float(cfg.request_timeout),
        )

    @staticmethod
    def endpoints(cfg: Config) -> list[str]:
        """`base_url` (one URL or a list), else `ollama_host`."""
        configured = cfg.base_url
        if configured is None:
            return [str(cfg.ollama_host)]
        return [
            normalize_host(u) for u in ([configured] if isinstance(configured, str) else configured)
        ]

    @staticmethod
    def serves(served: Sequence[str], name: str) -> bool:
        """An Ollama that lists none has none; names compare as Ollama resolves them (no tag
        is `:latest`, no namespace `library/`, any case)."""
        return full_name(name) in {full_name(s) for s in served}

    @staticmethod
    def missing(url: str, name: str, served: Sequence[str], field: str) -> tuple[str, str]:
        return f"is not available on {url}", f"run `{pull_command(url, name)}`"

    def __init__(
        self,
        model: str,
        host: str,
        *,
        num_ctx: int | None = None,
        max_num_ctx: int = 32768,
        temperature: float = 0.2,
        seed: int | None = None,
        keep_alive: str = "30m",
        max_output_tokens: int | None = None,
        request_timeout: float = 600,
        first_request_timeout: float = 900,
        retries: int = 3,
        backoff: float = 0.5,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        """`retries` is the number of attempts for a transient failure (at least 1);
        `first_request_timeout` covers the first chat, which may cold-load the model."""
        self.model = model
        self.host = normalize_host(host)
        self.max_num_ctx = max_num_ctx
        self.temperature = temperature
        self.seed = seed
        self.keep_alive = keep_alive
        self.max_output_tokens = max_output_tokens
        self.request_timeout = request_timeout
        self.first_request_timeout = first_request_timeout
        self.retries = max(1, retries)
        self.backoff = backoff
        self._sleep = sleep
        self._num_ctx = num_ctx
        self._facts: ModelFacts | None = None
        self._warm = False  # has a request loaded the model yet?
        self._clients: dict[float, ollama.Client] = {}
        importlib.import_module("ollama")  # in the thread that makes it (coder.models.router)

    # -- life cycle ---------------------------------------------------------------------------

    def close(self) -> None:
        for client in self._clients.values():
            client.close()  # type: ignore[no-untyped-call]
        self._clients.clear()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- facts --------------------------------------------------------------------------------

    def show_facts(self) -> ModelFacts:
        """The model's architecture, trained context length and capabilities (cached)."""
        if self._facts is None:
            shown = self._retrying(lambda: self._client(self.request_timeout).show(self.model))
            info = dict(shown.modelinfo or {})
            arch = info.get("general.architecture")
            length = info.get(f"{arch}.context_length") if arch else None
            self._facts = ModelFacts(
                provider=self.name,
                model=self.model,
                endpoint=self.host,
                arch=arch,
                context_length=int(length) if length else None,
                capabilities=tuple(shown.capabilities or ()),
            )
        return self._facts

    def context_length(self) -> int:
        """The num_ctx sent with every request (the configured one, else trained, capped)."""
        if self._num_ctx is None:
            trained = self.show_facts().context_length
            self._num_ctx = min(trained or self.max_num_ctx, self.max_num_ctx)
        return self._num_ctx

    def list_models(self) -> list[str]:
        """Names of the models pulled on the host (GET /api/tags: nothing is loaded)."""
        listed = self._retrying(lambda: self._client(self.request_timeout).list())
        return [m.model for m in listed.models if m.model]

    def version(self) -> str:
        """The server's version; also the cheapest "is Ollama there?" check."""
        import httpx

        def get() -> str:
            response = httpx.get(f"{self.host}/api/version", timeout=self._timeout(30))
            if response.status_code != 200:
                raise HostUnreachable(
                    f"{self.host} does not look like Ollama "
                    f"(GET /api/version answered {response.status_code})",
                    hint=HOST_HINT,
                    endpoint=self.host,
                )
            return str(response.json().get("version", "unknown"))

        return self._retrying(get)

    def probe(self) -> ModelFacts:
        """Check the host and the model without loading it (what `coder doctor` shows)."""
        version = self.version()
        facts = self.show_facts()
        return replace(
            facts,
            version=version,
            num_ctx=self.context_length(),
            max_output_tokens=self.max_output_tokens,
        )

    def warm_up(self) -> ModelFacts:
        """Check the host and the model, load the model with the options chats will use (a
        different num_ctx would reload it), and report what the server allocated."""
        facts = self.probe()
        client = self._client(self.first_request_timeout)  # a cold load can take minutes
        self._retrying(
            lambda: client.chat(self.model, [], options=self._options(), keep_alive=self.keep_alive)
        )
        self._warm = True
        return replace(facts, allocated_ctx=self._allocated_ctx())

    def _allocated_ctx(self) -> int | None:
        running = self._retrying(lambda: self._client(self.request_timeout).ps())
        wanted = full_name(self.model)
        for entry in running.models:
            if wanted in (full_name(entry.model or ""), full_name(entry.name or "")):
                return entry.context_length
        return None

    # -- chat ---------------------------------------------------------------------------------

    def chat(
        self,
        messages: list[Message],
        *,
        tools: list[ToolSchema] | None = None,
        format: JsonSchema | str | None = None,
        on_event: Callable[[ChatEvent], None] | None = None,
    ) -> ChatResult:
        """Stream one model turn; see `ModelProvider.chat`. An empty answer (no text, no tool
        call) is asked again once, since small models do that now and then; the usage of
        both calls is counted."""
        emit = on_event or (lambda event: None)
        self.context_length()  # outside the retry loop below: /api/show has its own
        usage = Usage()
        for _ in range(2):
            result = self._retrying(lambda: self._stream(messages, tools, format, emit), emit)
            usage = usage + result.usage
            if result.content.strip() or result.tool_calls:
                break
        final = replace(result, usage=usage)
        emit(Done(final))
        return final

    def _stream(
        self,
        messages: list[Message],
        tools: list[ToolSchema] | None,
        format: JsonSchema | str | None,
        emit: Callable[[ChatEvent], None],
    ) -> ChatResult:
        client = self._client(self.request_timeout if self._warm else self.first_request_timeout)
        chunks = cast(
            Generator["ollama.ChatResponse", None, None],
            client.chat(
                self.model,
                messages,
                tools=tools,
                format=cast(Any, format),
                options=self._options(),
                keep_alive=self.keep_alive,
                stream=True,
            ),
        )
        content: list[str] = []
        thinking: list[str] = []
        calls: list[ToolCall] = []
        final: ollama.ChatResponse | None = None
        started = time.monotonic()
        with closing(chunks):  # release the connection even if a callback raises
            try:
                for chunk in chunks:  # read to the end: the final chunk has the usage
                    message = chunk.message
                    if message.thinking:
                        thinking.append(message.thinking)
                    if message.content:
                        content.append(message.content)
                        emit(TextDelta(message.content))
                    for wire in message.tool_calls or ():
                        # Each call arrives whole, its arguments already a dict; the client
                        # drops the server's call id (APIS.md §1).
                        call = ToolCall(wire.function.name, dict(wire.function.arguments))
                        calls.append(call)
                        emit(ToolCallEvent(call))
                    if chunk.done:
                        final = chunk
            except StopReply:  # closing the stream makes the server stop generating
                text = "".join(content)
                cut = Usage(
                    eval_tokens=estimate_tokens(text), total_s=time.monotonic() - started, calls=1
                )
                return ChatResult(text, tuple(calls), "".join(thinking), cut, "cut")
        if final is None:
            raise Transient("the stream ended before its final chunk")
        self._warm = True
        return ChatResult(
            "".join(content), tuple(calls), "".join(thinking), _usage(final), final.done_reason
        )

    # -- embeddings -------------------------------------------------------------------------

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        """One vector per text, through POST /api/embed (the model must be an embedding
        model, e.g. `nomic-embed-text`; Ollama cuts a text longer than its context). No
        options are sent: the chat's num_ctx would reload an embedding model for nothing."""
        if not texts:
            return []
        client = self._client(self.request_timeout)
        response = self._retrying(
            lambda: client.embed(model=self.model, input=list(texts), keep_alive=self.keep_alive)
        )
        vectors = [list(v) for v in response.embeddings]
        if len(vectors) != len(texts):
            raise ModelError(
                f"{self.host} answered {len(vectors)} embeddings for {len(texts)} texts "
                f"({self.model})"
            )
        return vectors

    def _options(self) -> dict[str, Any]:
        options: dict[str, Any] = {
            "num_ctx": self.context_length(),
            "temperature": self.temperature,
        }
        if self.seed is not None:
            options["seed"] = self.seed
        if self.max_output_tokens is not None:
            options["num_predict"] = self.max_output_tokens
        return options

    # -- transport ----------------------------------------------------------------------------

    def _client(self, timeout: float) -> ollama.Client:
        """One client per timeout (the client fixes its timeout at construction)."""
        if timeout not in self._clients:
            import ollama

            self._clients[timeout] = ollama.Client(
                host=self.host,
                timeout=self._timeout(timeout),
                headers=bounds.ONE_CONNECTION_PER_REQUEST,  # a step's bound can end each one
                event_hooks={"request": [bounds.trace_requests]},
            )
        return self._clients[timeout]

    @staticmethod
    def _timeout(seconds: float) -> Any:
        import httpx

        return httpx.Timeout(seconds, connect=min(seconds, CONNECT_TIMEOUT_S))

    def _retrying(
        self, action: Callable[[], T], emit: Callable[[ChatEvent], None] | None = None
    ) -> T:
        """Run `action`, retrying transient failures with bounded exponential backoff."""

        log = "the Ollama server log (`journalctl -u ollama`, or ~/.ollama/logs/server.log)"

        def failed(reason: str, stalled: bool) -> CoderError:
            if stalled:
                return retry.stalled(self.host, self.model, self.retries, reason, log)
            return ModelError(
                f"the call to {self.model} at {self.host} failed after {self.retries} "
                f"attempt(s): {reason}",
                hint=f"see {log}",
            )

        policy = retry.RetryPolicy(self.retries, self.backoff, self._sleep)
        return policy.run(action, self._classify, failed, emit)

    def _classify(self, exc: Exception) -> str | None:
        """The reason to retry `exc`, or None if it is not ours; raises for fatal failures."""
        import httpx
        import ollama

        if isinstance(exc, Transient):
            return str(exc)
        if isinstance(exc, ollama.ResponseError):
            return self._classify_response(exc)
        if isinstance(exc, (httpx.ConnectError, httpx.ConnectTimeout)) or _is_refusal(exc):
            # The client wraps ConnectError as ConnectionError, except when streaming.
            cause = exc.__context__ if isinstance(exc.__context__, httpx.HTTPError) else exc
            raise HostUnreachable(
                f"cannot reach Ollama at {self.host}: {cause}", hint=HOST_HINT, endpoint=self.host
            )
        if isinstance(exc, httpx.TimeoutException):
            return retry.TimedOut(f"timed out ({type(exc).__name__})")
        if isinstance(exc, httpx.TransportError):  # dropped connection, read error, ...
            return f"connection failed: {type(exc).__name__}: {exc}"
        if isinstance(exc, json.JSONDecodeError):
            return f"malformed response line: {exc}"
        return None

    def _classify_response(self, exc: ollama.ResponseError) -> str:
        status, error = exc.status_code, exc.error
        if status == -1:
            return f"error in the stream: {error}"
        if status == 404 and "model" in error:
            raise ModelMissing(
                f"model '{self.model}' is not available on {self.host}: {error}",
                hint=f"run `{self._pull_command()}`",
            )
        if status == 404:
            raise ModelUnavailable(
                f"{self.host} answered 404 ({error}); is it an Ollama server?", hint=HOST_HINT
            )
        if status >= 500 or status == 429:
            return f"HTTP {status}: {error}"
        hint: str | None = None
        if "does not support tools" in error:
            hint = f"use a model with the `tools` capability (see `ollama show {self.model}`)"
        raise ModelError(f"Ollama refused the request for {self.model}: {error}", hint=hint)

    def _pull_command(self) -> str:
        return pull_command(self.host, self.model)


def _is_refusal(exc: Exception) -> bool:
    """The client's ConnectionError for "nothing listens there" (not a reset mid-response)."""
    transient = (ConnectionResetError, ConnectionAbortedError, BrokenPipeError)
    return isinstance(exc, ConnectionError) and not isinstance(exc, transient)


def _usage(final: ollama.ChatResponse) -> Usage:
    """Usage from the final chunk: durations are nanoseconds, omitted fields None."""
    return Usage(
        prompt_tokens=final.prompt_eval_count or 0,
        eval_tokens=final.eval_count or 0,
        prompt_s=_seconds(final.prompt_eval_duration),
        eval_s=_seconds(final.eval_duration),
        load_s=_seconds(final.load_duration),
        total_s=_seconds(final.total_duration),
        calls=1,
    )
