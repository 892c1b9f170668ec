"""A protocol-faithful fake OpenAI-compatible server (llama.cpp's `llama-server`, vLLM, ...) for
tests, driven with the real `openai` SDK over HTTP on 127.0.0.1.

What it speaks, as those servers do:
- `POST /v1/chat/completions`: with `stream: true`, server-sent events (`data: {chunk}\\n\\n`,
  chunked transfer encoding): a first chunk with the role, word-sized content deltas, each tool
  call as a first delta (index, id, type, name, empty arguments) then its JSON arguments split
  over several deltas, a last chunk with `finish_reason` (stop | tool_calls | length), a usage
  chunk (`choices: []`) when `stream_options.include_usage` is set, then `data: [DONE]`;
  without streaming, one `chat.completion` object;
- `slots` (tests/prefix_cache.py): as many chat requests served at once, each on a slot (the
  one its `id_slot` names, as llama.cpp's, else an idle one), the rest queued; every request
  recorded with its times and slot (`cache.spans`); with `pace`, an answer takes the time its
  timings report, on each slot at once (a fixed rate per slot);
- usage with `prompt_tokens_details.cached_tokens` from its slot's prefix cache (the longest
  common prefix, in characters / 4, of the rendered request with the prompt its slot holds, as
  a server's KV cache would reuse), and llama.cpp's `timings` (cache_n, prompt_n, prompt_ms,
  predicted_n, predicted_ms) on the last chunk, and with `timings_per_token` on every chunk
  (as llama.cpp does on request: a client that stops reading early still has them);
- `POST /v1/embeddings`: one vector per input (`input` a string or a list of them), as
  floats or, with `encoding_format: base64` (the SDK's default), little-endian float32 in
  base64, with `usage`; a model without the `embedding` capability gets llama.cpp's 501 for a
  server started without `--embeddings`;
- `GET /v1/models` (vLLM's `max_model_len` on each model), llama.cpp's `GET /props`
  (`default_generation_settings.n_ctx`, `total_slots`), `GET /health`;
- llama.cpp's `POST /apply-template` (`{"prompt"}`: the request as the fake renders it; off
  with `templates=False`, as on vLLM). A model with `"template_tools": False` is served as
  llama.cpp serves a GGUF whose chat template drops `tools`: they are accepted and never
  reach the prompt (nor its token count), and the model never calls them;
- errors as `{"error": {"message", "type", "code"}}` with the status (404 for an unknown model,
  400 for tools on a model without them); scripted faults from `Reply` (tests/fake_ollama.py):
  `http_status`, `error_mid_stream` (an error event after the first delta), a dropped
  connection, a malformed line, `end_early` (a clean end before the final chunk), `no_done`
  (the whole reply without the closing `[DONE]`), `delay_s`, `chunk_delay_s` (a pause before
  each chunk: a model's generation speed; a client that closes the stream stops it);
  a stalled server (`stall`, as in tests/fake_ollama.py).

    with FakeOpenAI() as fake:
        fake.enqueue(Reply(content="hi"), Reply(tool_calls=[{"name": "f", "arguments": {}}]))
        openai.OpenAI(base_url=fake.url, api_key="x").chat.completions.create(...)
        fake.chat_bodies()[0]["messages"]; fake.cache.cached[0]

Run as a script (a separate process; prints `listening on URL`):

    python tests/fake_openai.py --port 0 --script replies.json
"""

from __future__ import annotations

import argparse
import base64
import json
import signal
import socket
import struct
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import suppress
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from types import FrameType
from typing import Any

if __name__ == "__main__":  # run as a script: make `tests` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.fake_ollama import (  # noqa: E402
    NO_REPLY_LEFT,
    FakeServer,
    RecordedRequest,
    Reply,
    _pieces,
    _Server,
    embedding,
)
from tests.prefix_cache import is_priming, render  # noqa: E402

MODEL = "qwen2.5-coder-7b-instruct"
DEFAULT_MODELS: dict[str, dict[str, Any]] = {
    MODEL: {"context_length": 32768, "capabilities": ["tools"]},
}
MS_PER_PROMPT_TOKEN = 0.25  # 4000 tokens/s prompt processing
MS_PER_EVAL_TOKEN = 20.0  # 50 tokens/s generation
CREATED = 1_767_225_600


class FakeOpenAI(FakeServer):
    name = "fake-openai"

    def __init__(
        self,
        models: dict[str, dict[str, Any]] | None = None,
        replies: list[Reply | dict[str, Any] | str] | None = None,
        port: int = 0,
        slots: int = 1,
        llama_cpp: bool = True,
        templates: bool = True,
        pace: float = 0.0,
    ) -> None:
        self.models = dict(DEFAULT_MODELS if models is None else models)
        # An answer takes the time its timings report (the uncached prompt, then each token),
        # times `pace`, on each slot at once (0: no time)
        self.pace = pace
        self.llama_cpp = llama_cpp  # False: no /props (vLLM and others): a 404 there
        self.templates = templates  # llama.cpp's /apply-template is served
        self.priming = Reply(content="ok")  # the answer to a warm prefix (a `delay_s`: slow)
        super().__init__(_Handler, replies, port, slots)

    @property
    def url(self) -> str:
        """The base URL clients use (the /v1 URL)."""
        return f"{self.root}/v1"

    def chat_bodies(self) -> list[dict[str, Any]]:
        """The chat requests, warm-prefix (priming) requests left out."""
        with self._lock:
            return [
                r.body
                for r in self.requests
                if r.path.endswith("/chat/completions") and not is_priming(r.body or {})
            ]


def _as_prompted(body: dict[str, Any], model: dict[str, Any]) -> dict[str, Any]:
    """The request as far as it reaches the prompt: without its tools for a model whose
    chat template drops them."""
    if model.get("template_tools", True):
        return body
    return {k: v for k, v in body.items() if k != "tools"}


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        pass

    @property
    def fake(self) -> FakeOpenAI:
        return self.server.fake  # type: ignore[no-any-return]

    def do_GET(self) -> None:
        self.fake.record(RecordedRequest("GET", self.path, None, b"", self._headers()))
        if self.path == "/v1/models":
            self._json(200, {"object": "list", "data": [self._model(n) for n in self.fake.models]})
        elif self.path == "/props" and self.fake.llama_cpp:
            ctx = next(iter(self.fake.models.values()), {}).get("context_length", 4096)
            self._json(
                200,
                {
                    "default_generation_settings": {"n_ctx": ctx},
                    "total_slots": self.fake.cache.size,
                    "build_info": "b9999-fake",
                },
            )
        elif self.path == "/health":
            self._json(200, {"status": "ok"})
        else:
            self._error(404, "File Not Found", "not_found_error")

    def do_POST(self) -> None:
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = None
        self.fake.record(RecordedRequest("POST", self.path, body, raw, self._headers()))
        if self.path == "/v1/embeddings":
            self._embeddings(body)
        elif self.path == "/apply-template" and self.fake.templates:
            self._apply_template(body)
        elif self.path != "/v1/chat/completions":
            self._error(404, "File Not Found", "not_found_error")
        elif not isinstance(body, dict) or not isinstance(body.get("messages"), list):
            self._error(400, "'messages' is required", "invalid_request_error")
        elif body.get("model") not in self.fake.models:
            self._error(404, f"The model `{body.get('model')}` does not exist.", "NotFoundError")
        elif body.get("tools") and "tools" not in self.fake.models[body["model"]].get(
            "capabilities", []
        ):
            self._error(
                400,
                '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser '
                "to be set",
                "BadRequestError",
            )
        else:
            self._chat(body)

    def _headers(self) -> dict[str, str]:
        return {k.lower(): v for k, v in self.headers.items()}

    def _model(self, name: str) -> dict[str, Any]:
        conf = self.fake.models[name]
        return {
            "id": name,
            "object": "model",
            "created": CREATED,
            "owned_by": "fake",
            "max_model_len": conf.get("context_length", 4096),
        }

    def _apply_template(self, body: Any) -> None:
        """llama.cpp renders the conversation through the model's chat template; here the
        fake's rendering (tests/prefix_cache.render) of what reaches the prompt."""
        if not isinstance(body, dict) or not isinstance(body.get("messages"), list):
            self._error(400, "'messages' is required", "invalid_request_error")
            return
        model = next(iter(self.fake.models.values()), {})  # llama-server serves one model
        if body.get("tools") and "tools" not in model.get("capabilities", []):
            self._error(500, "tools param requires --jinja flag", "server_error")
            return
        self._json(200, {"prompt": render(_as_prompted(body, model))})

    # -- embeddings ---------------------------------------------------------------------------

    def _embeddings(self, body: Any) -> None:
        texts = body.get("input") if isinstance(body, dict) else None
        if isinstance(texts, str):
            texts = [texts]
        if not isinstance(texts, list) or not texts or not all(isinstance(t, str) for t in texts):
            self._error(
                400, "'input' must be a string or a list of strings", "invalid_request_error"
            )
            return
        name = body.get("model")
        if name not in self.fake.models:
            self._error(404, f"The model `{name}` does not exist.", "NotFoundError")
            return
        if "embedding" not in self.fake.models[name].get("capabilities", []):
            self._error(
                501,
                "This server does not support embeddings. Start it with `--embeddings`",
                "not_supported_error",
            )
            return
        data = []
        for index, text in enumerate(texts):
            vector: Any = embedding(text)
            if body.get("encoding_format") == "base64":
                vector = base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode()
            data.append({"object": "embedding", "index": index, "embedding": vector})
        tokens = sum(max(1, len(t) // 4) for t in texts)
        self._json(
            200,
            {
                "object": "list",
                "data": data,
                "model": name,
                "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
            },
        )

    # -- chat ---------------------------------------------------------------------------------

    def _chat(self, body: dict[str, Any]) -> None:
        if self.fake.stall is not None:
            if self.fake.stall == "stream":  # the headers and the role's chunk, then nothing
                self._stream_head()
                first = {"role": "assistant", "content": ""}
                self._event(json.dumps(self._chunk(body, "chatcmpl-stalled", first, None)))
            self.fake.hold(self)
            return
        slot = body.get("id_slot")  # llama.cpp: the slot the client names, else an idle one
        prompted = _as_prompted(body, self.fake.models[body["model"]])
        try:
            with self.fake.cache.serve(prompted, slot, self.server.stopping) as read:
                self._answer(body, prompted, read)
        except ConnectionAbortedError:
            self.close_connection = True

    def _answer(
        self, body: dict[str, Any], prompted: dict[str, Any], read: Callable[[], int]
    ) -> None:
        reply = self.fake.priming if is_priming(body) else self.fake.reply_for(body)
        if reply is None:
            self._error(500, NO_REPLY_LEFT, "server_error")
            return
        if reply.delay_s and self.fake.pause(self, reply.delay_s):
            return
        if reply.http_status is not None:
            self._error(reply.http_status, reply.error, "server_error")
            return
        cached = read()
        usage = self._usage(body, reply, len(render(prompted)) // 4, cached)
        completion_id = self.fake.next_id("chatcmpl-")
        self._body = body
        if body.get("stream"):
            include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
            self._stream(
                list(self._chunks(body, reply, completion_id)), reply, usage, include_usage
            )
        else:
            self._json(200, self._whole(body, reply, completion_id, usage))

    def _usage(
        self, body: dict[str, Any], reply: Reply, prompt: int, cached: int
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        if reply.prompt_eval_count is not None:
            prompt = reply.prompt_eval_count
        cached = min(cached, prompt)
        generated = reply.eval_count
        if generated is None:
            text = reply.content + (json.dumps(reply.tool_calls) if reply.tool_calls else "")
            generated = max(1, len(text) // 4)
        usage = {
            "prompt_tokens": prompt,
            "completion_tokens": generated,
            "total_tokens": prompt + generated,
            "prompt_tokens_details": {"cached_tokens": cached},
        }
        timings = {
            "cache_n": cached,
            "prompt_n": prompt - cached,
            "prompt_ms": (prompt - cached) * MS_PER_PROMPT_TOKEN,
            "predicted_n": generated,
            "predicted_ms": generated * MS_PER_EVAL_TOKEN,
        }
        return usage, timings

    def _chunk(self, body: dict[str, Any], cid: str, delta: dict[str, Any], finish: Any) -> Any:
        return {
            "id": cid,
            "object": "chat.completion.chunk",
            "created": CREATED,
            "model": body["model"],
            "system_fingerprint": "fp_fake",
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
        }

    def _chunks(self, body: dict[str, Any], reply: Reply, cid: str) -> Iterator[dict[str, Any]]:
        """Every chunk but the final one (finish_reason) and the usage chunk."""
        yield self._chunk(body, cid, {"role": "assistant", "content": ""}, None)
        for piece in _pieces(reply.content):
            yield self._chunk(body, cid, {"content": piece}, None)
        for index, call in enumerate(reply.tool_calls):
            first = {
                "index": index,
                "id": self.fake.next_id("call_"),
                "type": "function",
                "function": {"name": call["name"], "arguments": ""},
            }
            yield self._chunk(body, cid, {"tool_calls": [first]}, None)
            arguments = json.dumps(call.get("arguments", {}))
            third = max(1, len(arguments) // 3)
            for start in range(0, len(arguments), third):
                piece = {
                    "index": index,
                    "function": {"arguments": arguments[start : start + third]},
                }
                yield self._chunk(body, cid, {"tool_calls": [piece]}, None)

    def _finish(self, reply: Reply) -> str:
        if reply.done_reason == "length":
            return "length"
        return "tool_calls" if reply.tool_calls else "stop"

    def _stream(
        self,
        chunks: list[dict[str, Any]],
        reply: Reply,
        usage: tuple[dict[str, Any], dict[str, Any]],
        include_usage: bool,
    ) -> None:
        self._stream_head()
        if self._body.get("timings_per_token"):  # llama.cpp: the prompt's figures from the
            for n, chunk in enumerate(chunks[1:], 1):  # first token on, generation's so far
                chunk["timings"] = {
                    **usage[1],
                    "predicted_n": n,
                    "predicted_ms": n * MS_PER_EVAL_TOKEN,
                }
        final = dict(chunks[0], choices=[{**chunks[0]["choices"][0], "delta": {}}])
        final["choices"][0]["finish_reason"] = self._finish(reply)
        final["timings"] = usage[1]  # llama.cpp puts its timings on the last chunk
        tail = [final]
        if include_usage:
            tail.append(dict(chunks[0], choices=[], usage=usage[0], timings=usage[1]))
        faulty = (
            reply.error_mid_stream is not None
            or reply.drop_connection_mid_stream
            or reply.malformed_line
            or reply.end_early
        )
        events = chunks[:2] if faulty else chunks + tail
        prompt_s = usage[1]["prompt_ms"] / 1000 * self.fake.pace  # before the first token
        per_chunk = reply.chunk_delay_s or usage[1]["predicted_ms"] / 1000 * self.fake.pace / len(
            events
        )
        try:
            if prompt_s and self.fake.pause(self, prompt_s):
                raise ConnectionAbortedError
            for event in events:
                if per_chunk and self.fake.pause(self, per_chunk):
                    raise ConnectionAbortedError
                self._event(json.dumps(event))
            if reply.drop_connection_mid_stream:
                self._write_chunk(b"data: " + json.dumps(chunks[-1]).encode()[:20])
                raise ConnectionAbortedError
            if reply.malformed_line:
                self._event("<html>this is not json</html>")
            elif reply.error_mid_stream is not None:
                self._event(
                    json.dumps(
                        {"error": {"message": reply.error_mid_stream, "type": "server_error"}}
                    )
                )
            elif not faulty and not reply.no_done:
                self._event("[DONE]")
            self.wfile.write(b"0\r\n\r\n")
        except OSError:
            self.close_connection = True
            with suppress(OSError):
                self.connection.shutdown(socket.SHUT_RDWR)

    def _whole(
        self,
        body: dict[str, Any],
        reply: Reply,
        cid: str,
        usage: tuple[dict[str, Any], dict[str, Any]],
    ) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": reply.content}
        if reply.tool_calls:
            message["tool_calls"] = [
                {
                    "id": self.fake.next_id("call_"),
                    "type": "function",
                    "function": {
                        "name": c["name"],
                        "arguments": json.dumps(c.get("arguments", {})),
                    },
                }
                for c in reply.tool_calls
            ]
        return {
            "id": cid,
            "object": "chat.completion",
            "created": CREATED,
            "model": body["model"],
            "choices": [{"index": 0, "message": message, "finish_reason": self._finish(reply)}],
            "usage": usage[0],
            "timings": usage[1],
        }

    # -- responses ----------------------------------------------------------------------------

    def _stream_head(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

    def _event(self, data: str) -> None:
        self._write_chunk(f"data: {data}\n\n".encode())

    def _write_chunk(self, data: bytes) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def _json(self, status: int, payload: Any) -> None:
        data = json.dumps(payload).encode()
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        except OSError:
            self.close_connection = True

    def _error(self, status: int, message: str, kind: str) -> None:
        self._json(status, {"error": {"message": message, "type": kind, "code": status}})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Serve a fake OpenAI-compatible API.")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--script", help="JSON file: a list of replies (objects or strings)")
    parser.add_argument("--models", help="JSON file: {model name: {context_length, ...}}")
    args = parser.parse_args(argv)
    replies = json.loads(Path(args.script).read_text()) if args.script else []
    models = json.loads(Path(args.models).read_text()) if args.models else None

    def stop(signum: int, frame: FrameType | None) -> None:
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, stop)
    with FakeOpenAI(models=models, replies=replies, port=args.port) as fake:
        print(f"listening on {fake.url}", flush=True)
        with suppress(KeyboardInterrupt):
            threading.Event().wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
