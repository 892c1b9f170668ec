"""`OllamaProvider`: the model provider backed by a local Ollama server, through the official
`ollama` client (imported lazily: it costs ~150 ms, and `coder --help` must stay fast).

What it takes care of (the chat's streaming, retries, failures, usage and bounds are the
base's, coder.models.streaming):
- `num_ctx` is always sent (Ollama's default is small and it truncates prompts silently): the
  configured value, else the model's trained context length capped at `max_num_ctx`.
- the same `options` and `keep_alive` on every request, so the loaded model (and its KV cache)
  is reused instead of reloaded;
- `max_output_tokens` is sent as `num_predict`, so a rambling reply ends (done_reason length);
- the first chat may cold-load the model: it has `first_request_timeout`;
- `embed` goes to /api/embed with the same error handling as `chat`;
- the client's errors named for the base: a refusal with its status (a model not pulled gets
  the exact `ollama pull`), an error line inside the stream (status -1).
"""

from __future__ import annotations

import importlib
from collections.abc import Generator, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any, ClassVar, TypedDict, Unpack, cast

from coder.config import normalize_host as normalize
from coder.errors import HostUnreachable, ModelError
from coder.models import sampling
from coder.models.provider import Message, ModelFacts, ToolCall, ToolSchema
from coder.models.streaming import (
    Chunks,
    Failure,
    Fault,
    Figures,
    Piece,
    Settings,
    StreamingProvider,
    http_timeout,
    settings_of,
)

if TYPE_CHECKING:
    import ollama

    from coder.config import Config
    from coder.schemas import JsonSchema

DEFAULT_HOST = "http://127.0.0.1:11434"
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
    return normalize(host) if host and host.strip() else DEFAULT_HOST


def pull_command(host: str, model: str) -> str:
    prefix = "" if host == DEFAULT_HOST else f"OLLAMA_HOST={host} "
    return f"{prefix}ollama pull {model}"


def _seconds(value: int | None) -> float:
    return (value or 0) / 1e9


class Options(TypedDict, total=False):
    """The model options of a chat request (Ollama's `options`)."""

    num_ctx: int
    temperature: float
    seed: int
    num_predict: int


class ChatRequest(TypedDict):
    """The keyword arguments of `Client.chat` coder sends (`stream` added when sent)."""

    model: str
    messages: list[Message]
    tools: list[ToolSchema] | None
    format: JsonSchema | str | None
    options: Options
    keep_alive: str | float | None


class OllamaProvider(StreamingProvider[ChatRequest, "ollama.ChatResponse"]):
    """A `ModelProvider` for one model on one Ollama host. Close it (or use `with`). The
    class is the `Provider` named "ollama" (coder.models.factory.PROVIDERS)."""

    name: ClassVar[str] = "ollama"
    host_label: ClassVar[str] = "ollama host"
    server_name: ClassVar[str] = "Ollama"
    caps_context: ClassVar[bool] = True
    host_hint: ClassVar[str] = HOST_HINT
    server_log: ClassVar[str] = (
        "the Ollama server log (`journalctl -u ollama`, or ~/.ollama/logs/server.log)"
    )
    tools_hint: ClassVar[str | None] = (
        "use a model with the `tools` capability (see `ollama show {model}`)"
    )

    @classmethod
    def open(cls, cfg: Config, endpoint: str, model: str) -> OllamaProvider:
        return cls(
            model,
            endpoint,
            max_num_ctx=int(cfg.max_num_ctx),
            keep_alive=str(cfg.keep_alive),
            **settings_of(cfg),
        )

    @classmethod
    def endpoints(cls, cfg: Config) -> list[str]:
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
        max_num_ctx: int = 32768,
        keep_alive: str = "30m",
        first_request_timeout: float = 900,
        **settings: Unpack[Settings],
    ) -> None:
        """`settings` are the base's; `first_request_timeout` covers the first chat, which
        may cold-load the model."""
        super().__init__(model, normalize_host(host), **settings)
        self.max_num_ctx = max_num_ctx
        self.keep_alive = keep_alive
        self.first_request_timeout = first_request_timeout
        self._facts: ModelFacts | None = None
        self._warm = False  # has a request loaded the model yet?
        self._clients: dict[float, ollama.Client] = {}
        importlib.import_module("ollama")  # in the thread that makes it (coder.models.router)

    def close(self) -> None:
        for client in self._clients.values():
            client.close()  # type: ignore[no-untyped-call]
        self._clients.clear()
        super().close()

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
                endpoint=self.endpoint,
                arch=arch,
                context_length=int(length) if length else None,
                capabilities=tuple(shown.capabilities or ()),
            )
        return self._facts

    def context_length(self) -> int:
        """The num_ctx sent with every request (the configured one, else trained, capped)."""
        if self.num_ctx is None:
            trained = self.show_facts().context_length
            self.num_ctx = min(trained or self.max_num_ctx, self.max_num_ctx)
        return self.num_ctx

    def list_models(self) -> list[str]:
        """Names of the models pulled on the host (GET /api/tags: nothing is loaded)."""
        listed = self._retrying(lambda: self._client(self.request_timeout).list())
        return [m.model for m in listed.models if m.model]

    def version(self) -> str:
        """The server's version; also the cheapest "is Ollama there?" check."""
        import httpx

        def get() -> str:
            response = httpx.get(f"{self.endpoint}/api/version", timeout=http_timeout(30))
            if response.status_code != 200:
                raise HostUnreachable(
                    f"{self.endpoint} does not look like Ollama "
                    f"(GET /api/version answered {response.status_code})",
                    hint=HOST_HINT,
                    endpoint=self.endpoint,
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
            slots=self.slots,  # OLLAMA_NUM_PARALLEL, which the server does not tell
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

    # -- chat (the hooks of StreamingProvider) ------------------------------------------------

    def request(
        self,
        messages: list[Message],
        tools: list[ToolSchema] | None,
        format: JsonSchema | str | None,
    ) -> ChatRequest:
        return {
            "model": self.model,
            "messages": messages,
            "tools": tools,
            "format": format,
            "options": self._options(),  # num_ctx: /api/show is asked here, not in the retries
            "keep_alive": self.keep_alive,
        }

    def open_stream(self, request: ChatRequest) -> Chunks[ollama.ChatResponse]:
        client = self._client(self.request_timeout if self._warm else self.first_request_timeout)
        # `format` is any string coder's callers pass; the client's type allows "" and "json"
        sent = client.chat(**cast(Any, request), stream=True)
        return cast(Generator["ollama.ChatResponse", None, None], sent)

    def read(self, chunk: ollama.ChatResponse) -> Piece:
        message = chunk.message
        # Each call arrives whole, its arguments already a dict; the client drops the server's
        # call id (APIS.md §1).
        calls = tuple(
            ToolCall(wire.function.name, dict(wire.function.arguments))
            for wire in message.tool_calls or ()
        )
        piece = Piece(text=message.content or "", thinking=message.thinking or "", calls=calls)
        if not chunk.done:
            return piece
        self._warm = True  # the model is loaded: later requests have request_timeout
        return replace(piece, end=chunk.done_reason or "stop", figures=_figures(chunk))

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
                f"{self.endpoint} answered {len(vectors)} embeddings for {len(texts)} texts "
                f"({self.model})"
            )
        return vectors

    def _options(self) -> Options:
        options: Options = {
            "num_ctx": self.context_length(),
            "temperature": self.temperature,
        }
        seed = sampling.seed(self.seed)  # a candidate's own (coder.run.candidates)
        if seed is not None:
            options["seed"] = seed
        if self.max_output_tokens is not None:
            options["num_predict"] = self.max_output_tokens
        return options

    # -- transport ----------------------------------------------------------------------------

    def _client(self, timeout: float) -> ollama.Client:
        """One client per timeout (the client fixes its timeout at construction)."""
        if timeout not in self._clients:
            import ollama

            self._clients[timeout] = ollama.Client(
                host=self.endpoint, **self.http_settings(timeout)
            )
        return self._clients[timeout]

    def failure(self, exc: Exception) -> Failure | None:
        """The client's ResponseError: an HTTP refusal, or (status -1) an error event inside
        the stream; the rest are httpx's."""
        import ollama

        if isinstance(exc, ollama.ResponseError):
            if exc.status_code == -1:
                return Failure(Fault.IN_STREAM, exc.error)
            return Failure(Fault.REFUSED, exc.error, exc.status_code)
        return super().failure(exc)


def _figures(final: ollama.ChatResponse) -> Figures:
    """The final chunk's figures: durations are nanoseconds, omitted fields None."""
    return Figures(
        prompt_tokens=final.prompt_eval_count or 0,
        eval_tokens=final.eval_count or 0,
        prompt_s=_seconds(final.prompt_eval_duration),
        eval_s=_seconds(final.eval_duration),
        load_s=_seconds(final.load_duration),
        total_s=_seconds(final.total_duration),
    )
