"""A protocol-faithful fake Ollama server for tests (wire format per /work/shared/APIS.md §2).

It speaks real HTTP on 127.0.0.1 so tests drive it with the real `ollama` client: NDJSON
streaming in chunked transfer encoding (as Ollama's Go server does), tool calls each whole in a
done=false chunk, usage in the final chunk (nanoseconds, zero values omitted), the same error
bodies and statuses. Model turns are scripted with `enqueue()`; every request is recorded.
A stalled server (`stall`) takes chat requests and answers none, and notes when each client
gives up (`hangups`).

    with FakeOllama() as fake:
        fake.enqueue(Reply(content="hello"), Reply(tool_calls=[{"name": "f", "arguments": {}}]))
        client = ollama.Client(host=fake.url)
        ...
        fake.chat_bodies()[0]["options"]["num_ctx"]

Run as a script (for crash tests in a separate process); prints `listening on URL`:

    python tests/fake_ollama.py --port 0 --script replies.json [--models models.json]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import select
import signal
import socket
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import suppress
from dataclasses import dataclass, field, fields
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import FrameType
from typing import Any, Self

if __name__ == "__main__":  # run as a script: make `tests` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.prefix_cache import PrefixCache, is_priming  # noqa: E402

VERSION = "0.33.0"
DEFAULT_NUM_CTX = 4096  # what the server allocates when a request sets no num_ctx
DEFAULT_MODELS: dict[str, dict[str, Any]] = {
    "qwen2.5-coder:7b": {
        "context_length": 32768,
        "capabilities": ["completion", "tools", "insert"],
        "arch": "qwen2",
    },
}
NO_REPLY_LEFT = "fake ollama: no scripted reply left"

# Fake but deterministic timings, in nanoseconds.
NS_PER_PROMPT_TOKEN = 250_000  # 4000 tokens/s prompt processing
NS_PER_EVAL_TOKEN = 20_000_000  # 50 tokens/s generation
LOAD_NS = 1_500_000_000  # a cold load; omitted (zero) once the model is loaded


@dataclass
class Reply:
    """One scripted model turn, or a fault injected in its place.

    tool_calls use the short form {"name": ..., "arguments": {...}}; the fake sends the wire
    form {"id": "call_...", "function": {"index": i, "name", "arguments"}}.
    """

    content: str = ""
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    thinking: str = ""
    done_reason: str = "stop"
    prompt_eval_count: int | None = None  # default: estimate_prompt_tokens(request)
    eval_count: int | None = None
    # Faults.
    http_status: int | None = None  # answer this status with {"error": error}, before any chunk
    error: str = "fake ollama: scripted failure"
    error_mid_stream: str | None = None  # some chunks, then an {"error": ...} line (status 200)
    drop_connection_mid_stream: bool = False  # some chunks, half a line, then close the socket
    malformed_line: bool = False  # some chunks, then a line that is not JSON
    delay_s: float = 0.0  # wait before answering (to provoke client timeouts)
    # Faults of the OpenAI-compatible fake (tests/fake_openai.py) only.
    end_early: bool = False  # some chunks, then a clean end: no final chunk, no [DONE]
    no_done: bool = False  # the whole reply, but the closing `data: [DONE]` never comes
    chunk_delay_s: float = 0.0  # a pause before each streamed chunk (a model's speed)

    @classmethod
    def coerce(cls, value: Reply | dict[str, Any] | str) -> Reply:
        if isinstance(value, Reply):
            return value
        if isinstance(value, str):
            return cls(content=value)
        known = {f.name for f in fields(cls)}
        unknown = set(value) - known
        if unknown:
            raise TypeError(f"unknown Reply fields: {sorted(unknown)}")
        return cls(**value)


@dataclass(frozen=True)
class RecordedRequest:
    method: str
    path: str
    body: Any  # parsed JSON, or None
    raw: bytes
    headers: dict[str, str] = field(default_factory=dict)  # names in lower case


def estimate_prompt_tokens(body: dict[str, Any]) -> int:
    """The fake's deterministic prompt size: a quarter of the JSON length of messages + tools."""
    text = json.dumps(body.get("messages") or []) + json.dumps(body.get("tools") or [])
    return len(text) // 4


def seed_of(body: dict[str, Any]) -> int | None:
    """The sampling seed a chat request asks for (Ollama's `options.seed`, else the OpenAI
    API's `seed`): a scripted model can answer by it (`solves`)."""
    options = body.get("options") or {}
    seed = options.get("seed", body.get("seed"))
    return seed if isinstance(seed, int) else None


def solves(seed: int | None, one_in: int) -> bool:
    """Whether a scripted model solves its step with `seed`: one seed in `one_in`, as by
    chance, the same for a seed every time (a hash of it)."""
    digest = hashlib.sha256(str(seed).encode()).digest()
    return int.from_bytes(digest[:4], "big") % one_in == 0


def full_name(model: str) -> str:
    """The registry name Ollama uses in some errors: registry.ollama.ai/library/x:latest."""
    name = model if ":" in model.rsplit("/", 1)[-1] else f"{model}:latest"
    parts = name.split("/")
    if len(parts) == 1:
        parts.insert(0, "library")
    if len(parts) == 2:
        parts.insert(0, "registry.ollama.ai")
    return "/".join(parts)


def down_url() -> str:
    """A URL where nothing listens (a port that was just free)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}"


def embedding(text: str, dimensions: int = 16) -> list[float]:
    """The fakes' embedding of a text: a hashed bag of its words, L2-normalised, so texts
    sharing words are near each other (deterministic, no model)."""
    vector = [0.0] * dimensions
    for word in re.findall(r"[a-z]+", text.lower()):
        vector[int(hashlib.md5(word.encode()).hexdigest(), 16) % dimensions] += 1.0
    norm = sum(v * v for v in vector) ** 0.5 or 1.0
    return [v / norm for v in vector]


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S.000000Z", time.gmtime())


def _pieces(text: str) -> list[str]:
    """Split text into word-sized deltas, as a model streams tokens."""
    return re.findall(r"\s*\S+\s*|\s+", text)


class FakeServer:
    """What the fake servers share: a threaded HTTP server on 127.0.0.1, scripted replies
    (`enqueue`), recorded requests, the server's slots (tests/prefix_cache.py: one request at a
    time on each, and what its KV cache reuses)."""

    name = "fake"

    def __init__(
        self,
        handler: type[BaseHTTPRequestHandler],
        replies: list[Reply | dict[str, Any] | str] | None,
        port: int,
        slots: int = 1,
    ) -> None:
        self.requests: list[RecordedRequest] = []
        self.cache = PrefixCache(slots)
        self._replies: deque[Reply] = deque()
        self._lock = threading.Lock()
        self._ids = 0
        # A function of a chat request's body that answers it before the script (None: the
        # next scripted reply): for turns whose order a test cannot know, such as a summary.
        self.answer: Callable[[dict[str, Any]], Reply | None] | None = None
        # A stalled server: "answer", a chat request (one with messages, a warm prefix too) is
        # read and never answered; "stream", its headers and first piece are sent, then
        # nothing. Until the client goes (`hangups`) or the server stops; no script is used.
        self.stall: str | None = None
        self.stalled: list[float] = []  # time.monotonic() as each stalled request came
        self.hangups: list[float] = []  # time.monotonic() as the client of one went away
        self._server = _Server(("127.0.0.1", port), handler)
        self._server.fake = self
        self._thread: threading.Thread | None = None
        self.enqueue(*(replies or []))

    @property
    def root(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def start(self) -> Self:
        # A short poll interval keeps stop() (and so each test's teardown) quick.
        self._thread = threading.Thread(
            target=self._server.serve_forever, args=(0.02,), name=self.name
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.stopping.set()
        if self._thread is not None:
            self._server.shutdown()
            self._thread.join()
            self._thread = None
        self._server.close_connections()
        self._server.server_close()  # joins the handler threads

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def enqueue(self, *replies: Reply | dict[str, Any] | str) -> None:
        with self._lock:
            self._replies.extend(Reply.coerce(r) for r in replies)

    @property
    def pending(self) -> int:
        """Scripted replies not yet consumed."""
        with self._lock:
            return len(self._replies)

    def record(self, request: RecordedRequest) -> None:
        with self._lock:
            self.requests.append(request)

    def next_reply(self) -> Reply | None:
        with self._lock:
            return self._replies.popleft() if self._replies else None

    def reply_for(self, body: dict[str, Any]) -> Reply | None:
        """`answer`'s reply to the request, else the next scripted one."""
        answered = self.answer(body) if self.answer is not None else None
        return answered if answered is not None else self.next_reply()

    def hold(self, handler: BaseHTTPRequestHandler) -> None:
        """Keep a stalled request's connection open, sending nothing, until its client closes
        it (noted in `hangups`) or the server stops."""
        conn, stopping = handler.connection, handler.server.stopping  # type: ignore[attr-defined]
        with self._lock:
            self.stalled.append(time.monotonic())
        handler.close_connection = True
        while not stopping.is_set():
            if not select.select([conn], [], [], 0.02)[0]:
                continue
            try:
                data = conn.recv(4096)
            except OSError:
                data = b""
            if not data:
                with self._lock:
                    self.hangups.append(time.monotonic())
                return

    def pause(self, handler: BaseHTTPRequestHandler, seconds: float) -> bool:
        """Wait `seconds` while answering `handler`'s request; True when the answer is to end
        instead: the server is stopping, or the client went (a server stops generating for a
        client that closed its connection, and its slot is free again)."""
        conn, stopping = handler.connection, handler.server.stopping  # type: ignore[attr-defined]
        until = time.monotonic() + seconds
        while (left := until - time.monotonic()) > 0:
            if stopping.is_set():
                return True
            if select.select([conn], [], [], min(left, 0.02))[0]:
                try:
                    gone = not conn.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
                except BlockingIOError:
                    gone = False
                except OSError:
                    gone = True
                if gone:
                    handler.close_connection = True
                    return True
                time.sleep(min(left, 0.02))  # bytes of a next request: not ours to read
        return stopping.is_set()

    def next_id(self, prefix: str) -> str:
        with self._lock:
            self._ids += 1
            return f"{prefix}{self._ids:08x}"


class FakeOllama(FakeServer):
    name = "fake-ollama"

    def __init__(
        self,
        models: dict[str, dict[str, Any]] | None = None,
        replies: list[Reply | dict[str, Any] | str] | None = None,
        port: int = 0,
        slots: int = 1,
    ) -> None:
        """`slots`: OLLAMA_NUM_PARALLEL (which Ollama does not tell its clients)."""
        self.models = dict(DEFAULT_MODELS if models is None else models)
        self.loaded: dict[str, int] = {}  # model name -> allocated context (for /api/ps)
        super().__init__(_Handler, replies, port, slots)

    @property
    def url(self) -> str:
        return self.root

    def chat_bodies(self) -> list[dict[str, Any]]:
        """The JSON bodies of every POST /api/chat, in order."""
        with self._lock:
            return [r.body for r in self.requests if r.path == "/api/chat" and r.body]

    def next_call_id(self) -> str:
        return self.next_id("call_")

    def resolve(self, name: str) -> str | None:
        """The configured model a request names (a bare name means its :latest tag)."""
        for candidate in (name, f"{name}:latest"):
            if candidate in self.models:
                return candidate
        return None


class _Server(ThreadingHTTPServer):
    """Tracks open connections so stop() can close idle keep-alive ones and join threads."""

    daemon_threads = False
    block_on_close = True
    fake: Any  # the FakeServer serving

    def __init__(self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler]) -> None:
        super().__init__(address, handler)
        self.stopping = threading.Event()
        self._connections: set[socket.socket] = set()
        self._connections_lock = threading.Lock()

    def process_request(self, request: Any, client_address: Any) -> None:
        with self._connections_lock:
            self._connections.add(request)
        super().process_request(request, client_address)

    def shutdown_request(self, request: Any) -> None:
        with self._connections_lock:
            self._connections.discard(request)
        super().shutdown_request(request)

    def close_connections(self) -> None:
        with self._connections_lock:
            for conn in self._connections:
                with suppress(OSError):
                    conn.shutdown(socket.SHUT_RDWR)

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that timed out or hung up is part of the tests, not a server error.
        if not isinstance(sys.exc_info()[1], OSError):
            super().handle_error(request, client_address)


class _ClientGone(Exception):
    """The handler dropped the connection on purpose."""


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive and chunked streaming, like the Go server
    disable_nagle_algorithm = True  # else each small write waits ~40 ms for a delayed ACK
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass

    @property
    def fake(self) -> FakeOllama:
        return self.server.fake

    # -- routing ------------------------------------------------------------------------------

    def do_GET(self) -> None:
        self._record(b"")
        routes = {
            "/": self._root,
            "/api/version": self._version,
            "/api/tags": self._tags,
            "/api/ps": self._ps,
        }
        routes.get(self.path, self._not_found)()

    def do_HEAD(self) -> None:
        self._record(b"")
        self._send(200, b"", "text/plain; charset=utf-8")

    def do_POST(self) -> None:
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        body = self._record(raw)
        if self.path == "/api/show":
            self._show(body)
        elif self.path == "/api/chat":
            self._chat(raw, body)
        elif self.path == "/api/embed":
            self._embed(body)
        else:
            self._not_found()

    def _record(self, raw: bytes) -> Any:
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = None
        headers = {k.lower(): v for k, v in self.headers.items()}
        self.fake.record(RecordedRequest(self.command, self.path, body, raw, headers))
        return body

    # -- plain endpoints ----------------------------------------------------------------------

    def _root(self) -> None:
        self._send(200, b"Ollama is running", "text/plain; charset=utf-8")

    def _not_found(self) -> None:
        self._send(404, b"404 page not found", "text/plain")

    def _version(self) -> None:
        self._json(200, {"version": VERSION})

    def _tags(self) -> None:
        models = [
            {
                "name": name,
                "model": name,
                "modified_at": "2026-01-01T00:00:00Z",
                "size": 4_683_087_332,
                "digest": _digest(name),
                "details": _details(conf),
            }
            for name, conf in self.fake.models.items()
        ]
        self._json(200, {"models": models})

    def _ps(self) -> None:
        models = [
            {
                "name": name,
                "model": name,
                "size": 6_000_000_000,
                "digest": _digest(name),
                "details": _details(self.fake.models[name]),
                "expires_at": "2099-01-01T00:00:00Z",
                "size_vram": 6_000_000_000,
                "context_length": ctx,
            }
            for name, ctx in dict(self.fake.loaded).items()
        ]
        self._json(200, {"models": models})

    def _show(self, body: Any) -> None:
        requested = (body or {}).get("model") or (body or {}).get("name") or ""
        name = self.fake.resolve(requested)
        if name is None:
            self._error(404, f"model '{requested}' not found")
            return
        conf = self.fake.models[name]
        arch = conf.get("arch", "llama")
        self._json(
            200,
            {
                "modelfile": f"FROM {name}\n",
                "parameters": 'stop "<|im_end|>"',
                "template": "{{ .Prompt }}",
                "details": _details(conf),
                "model_info": {
                    "general.architecture": arch,
                    "general.parameter_count": 7_615_616_512,
                    f"{arch}.context_length": conf.get("context_length", 32768),
                    f"{arch}.embedding_length": 3584,
                },
                "capabilities": list(conf.get("capabilities", ["completion"])),
                "modified_at": "2026-01-01T00:00:00Z",
            },
        )

    def _embed(self, body: Any) -> None:
        """POST /api/embed: a deterministic vector per input (`embedding`)."""
        requested = (body or {}).get("model") or ""
        if self.fake.resolve(requested) is None:
            self._error(404, f"model '{requested}' not found")
            return
        texts = body.get("input")
        texts = [texts] if isinstance(texts, str) else list(texts or [])
        vectors = [embedding(str(text)) for text in texts]
        self._json(
            200,
            {
                "model": requested,
                "embeddings": vectors,
                "total_duration": 1000,
                "prompt_eval_count": len(texts),
            },
        )

    # -- chat ---------------------------------------------------------------------------------

    def _chat(self, raw: bytes, body: Any) -> None:
        refusal = self._refuse_chat(raw, body)
        if refusal is not None:
            self._error(*refusal)
            return
        name = self.fake.resolve(body["model"]) or ""
        was_loaded = name in self.fake.loaded
        self._load(name, body)
        if not body.get("messages"):  # a load request (or an unload with keep_alive 0)
            self._json(200, self._load_answer(name, body))
            return
        if self.fake.stall is not None:
            if self.fake.stall == "stream":  # the headers and one piece, then nothing
                self._stream_head([self._chunk(body, False, content="Let me ")])
            self.fake.hold(self)
            return
        try:  # on a slot of the runner's: Ollama gives it the idle one that shares the most
            with self.fake.cache.serve(body, None, self.server.stopping) as read:
                self._answer(body, read, was_loaded)
        except ConnectionAbortedError:
            self.close_connection = True

    def _answer(self, body: dict[str, Any], read: Callable[[], int], was_loaded: bool) -> None:
        reply = Reply(content="ok") if is_priming(body) else self.fake.reply_for(body)
        if reply is None:
            self._error(500, NO_REPLY_LEFT)
            return
        if reply.delay_s and self.fake.pause(self, reply.delay_s):
            return
        if reply.http_status is not None:
            self._error(reply.http_status, reply.error)
            return
        read()
        lines = list(self._reply_lines(body, reply, was_loaded))
        if body.get("stream", True):
            self._stream(lines, reply)
        else:
            self._whole(lines, reply)

    def _refuse_chat(self, raw: bytes, body: Any) -> tuple[int, str] | None:
        """The checks the server makes before it schedules a runner, as (status, error)."""
        if not raw:
            return 400, "missing request body"
        if not isinstance(body, dict):
            return 400, "invalid character in request body"
        if not body.get("model"):
            return 400, "model is required"
        name = self.fake.resolve(body["model"])
        if name is None:
            return 404, f"model '{body['model']}' not found"
        capabilities = self.fake.models[name].get("capabilities", ["completion"])
        if body.get("tools") and "tools" not in capabilities:
            return 400, f"{full_name(body['model'])} does not support tools"
        if body.get("think") and "thinking" not in capabilities:
            return 400, f'"{body["model"]}" does not support thinking'
        return None

    def _load_answer(self, name: str, body: dict[str, Any]) -> dict[str, Any]:
        unload = body.get("keep_alive") in (0, "0", "0s")
        if unload:
            self.fake.loaded.pop(name, None)
        # Sent as one JSON object even when stream is true, as the Go handler does.
        return self._chunk(body, True, done_reason="unload" if unload else "load")

    def _load(self, name: str, body: dict[str, Any]) -> None:
        """Loading allocates the requested num_ctx, capped at the trained length."""
        conf = self.fake.models[name]
        trained = conf.get("context_length", 32768)
        wanted = (body.get("options") or {}).get("num_ctx") or DEFAULT_NUM_CTX
        self.fake.loaded[name] = conf.get("allocated_ctx") or min(wanted, trained)

    def _chunk(self, body: dict[str, Any], done: bool, **extra: Any) -> dict[str, Any]:
        message = {"role": "assistant", "content": extra.pop("content", "")}
        message.update(extra.pop("message", {}))
        return {
            "model": body["model"],
            "created_at": _now(),
            "message": message,
            "done": done,
            **extra,
        }

    def _reply_lines(
        self, body: dict[str, Any], reply: Reply, was_loaded: bool
    ) -> Iterator[dict[str, Any]]:
        for piece in _pieces(reply.thinking):
            yield self._chunk(body, False, message={"thinking": piece})
        for piece in _pieces(reply.content):
            yield self._chunk(body, False, content=piece)
        for index, call in enumerate(reply.tool_calls):
            wire = {
                "id": self.fake.next_call_id(),
                "function": {
                    "index": index,
                    "name": call["name"],
                    "arguments": call.get("arguments", {}),
                },
            }
            yield self._chunk(body, False, message={"tool_calls": [wire]})
        yield self._chunk(
            body, True, done_reason=reply.done_reason, **self._usage(body, reply, was_loaded)
        )

    def _usage(self, body: dict[str, Any], reply: Reply, was_loaded: bool) -> dict[str, int]:
        num_ctx = self.fake.loaded.get(self.fake.resolve(body["model"]) or "", DEFAULT_NUM_CTX)
        # Like the real server, never more prompt tokens than the context: it truncates silently.
        prompt = min(estimate_prompt_tokens(body), num_ctx)
        if reply.prompt_eval_count is not None:
            prompt = reply.prompt_eval_count
        generated = json.dumps(reply.tool_calls) if reply.tool_calls else ""
        evals = reply.eval_count
        if evals is None:
            evals = max(1, len(reply.thinking + reply.content + generated) // 4)
        usage = {
            "load_duration": 0 if was_loaded else LOAD_NS,
            "prompt_eval_count": prompt,
            "prompt_eval_duration": prompt * NS_PER_PROMPT_TOKEN,
            "eval_count": evals,
            "eval_duration": evals * NS_PER_EVAL_TOKEN,
        }
        usage["total_duration"] = sum(v for k, v in usage.items() if k.endswith("_duration"))
        return {k: v for k, v in usage.items() if v}  # omitempty

    def _stream_head(self, lines: list[dict[str, Any]]) -> None:
        """The streamed answer's headers and first `lines`."""
        self.send_response(200)
        self.send_header("Content-Type", "application/x-ndjson")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for line in lines:
            self._write_chunk(json.dumps(line).encode() + b"\n")

    def _stream(self, lines: list[dict[str, Any]], reply: Reply) -> None:
        self._stream_head([])
        faulty = (
            reply.error_mid_stream is not None
            or reply.drop_connection_mid_stream
            or reply.malformed_line
        )
        # A fault cuts in after the first delta, so the client has already seen some output.
        head = lines[:1] if faulty else lines
        try:
            for line in head:
                self._write_chunk(json.dumps(line).encode() + b"\n")
            if reply.drop_connection_mid_stream:
                self._write_chunk(json.dumps(lines[-1]).encode()[:20])
                raise _ClientGone
            if reply.malformed_line:
                self._write_chunk(b"<html>this is not json</html>\n")
            elif reply.error_mid_stream is not None:
                self._write_chunk(json.dumps({"error": reply.error_mid_stream}).encode() + b"\n")
            self.wfile.write(b"0\r\n\r\n")
        except (_ClientGone, OSError):
            self.close_connection = True
            with suppress(OSError):
                self.connection.shutdown(socket.SHUT_RDWR)

    def _whole(self, lines: list[dict[str, Any]], reply: Reply) -> None:
        """The stream:false answer; a fault shows as a status, a cut or a broken body."""
        if reply.error_mid_stream is not None:
            self._error(500, reply.error_mid_stream)
        elif reply.drop_connection_mid_stream:
            self.close_connection = True
            with suppress(OSError):
                self.connection.shutdown(socket.SHUT_RDWR)
        elif reply.malformed_line:
            self._send(200, b"<html>this is not json</html>", "application/json; charset=utf-8")
        else:
            self._json(200, _merge(lines))

    def _write_chunk(self, data: bytes) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    # -- responses ----------------------------------------------------------------------------

    def _send(self, status: int, data: bytes, content_type: str) -> None:
        try:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(data)
        except OSError:
            self.close_connection = True

    def _json(self, status: int, payload: Any) -> None:
        self._send(status, json.dumps(payload).encode(), "application/json; charset=utf-8")

    def _error(self, status: int, message: str) -> None:
        self._json(status, {"error": message})


def _merge(lines: list[dict[str, Any]]) -> dict[str, Any]:
    """The stream:false answer: one object with content, thinking and tool calls collected."""
    final = dict(lines[-1])
    message: dict[str, Any] = {"role": "assistant", "content": ""}
    thinking, calls = "", []
    for line in lines:
        message["content"] += line["message"].get("content", "")
        thinking += line["message"].get("thinking", "")
        calls += line["message"].get("tool_calls", [])
    if thinking:
        message["thinking"] = thinking
    if calls:
        message["tool_calls"] = calls
    final["message"] = message
    return final


def _details(conf: dict[str, Any]) -> dict[str, Any]:
    arch = conf.get("arch", "llama")
    return {
        "parent_model": "",
        "format": "gguf",
        "family": arch,
        "families": [arch],
        "parameter_size": "7.6B",
        "quantization_level": "Q4_K_M",
    }


def _digest(name: str) -> str:
    return "sha256:" + (name.encode().hex() * 64)[:64]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Serve a fake Ollama with scripted replies.")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--script", help="JSON file: a list of replies (objects or strings)")
    parser.add_argument("--models", help="JSON file: {model name: {context_length, ...}}")
    args = parser.parse_args(argv)
    replies = json.loads(Path(args.script).read_text()) if args.script else []
    models = json.loads(Path(args.models).read_text()) if args.models else None

    def stop(signum: int, frame: FrameType | None) -> None:
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, stop)
    with FakeOllama(models=models, replies=replies, port=args.port) as fake:
        print(f"listening on {fake.url}", flush=True)
        with suppress(KeyboardInterrupt):
            threading.Event().wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
