"""`StreamingProvider`: what every model server that streams its replies shares, so that a
provider is three hooks.

    request(messages, tools, format)  one chat's request, in the server's terms (built once,
                                      outside the retries)
    open_stream(request)              send it: the reply's chunks as they arrive (closing them
                                      ends the request, and the server stops generating)
    read(chunk)                       what one chunk says (`Piece`): text, thinking, tool calls
                                      (whole, or in parts by index), the end and its reason,
                                      the server's figures

The base does the rest, one way for every server:
- a chat: the stream is read to its end; text and whole tool calls go to `on_event` as they
  arrive, calls sent in parts when they are whole (arguments that are not JSON go back as
  text: the loop asks again); a reply cut by `StopReply` returns what arrived (done_reason
  "cut"); a stream that ends before its final chunk was dropped (retried); an empty answer
  (no text, no call) is asked again once, since small models do that now and then, and the
  usage of both calls is counted;
- usage: the server's figures (`Figures`), the times it does not give from the wall clock
  (time to the first token is the prompt's); a cut reply whose prompt the server has not
  reported yet counts its text's estimated tokens;
- failures: `failure(exc)` names what went wrong (`Failure`; httpx's errors by default, a
  provider on an SDK names its SDK's), and the base decides what it means: nothing listening
  -> HostUnreachable; no answer in time, a broken connection, an error inside the stream, a
  malformed stream, HTTP 429 or 5xx -> retried (coder.models.retry: bounded backoff, then
  ModelError, or ModelStalled when every attempt timed out); 404 naming the model ->
  ModelMissing with the provider's fix (`missing`); other refusals -> ModelError at once
  (`refused` is where a provider adds its own statuses);
- bounds (coder.models.bounds): the retries stop with the step's time or the run's stop, and
  `http_settings` sets up an httpx client so that the bound can end each of its requests;
- the rest of the provider protocols (coder.models.provider), with defaults for a server that
  names its models and has no default URL: the labels, `open`, `endpoints`, `serves`,
  `missing`, `list_models`, `probe`, `warm_up`, `embed` and `close`. A provider overrides
  what its server does differently.

Providers log nothing: retries reach the caller as `Retrying` events.
"""

from __future__ import annotations

import enum
import json
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from contextlib import closing
from dataclasses import dataclass, field, fields, replace
from typing import TYPE_CHECKING, Any, ClassVar, Generic, Protocol, Self, TypedDict, TypeVar

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
    import httpx

    from coder.config import Config
    from coder.schemas import JsonSchema

T = TypeVar("T")
RequestT = TypeVar("RequestT")
ChunkT = TypeVar("ChunkT")
ChunkT_co = TypeVar("ChunkT_co", covariant=True)

DEFAULT_CONTEXT = 8192  # the context budgeted for when neither the server nor the config says
CONNECT_TIMEOUT_S = 10.0  # a server accepts at once; a long connect wait helps no one
CONFIG_FIELD = "coder.config.json"  # where the model is named, for a fix


class Chunks(Protocol[ChunkT_co]):
    """A reply's chunks (`open_stream`): a generator, or an SDK's stream."""

    def __iter__(self) -> Iterator[ChunkT_co]: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class CallPart:
    """A piece of a tool call sent in parts: the call at `index` gets its id (the first one
    sent), its name and its arguments (JSON text) from the pieces in order."""

    index: int
    id: str | None = None
    name: str = ""
    arguments: str = ""


@dataclass(frozen=True)
class Figures:
    """What a server says a call cost; None where it does not say. A later chunk's figures
    replace the ones it repeats. `cached_tokens` None: the server does not report its cache."""

    prompt_tokens: int | None = None
    eval_tokens: int | None = None
    cached_tokens: int | None = None
    prompt_s: float | None = None
    eval_s: float | None = None
    load_s: float | None = None
    total_s: float | None = None

    def updated(self, later: Figures) -> Figures:
        said = {f.name: getattr(later, f.name) for f in fields(later)}
        return replace(self, **{k: v for k, v in said.items() if v is not None})


@dataclass(frozen=True)
class Piece:
    """What one chunk says (`read`); each part may be empty. `end` is set by the final
    chunk: why the reply ended ("stop", or "length" at the output cap)."""

    text: str = ""
    thinking: str = ""
    calls: tuple[ToolCall, ...] = ()  # tool calls that arrive whole
    parts: tuple[CallPart, ...] = ()  # pieces of calls sent in parts
    end: str | None = None
    figures: Figures | None = None


class Fault(enum.Enum):
    """What went wrong with a request (`Failure`), as the base's rules read it."""

    UNREACHABLE = "unreachable"  # nothing listens there (refused, no route, DNS)
    TIMED_OUT = "timed out"  # the server did not answer in time
    DROPPED = "connection failed"  # the connection broke
    IN_STREAM = "error in the stream"  # the server sent an error inside the stream
    REFUSED = "refused"  # the server answered with an HTTP error `status`


@dataclass(frozen=True)
class Failure:
    """A failed request, as a provider's `failure` names it: `detail` is what the transport
    or the server said."""

    fault: Fault
    detail: str = ""
    status: int = 0


class Settings(TypedDict, total=False):
    """What every provider is set up with, besides its model and endpoint (`__init__`)."""

    num_ctx: int | None  # None: the server's (or DEFAULT_CONTEXT)
    temperature: float
    seed: int | None
    max_output_tokens: int | None
    request_timeout: float
    slots: int | None  # requests the server serves at once, as the config declares it
    retries: int  # attempts for a transient failure (at least 1)
    backoff: float
    sleep: Callable[[float], None]


def settings_of(cfg: Config) -> Settings:
    """The `Settings` the config gives every provider (a provider's `open` adds its own)."""
    return Settings(
        num_ctx=cfg.num_ctx,
        temperature=float(cfg.temperature),
        seed=cfg.seed,
        max_output_tokens=cfg.max_output_tokens,
        request_timeout=float(cfg.request_timeout),
        slots=cfg.slots,
    )


def http_timeout(seconds: float) -> httpx.Timeout:
    """`seconds` for a request, and at most CONNECT_TIMEOUT_S of it to connect."""
    import httpx

    return httpx.Timeout(seconds, connect=min(seconds, CONNECT_TIMEOUT_S))


def _ignore(event: ChatEvent) -> None:
    pass


class StreamingProvider(ABC, Generic[RequestT, ChunkT]):
    """A `ModelProvider` (and, the class, a `Provider`) for one model at one endpoint; see the
    module docstring. Close it (or use `with`)."""

    # -- what a provider says of its server (the `Provider` labels, coder.models.provider) ----

    name: ClassVar[str]  # the config's `provider`
    host_label: ClassVar[str] = "model server"
    server_name: ClassVar[str] = ""
    caps_context: ClassVar[bool] = False
    tool_probe: ClassVar[bool] = False
    host_hint: ClassVar[str] = "start the model server, or fix base_url in coder.config.json"
    server_log: ClassVar[str] = "the model server's log"  # where its side of a failure is told
    tools_hint: ClassVar[str | None] = None  # for a refusal about tools ({model} is filled in)
    asks_again_when_empty: ClassVar[bool] = True

    def __init__(
        self,
        model: str,
        endpoint: str,
        *,
        num_ctx: int | None = None,
        temperature: float = 0.2,
        seed: int | None = None,
        max_output_tokens: int | None = None,
        request_timeout: float = 600,
        slots: int | None = None,
        retries: int = 3,
        backoff: float = 0.5,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        """`retries` is the number of attempts for a transient failure (at least 1); `slots`:
        the requests the server serves at once, as the config declares it (coder.models.slots;
        None: as the server says, where it says)."""
        self.model = model
        self.endpoint = endpoint
        self.num_ctx = num_ctx  # None: the server's (or DEFAULT_CONTEXT)
        self.temperature = temperature
        self.seed = seed
        self.max_output_tokens = max_output_tokens
        self.request_timeout = request_timeout
        self.slots = slots
        self.retry = retry.RetryPolicy(max(1, retries), backoff, sleep)
        self._http: httpx.Client | None = None

    # -- the three hooks ----------------------------------------------------------------------

    @abstractmethod
    def request(
        self,
        messages: list[Message],
        tools: list[ToolSchema] | None,
        format: JsonSchema | str | None,
    ) -> RequestT:
        """One chat's request: the messages (coder's transcript shape), the tools the model
        may call, the answer's format (a JSON schema, "json", or None)."""

    @abstractmethod
    def open_stream(self, request: RequestT) -> Chunks[ChunkT]:
        """Send `request`; the reply's chunks as they arrive."""

    @abstractmethod
    def read(self, chunk: ChunkT) -> Piece:
        """What `chunk` says."""

    # -- the Provider (the class) -------------------------------------------------------------

    @classmethod
    def open(cls, cfg: Config, endpoint: str, model: str) -> Self:
        return cls(model, endpoint, **settings_of(cfg))

    @classmethod
    def endpoints(cls, cfg: Config) -> list[str]:
        """`base_url` (one URL or a list): no default."""
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
        """A server that lists none does not say: given the benefit of the doubt."""
        return not served or name in served

    @staticmethod
    def missing(url: str, name: str, served: Sequence[str], field: str) -> tuple[str, str]:
        """What is wrong (after "model 'x' ") and the fix; `served` is empty when the server
        refused a request for the model (`refused`)."""
        fix = f"name a model it serves in {field}, or serve {name} there"
        if not served:
            return f"is not available at {url}", fix
        return f"is not served at {url} (it serves: {', '.join(sorted(served)[:10])})", fix

    # -- the server ---------------------------------------------------------------------------

    def list_models(self) -> list[str]:
        """The models the server serves; none: it does not say."""
        return []

    def probe(self) -> ModelFacts:
        """The model must be among those the server lists (when it lists any)."""
        served = self.list_models()
        if not self.serves(served, self.model):
            what, fix = self.missing(self.endpoint, self.model, served, CONFIG_FIELD)
            raise ModelMissing(f"model '{self.model}' {what}", hint=fix)
        return ModelFacts(
            provider=self.name,
            model=self.model,
            endpoint=self.endpoint,
            num_ctx=self.num_ctx or DEFAULT_CONTEXT,
            max_output_tokens=self.max_output_tokens,
        )

    def warm_up(self) -> ModelFacts:
        """A server that loads its model when it starts: the probe is enough."""
        return self.probe()

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        raise ModelError(
            f"the {self.name} provider does not embed texts ({self.model})",
            hint="set embedding_model to a model on a server that embeds, or unset it",
        )

    # -- life cycle ---------------------------------------------------------------------------

    def http(self) -> httpx.Client:
        """An httpx client for this provider's requests (see `http_settings`)."""
        if self._http is None:
            import httpx

            self._http = httpx.Client(**self.http_settings(self.request_timeout))
        return self._http

    @staticmethod
    def http_settings(timeout: float) -> dict[str, Any]:
        """An httpx client's settings: `timeout`, and a step's bound can end each request (a
        connection of its own, handed to the bound: coder.models.bounds)."""
        return {
            "timeout": http_timeout(timeout),
            "headers": bounds.ONE_CONNECTION_PER_REQUEST,
            "event_hooks": {"request": [bounds.trace_requests]},
        }

    def close(self) -> None:
        if self._http is not None:
            self._http.close()
            self._http = None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

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
        emit = on_event or _ignore
        request = self.request(messages, tools, format)
        usage = Usage()
        for _ in range(2 if self.asks_again_when_empty else 1):
            result = self._retrying(lambda: self._stream(request, emit), emit)
            usage = usage + result.usage
            if result.content.strip() or result.tool_calls:
                break
        final = replace(result, usage=usage)
        emit(Done(final))
        return final

    def _stream(self, request: RequestT, emit: Callable[[ChatEvent], None]) -> ChatResult:
        reply = _Reply(time.monotonic())
        chunks = self.open_stream(request)
        with closing(chunks):  # closing the stream stops the server generating
            try:
                for chunk in chunks:  # to the end: the last chunks have the usage
                    reply.take(self.read(chunk), emit)
            except StopReply:
                return reply.cut()
        return reply.result(emit)

    # -- failures -----------------------------------------------------------------------------

    def failure(self, exc: Exception) -> Failure | None:
        """What `exc` says went wrong, or None when it is no failure of a request (a bug, the
        caller's own exception: raised as is). These are httpx's errors (and the builtin
        ConnectionError a client raises for one); a provider on an SDK names its SDK's."""
        import httpx

        if isinstance(exc, httpx.HTTPStatusError):
            return Failure(Fault.REFUSED, _said(exc.response), exc.response.status_code)
        cause: BaseException | None = exc
        if isinstance(exc, ConnectionError):
            cause = exc.__cause__ or exc.__context__  # a client's wrapping of the httpx error
        if isinstance(cause, (httpx.ConnectError, httpx.ConnectTimeout)):
            return Failure(Fault.UNREACHABLE, str(cause))
        if isinstance(cause, httpx.TimeoutException):
            return Failure(Fault.TIMED_OUT, type(cause).__name__)
        if isinstance(cause, httpx.TransportError):  # dropped connection, read error, ...
            return Failure(Fault.DROPPED, f"{type(cause).__name__}: {cause}")
        return None

    def refused(self, status: int, message: str) -> str:
        """The reason to retry a request the server refused with HTTP `status` (429, 5xx);
        raises the error for the others. A provider adds its server's own statuses."""
        if status == 404 and "model" in message.lower():
            what, fix = self.missing(self.endpoint, self.model, (), CONFIG_FIELD)
            raise ModelMissing(f"model '{self.model}' {what}: {message}", hint=fix)
        if status == 404:
            raise ModelUnavailable(
                f"{self.endpoint} answered 404 ({message}); is it {self._server}'s API URL?",
                hint=self.host_hint,
            )
        if status == 429 or status >= 500:
            return f"HTTP {status}: {message}"
        hint = None
        if self.tools_hint and "tool" in message.lower():
            hint = self.tools_hint.format(model=self.model)
        raise ModelError(
            f"{self._server} refused the request for {self.model}: {message}", hint=hint
        )

    @property
    def _server(self) -> str:
        return self.server_name or "the model server"

    def _retrying(
        self, action: Callable[[], T], emit: Callable[[ChatEvent], None] | None = None
    ) -> T:
        """`action()` (a request to the server), retried on transient failures."""

        def failed(reason: str, stalled: bool) -> CoderError:
            attempts = self.retry.attempts
            if stalled:
                return retry.stalled(self.endpoint, self.model, attempts, reason, self.server_log)
            return ModelError(
                f"the call to {self.model} at {self.endpoint} failed after {attempts} "
                f"attempt(s): {reason}",
                hint=f"see {self.server_log}",
            )

        return self.retry.run(action, self._classify, failed, emit)

    def _classify(self, exc: Exception) -> str | None:
        """The reason to retry `exc`, or None if it is not ours; raises for fatal failures
        (coder.models.retry)."""
        if isinstance(exc, Transient):
            return str(exc)
        if isinstance(exc, (json.JSONDecodeError, UnicodeDecodeError)):
            return f"malformed stream: {exc}"
        found = self.failure(exc)
        if found is None:
            return None
        if found.fault is Fault.UNREACHABLE:
            raise HostUnreachable(
                f"cannot reach {self._server} at {self.endpoint}: {found.detail}",
                hint=self.host_hint,
                endpoint=self.endpoint,
            )
        if found.fault is Fault.REFUSED:
            return self.refused(found.status, found.detail)
        if found.fault is Fault.TIMED_OUT:
            return retry.TimedOut(f"timed out ({found.detail})" if found.detail else "timed out")
        return f"{found.fault.value}: {found.detail}"


def _said(response: httpx.Response) -> str:
    """What an error response says: its JSON `error` (a message, or an object with one), else
    its body, else its reason."""
    import httpx

    try:
        text = response.text.strip()
    except httpx.ResponseNotRead:
        return response.reason_phrase
    try:
        error = json.loads(text).get("error")
    except (ValueError, AttributeError):
        error = None
    if isinstance(error, dict):
        error = error.get("message")
    return str(error) if error else text or response.reason_phrase


@dataclass
class _Partial:
    """A tool call being put together from its parts."""

    id: str | None = None
    name: str = ""
    arguments: list[str] = field(default_factory=list)


@dataclass
class _Reply:
    """A reply as its chunks arrive."""

    started: float
    text: list[str] = field(default_factory=list)
    thinking: list[str] = field(default_factory=list)
    calls: list[ToolCall] = field(default_factory=list)
    parts: dict[int, _Partial] = field(default_factory=dict)
    end: str | None = None
    figures: Figures = Figures()
    first_token: float | None = None

    def take(self, piece: Piece, emit: Callable[[ChatEvent], None]) -> None:
        """Add `piece`; its figures first, so a reply cut at its text still has them."""
        if piece.figures is not None:
            self.figures = self.figures.updated(piece.figures)
        if piece.text or piece.calls or piece.parts:
            self.first_token = self.first_token or time.monotonic()
        if piece.thinking:
            self.thinking.append(piece.thinking)
        if piece.text:
            self.text.append(piece.text)
            emit(TextDelta(piece.text))
        for call in piece.calls:
            self.calls.append(call)
            emit(ToolCallEvent(call))
        for part in piece.parts:
            partial = self.parts.setdefault(part.index, _Partial())
            partial.id = partial.id or part.id
            partial.name += part.name
            partial.arguments.append(part.arguments)
        self.end = piece.end or self.end

    def cut(self) -> ChatResult:
        """The reply so far, cut by the caller: what the server said of the prompt so far,
        else its text's estimated tokens (calls still in parts are dropped)."""
        text, ended = "".join(self.text), time.monotonic()
        usage = (
            self.usage(ended)
            if self.figures.prompt_tokens is not None
            else Usage(eval_tokens=estimate_tokens(text), total_s=ended - self.started, calls=1)
        )
        return ChatResult(text, tuple(self.calls), "".join(self.thinking), usage, "cut")

    def result(self, emit: Callable[[ChatEvent], None]) -> ChatResult:
        if self.end is None:
            raise Transient("the stream ended before its final chunk")
        calls, unparsed = _assemble(self.parts)
        for call in calls:
            emit(ToolCallEvent(call))
        return ChatResult(
            "".join(self.text) + unparsed,
            (*self.calls, *calls),
            "".join(self.thinking),
            self.usage(time.monotonic()),
            self.end,
        )

    def usage(self, ended: float) -> Usage:
        """The server's figures; the times it did not give from the wall clock."""
        f, first = self.figures, self.first_token or ended
        return Usage(
            prompt_tokens=f.prompt_tokens or 0,
            eval_tokens=f.eval_tokens or 0,
            prompt_s=max(0.0, first - self.started if f.prompt_s is None else f.prompt_s),
            eval_s=max(0.0, ended - first if f.eval_s is None else f.eval_s),
            load_s=f.load_s or 0.0,
            total_s=ended - self.started if f.total_s is None else f.total_s,
            calls=1,
            cached_tokens=f.cached_tokens or 0,
            cache_reports=int(f.cached_tokens is not None),
        )


def _assemble(parts: dict[int, _Partial]) -> tuple[list[ToolCall], str]:
    """Finished tool calls, in index order; a call whose arguments are not JSON goes back as
    text (the loop treats it as an attempt at the tool format and asks again)."""
    calls, unparsed = [], ""
    for _, p in sorted(parts.items()):
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
