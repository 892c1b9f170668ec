"""The credential of `coder mcp serve --http`: one bearer token per user.

Every local process can connect to 127.0.0.1, so the HTTP transport answers only requests that
carry `Authorization: Bearer TOKEN`; any other request gets 401 before the MCP app sees it, and
nothing runs. The token is compared in constant time.

It is generated on first use (32 random bytes, URL-safe) and kept in the user's config dir
(`$XDG_CONFIG_HOME/coder/mcp-token`, default `~/.config/coder/`, beside the user config and
the trust records), mode 0600 in a 0700 directory. Not in the repository's `.coder/`: a
repository can ship a `.coder/` directory (and with it a token its author knows), the
checkout is where the server's commands write, and one token per user means one client
setting for every repository served. It is read again for every request, so `coder mcp token
--new` shuts out the old one at once, also in a server already running.
"""

from __future__ import annotations

import hmac
import json
import os
import re
import secrets
import stat
from collections.abc import Awaitable, Callable, MutableMapping
from pathlib import Path
from typing import Any

from coder import config
from coder.errors import EnvironmentProblem
from coder.files.durable import write_atomic

TOKEN_FILE = "mcp-token"
_SHAPE = re.compile(r"[A-Za-z0-9._~+/=-]{16,512}")  # a bearer token's characters (RFC 6750)
_NEW_HINT = "`coder mcp token --new` writes a new, private one"


def token_path() -> Path:
    return config.user_config_path().parent / TOKEN_FILE


def read_token(path: Path) -> str:
    """The token in `path`. FileNotFoundError if there is none; EnvironmentProblem if it is
    not a private regular file of this user holding a token."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_uid != os.geteuid():
            raise EnvironmentProblem(f"{path} is not a file of yours", hint=_NEW_HINT)
        if info.st_mode & 0o077:
            raise EnvironmentProblem(
                f"{path} can be read by other users (mode {stat.S_IMODE(info.st_mode):04o}), "
                "so the token in it may be known",
                hint=_NEW_HINT,
            )
        text = os.read(fd, 1024).decode("ascii", errors="replace").strip()
    finally:
        os.close(fd)
    if not _SHAPE.fullmatch(text):
        raise EnvironmentProblem(f"{path} does not hold a bearer token", hint=_NEW_HINT)
    return text


def load_token() -> str:
    """The user's token, generated now if there is none yet."""
    path = token_path()
    try:
        return read_token(path)
    except FileNotFoundError:
        return new_token()


def new_token() -> str:
    """Generate a token, replacing the one there was; returns it."""
    path = token_path()
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    token = secrets.token_urlsafe(32)
    try:
        path.unlink()  # a new file: write_atomic keeps an existing file's mode
    except FileNotFoundError:
        pass
    write_atomic(path, f"{token}\n".encode("ascii"), new_mode=0o600, crash_point=None)
    return token


def how_to_connect(url: str, token: str) -> str:
    """What `coder mcp serve --http` prints: the header, and a client's settings with it."""
    header = f"Authorization: Bearer {token}"
    server = {"type": "http", "url": url, "headers": {"Authorization": f"Bearer {token}"}}
    settings = {"mcpServers": {"coder": server}}
    return "\n".join(
        [
            f"coder mcp: every request needs the header `{header}`",
            f"  (the token is in {token_path()}; `coder mcp token --new` replaces it)",
            "  Claude Code:",
            f'    claude mcp add --transport http coder {url} --header "{header}"',
            "  an MCP client's JSON settings (.mcp.json and the like):",
            f"    {json.dumps(settings)}",
        ]
    )


Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]


class RequireToken:
    """ASGI middleware: an HTTP request whose one `Authorization` header is not `Bearer` and
    the token in `path` gets 401, and the wrapped app never sees it. Lifespan events pass."""

    def __init__(self, app: App, path: Path) -> None:
        self.app, self.path = app, path

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self.app(scope, receive, send)
        elif scope["type"] == "http" and self._authorized(scope):
            await self.app(scope, receive, send)
        elif scope["type"] == "http":
            await _unauthorized(send)
        elif scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})

    def _authorized(self, scope: Scope) -> bool:
        given = [v for k, v in scope.get("headers", ()) if k.lower() == b"authorization"]
        try:
            expected = read_token(self.path).encode("ascii")
        except (OSError, EnvironmentProblem):  # no usable token: nobody gets in
            return False
        if len(given) != 1:
            return False
        scheme, _, value = bytes(given[0]).partition(b" ")
        return scheme.lower() == b"bearer" and hmac.compare_digest(value.strip(), expected)


async def _unauthorized(send: Send) -> None:
    body = json.dumps(
        {
            "error": "unauthorized",
            "error_description": "send the header `Authorization: Bearer TOKEN` with the "
            "token `coder mcp token` prints",
        }
    ).encode()
    await send(
        {
            "type": "http.response.start",
            "status": 401,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"www-authenticate", b'Bearer realm="coder mcp"'),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
