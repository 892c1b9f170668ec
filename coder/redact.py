"""Redaction: secrets never reach a model, a log, a state file or a transcript.

Every tool output, file read, log event and recorded request passes through a `Redactor`
before it leaves the tool layer. Three sources of truth, applied in this order:

1. **Known secrets**: literals registered by the caller (`secrets_from_env_file` for `.env*`
   files, `secrets_from_environ` for the runner's `*KEY*`/`*TOKEN*`/... variables). Literals
   shorter than 6 characters are ignored so that a short value cannot shred the output.
2. **Key formats** with a recognisable shape: AWS, GitHub, GitLab, Slack, OpenAI/Anthropic,
   Google, Stripe, JWTs, PEM private keys, passwords in URLs, `Authorization` headers.
3. **Sensitive assignments**: `password = "..."`, `API_KEY=...`, `"token": "..."`. Only
   *literal* values are redacted: a quoted string, or a bare value that is not code. A bare
   value is kept when it is a (dotted) name without digits (`token = request.args['t']`,
   `password: str`, `secret=self._secret`, `token = None`), a call or subscript (`get_pw()`),
   a reference (`$DB_PASSWORD`, `${X}`) or a small integer (`max_token = 4096` is config, not
   a secret). So `PASSWORD=hunter2` is redacted but `PASSWORD=hunter` is not: register
   `.env` values as known secrets (`secrets_from_env_file`) for those.

Matches become `[REDACTED:<kind>]`. Scanning fails closed: if anything goes wrong the whole
text is replaced by `SCAN_FAILED`, never passed through.

Every pattern is linear-time: unbounded repetitions start only at a boundary (a negative
look-behind on their own character class) and are possessive where backtracking is useless,
so no input can make the scan quadratic or catastrophic.
"""

from __future__ import annotations

import functools
import os
import re
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from coder.files import safeio

SCAN_FAILED = "[REDACTED: text could not be scanned]"
MIN_SECRET_LEN = 6
_MAX_DEPTH = 64


def marker(kind: str) -> str:
    return f"[REDACTED:{kind}]"


@dataclass(frozen=True)
class _Rule:
    """One key format. The group `secret` (or the whole match) is replaced; the regex runs
    only if one of `triggers` occurs in the text (lowercased text when `lower`)."""

    kind: str
    pattern: re.Pattern[str]
    triggers: tuple[str, ...]
    lower: bool = False


_PEM_LABEL = r"-----(?:BEGIN|END)[A-Z0-9 ]{0,40} PRIVATE KEY(?: BLOCK)?-----"
_PEM_HEADER = r"(?:Proc-Type|DEK-Info|Version|Comment):"
# A private key block: the BEGIN line, then what a PEM body is made of (base64, whitespace,
# escaped newlines as in JSON, RFC 1421 headers), then the END line if present. A truncated
# key (no END, e.g. `head key.pem`) is redacted up to where the body stops looking like
# base64. The look-ahead keeps code that merely mentions the BEGIN line intact.
_PEM = re.compile(
    _PEM_LABEL.replace("(?:BEGIN|END)", "BEGIN")
    + rf"(?=(?:\s|\\[nr])*+(?:[A-Za-z0-9+/=]{{16}}|{_PEM_HEADER}))"
    + rf"(?:{_PEM_HEADER}[^\r\n\\]{{0,200}}|[A-Za-z0-9+/=\s]|\\[nrt])*+"
    + rf"(?:{_PEM_LABEL.replace('(?:BEGIN|END)', 'END')})?"
)

_RULES: tuple[_Rule, ...] = (
    _Rule("private_key", _PEM, ("PRIVATE KEY",)),
    _Rule(
        "url_password",
        re.compile(
            r"(?<![A-Za-z0-9+.-])[A-Za-z][A-Za-z0-9+.-]{1,30}://"
            r"[^\s:/?#@\"'<>]{0,256}:(?P<secret>[^\s/?#\"'<>]{1,256})@"
        ),
        ("://",),
    ),
    _Rule(
        "aws_access_key_id",
        re.compile(r"(?<![A-Za-z0-9])(?:AKIA|ASIA)[A-Z0-9]{16}(?![A-Za-z0-9])"),
        ("AKIA", "ASIA"),
    ),
    _Rule(
        "aws_secret_access_key",
        re.compile(
            r"(?i)(?<![a-z0-9_])(?:aws_?)?secret_?(?:access_?)?key[\"']?[ \t]*[:=][ \t]*[\"']?"
            r"(?P<secret>[A-Za-z0-9/+=]{40})(?![A-Za-z0-9/+=])"
        ),
        ("secret",),
        lower=True,
    ),
    _Rule(
        "github_token",
        re.compile(
            r"(?<![A-Za-z0-9_])(?:gh[pousr]_[A-Za-z0-9]{20,}+|github_pat_[A-Za-z0-9_]{20,}+)"
        ),
        ("gh", "github_pat_"),
    ),
    _Rule("gitlab_token", re.compile(r"(?<![A-Za-z0-9_-])glpat-[A-Za-z0-9_-]{20,}+"), ("glpat-",)),
    _Rule("slack_token", re.compile(r"(?<![A-Za-z0-9_-])xox[abprs]-[A-Za-z0-9-]{10,}+"), ("xox",)),
    _Rule(
        "anthropic_key", re.compile(r"(?<![A-Za-z0-9_-])sk-ant-[A-Za-z0-9_-]{20,}+"), ("sk-ant-",)
    ),
    _Rule("openai_key", re.compile(r"(?<![A-Za-z0-9_-])sk-[A-Za-z0-9_-]{32,}+"), ("sk-",)),
    _Rule("google_api_key", re.compile(r"(?<![A-Za-z0-9_-])AIza[A-Za-z0-9_-]{30,}+"), ("AIza",)),
    _Rule(
        "stripe_key",
        re.compile(r"(?<![A-Za-z0-9_])(?:sk|rk)_(?:live|test)_[A-Za-z0-9]{16,}+"),
        ("_live_", "_test_"),
    ),
    _Rule(
        "jwt",
        re.compile(
            r"(?<![A-Za-z0-9_-])eyJ[A-Za-z0-9_-]{4,}+\.eyJ[A-Za-z0-9_-]{4,}+\.[A-Za-z0-9_-]*+"
        ),
        ("eyJ",),
    ),
    _Rule(
        "authorization",
        re.compile(
            r"(?i)(?<![a-z0-9_-])(?:proxy-)?authorization[\"']?[ \t]*[:=][ \t]*[\"']?"
            r"(?:(?:bearer|basic|token|digest)[ \t]+)?(?P<secret>[A-Za-z0-9._~+/=-]{8,}+)"
        ),
        ("authorization",),
        lower=True,
    ),
    _Rule(
        "bearer_token",
        re.compile(r"(?i)(?<![a-z0-9_-])bearer[ \t]+(?P<secret>[A-Za-z0-9._~+/-]{16,}+=*+)"),
        ("bearer",),
        lower=True,
    ),
)

_KEYWORD = (
    r"(?:password|passwd|secret|token|api[_-]?key|access[_-]?key|private[_-]?key|secret[_-]?key)"
)
_ASSIGN_TRIGGERS = ("pass", "secret", "token", "key")
# name (ending in a keyword) [closing quote] separator value. Separators: = : => (not ==).
_ASSIGNMENT = re.compile(
    rf"(?i)(?<![a-z0-9_.-])(?P<name>[a-z0-9_.-]{{0,40}}?(?P<kw>{_KEYWORD}))(?![a-z0-9_])"
    r"[\"']?[ \t]*(?:=>|[:=](?!=))[ \t]*"
    r"(?P<value>\"(?:[^\"\\\r\n]|\\.)*+\"?|'(?:[^'\\\r\n]|\\.)*+'?|`[^`\r\n]*+`?"
    r"|[^\s'\"`,;&()\[\]{}<>]++)"
)
_SENSITIVE_KEY = re.compile(rf"(?i){_KEYWORD}\Z|(?:^|[_-])(?:authorization|cookie)\Z")
_CODE_NAME = re.compile(r"[A-Za-z_][A-Za-z_.]*")
_SMALL_INT = re.compile(r"-?\d{1,4}")
_PLACEHOLDER = re.compile(r"\$\{?\w+\}?|\{\{.*\}\}|<[^<>]*>|%\(\w+\)s|\*+|\[REDACTED.*", re.DOTALL)


def _is_literal_secret(value: str, bare: bool, next_char: str) -> bool:
    """Whether an assigned value is a literal worth redacting (see the module docstring)."""
    if not value or _PLACEHOLDER.fullmatch(value):
        return False
    if not bare:
        return True
    code = _CODE_NAME.fullmatch(value) or next_char in ("(", "[") or value.startswith(("$", "%"))
    return not code and not _SMALL_INT.fullmatch(value)


def _redact_assignment(m: re.Match[str]) -> str:
    value = m.group("value")
    quote = value[0] if value[0] in "\"'`" else ""
    closed = bool(quote) and len(value) > 1 and value.endswith(quote)
    inner = value[len(quote) : len(value) - (1 if closed else 0)]
    next_char = m.string[m.end() : m.end() + 1]
    if not _is_literal_secret(inner, bare=not quote, next_char=next_char):
        return m.group(0)
    start = m.start("value") - m.start() + len(quote)
    whole = m.group(0)
    return (
        whole[:start]
        + marker(m.group("kw").lower().replace("-", "_"))
        + whole[start + len(inner) :]
    )


def _replacer(kind: str) -> Callable[[re.Match[str]], str]:
    def replace(m: re.Match[str]) -> str:
        if "secret" not in m.re.groupindex:
            return marker(kind)
        whole, offset = m.group(0), m.start()
        return (
            whole[: m.start("secret") - offset] + marker(kind) + whole[m.end("secret") - offset :]
        )

    return replace


_REPLACERS = {rule.kind: _replacer(rule.kind) for rule in _RULES}

# Every trigger, flat (the assignments' too): most texts hold none, and one plain loop that
# says so costs a seventh of asking rule by rule (a log line's fields: 2 us, not 13).
_CASED_TRIGGERS = tuple(
    dict.fromkeys(t for rule in _RULES if not rule.lower for t in rule.triggers)
)
_LOWER_TRIGGERS = tuple(
    dict.fromkeys([*(t for rule in _RULES if rule.lower for t in rule.triggers), *_ASSIGN_TRIGGERS])
)


def _triggered(text: str, lowered: str) -> bool:
    for trigger in _CASED_TRIGGERS:
        if trigger in text:
            return True
    for trigger in _LOWER_TRIGGERS:
        if trigger in lowered:
            return True
    return False


def _scan(text: str, known: re.Pattern[str] | None) -> str:
    if not isinstance(text, str):
        raise TypeError(f"cannot scan {type(text).__name__}")
    if known is not None:
        text = known.sub(marker("known_secret"), text)
    lowered = text.lower()
    if not _triggered(text, lowered):
        return text
    for rule in _RULES:
        haystack = lowered if rule.lower else text
        if any(t in haystack for t in rule.triggers):
            text = rule.pattern.sub(_REPLACERS[rule.kind], text)
            if rule.lower:
                lowered = text.lower()
    if any(t in lowered for t in _ASSIGN_TRIGGERS):
        text = _ASSIGNMENT.sub(_redact_assignment, text)
    return text


@functools.lru_cache(maxsize=32)
def _compile_known(secrets: frozenset[str], flags: int = 0) -> re.Pattern[str] | None:
    usable = sorted((s for s in secrets if len(s) >= MIN_SECRET_LEN), key=len, reverse=True)
    if not usable:
        return None
    # Longest first, so a secret that contains another is replaced whole.
    return re.compile("|".join(re.escape(s) for s in usable), flags)


class Redactor:
    """Known secrets plus the built-in formats. Thread-safe; `redact` never raises."""

    def __init__(self, known_secrets: Iterable[str] = ()) -> None:
        self._lock = threading.Lock()
        self._secrets: frozenset[str] = frozenset()
        self._known: re.Pattern[str] | None = None
        self.add(*known_secrets)

    def add(self, *secrets: str) -> None:
        """Register literal secrets (those shorter than MIN_SECRET_LEN are ignored)."""
        fresh = {s for s in secrets if isinstance(s, str) and len(s) >= MIN_SECRET_LEN}
        with self._lock:
            if fresh - self._secrets:
                self._secrets = self._secrets | fresh
                self._known = _compile_known(self._secrets)

    def add_env_file(self, text: str) -> None:
        self.add(*secrets_from_env_file(text))

    def __len__(self) -> int:
        return len(self._secrets)

    @property
    def known(self) -> frozenset[str]:
        """The registered secrets (to key what is computed with them, in memory only)."""
        with self._lock:
            return self._secrets

    def mentions_known(self, text: str) -> bool:
        """Whether `text` holds a registered secret, in any letter case (a search index's
        tokens are lower-cased): what a cache file written before the secret was known may
        hold."""
        pattern = _compile_known(self.known, re.IGNORECASE)
        return pattern is not None and pattern.search(text) is not None

    def redact(self, text: str) -> str:
        try:
            return self._scan(text)
        except Exception:  # noqa: BLE001 (fail closed: an unscannable text never passes)
            return SCAN_FAILED

    def redact_obj(self, obj: Any) -> Any:
        """A copy of `obj` with every string redacted (dicts, lists, tuples, recursively).

        Values under a sensitive key (`password`, `api_key`, `*_token`, `authorization`, ...)
        are redacted whole. Objects that are not JSON values are turned into redacted strings,
        because a JSON encoder with `default=str` would print them raw. Keys are kept."""
        try:
            return self._redact_obj(obj, 0)
        except Exception:  # noqa: BLE001 (fail closed, as in `redact`)
            return SCAN_FAILED

    def _scan(self, text: str) -> str:
        """The scanner itself (a seam: tests make it raise to check that we fail closed)."""
        with self._lock:
            known = self._known
        return _scan(text, known)

    def _redact_obj(self, obj: Any, depth: int) -> Any:
        if depth > _MAX_DEPTH:
            raise RecursionError("structure too deep to redact")
        if isinstance(obj, str):
            return self.redact(obj)
        if obj is None or isinstance(obj, (bool, int, float)):
            return obj
        if isinstance(obj, dict):
            return {k: self._redact_field(k, v, depth + 1) for k, v in obj.items()}
        if isinstance(obj, (list, tuple)):
            items = [self._redact_obj(v, depth + 1) for v in obj]
            return items if isinstance(obj, list) else tuple(items)
        return self.redact(str(obj))

    def _redact_field(self, key: Any, value: Any, depth: int) -> Any:
        sensitive = _SENSITIVE_KEY.search(key) if isinstance(key, str) else None
        if sensitive and isinstance(value, str) and _is_literal_secret(value, False, ""):
            return marker(sensitive.group(0).lower().strip("_-").replace("-", "_"))
        return self._redact_obj(value, depth)


def redact(text: str, known_secrets: Iterable[str] = ()) -> str:
    """Redact one text (fails closed, like `Redactor.redact`)."""
    return Redactor(known_secrets).redact(text)


_ENV_LINE = re.compile(
    r"[ \t]*(?:export[ \t]+)?(?P<key>[A-Za-z_][A-Za-z0-9_.-]*)[ \t]*=[ \t]*(?P<rest>.*)"
)
_SECRET_NAME = re.compile(
    r"(?i)key|secret|token|pass|pwd|auth(?!or)|credential|private|signature|salt|dsn|cookie"
    r"|session"
)
# The variables the command sandbox scrubs (RELIABILITY, safety defaults).
_SECRET_ENV_NAME = re.compile(r"(?i)key|secret|token|password|passwd|credential")
_HAS_DIGIT = re.compile(r"\d")
_HAS_LETTER = re.compile(r"[A-Za-z]")


def _env_value_is_secret(key: str, value: str) -> bool:
    """Every value under a secret-sounding name; otherwise only values that look random
    (8+ characters, letters and digits, no spaces). Registering `NODE_ENV=production` or
    `HOST=localhost` would redact every "production" and "localhost" the model reads."""
    if _SECRET_NAME.search(key):
        return True
    return (
        len(value) >= 8
        and not any(c.isspace() for c in value)
        and bool(_HAS_DIGIT.search(value))
        and bool(_HAS_LETTER.search(value))
    )


def _parse_env_value(rest: str, following: Iterable[str]) -> tuple[list[str], int]:
    """The value(s) of one assignment and how many extra lines a multi-line quote used."""
    quote = rest[:1]
    if quote not in ("'", '"'):
        return [rest.split(" #", 1)[0].split("\t#", 1)[0].strip()], 0
    body, used = rest[1:], 0
    lines = iter(following)
    while _closing_quote(body, quote) < 0:
        nxt = next(lines, None)
        if nxt is None:
            break
        body, used = body + "\n" + nxt, used + 1
    end = _closing_quote(body, quote)
    raw = body[:end] if end >= 0 else body
    if quote == "'" or "\\" not in raw:
        return [raw], used
    unescaped = (
        raw.replace("\\n", "\n").replace("\\t", "\t").replace('\\"', '"').replace("\\\\", "\\")
    )
    return [raw, unescaped], used


def _closing_quote(body: str, quote: str) -> int:
    i = 0
    while i < len(body):
        if body[i] == "\\" and quote == '"':
            i += 2
            continue
        if body[i] == quote:
            return i
        i += 1
    return -1


def secrets_from_env_file(text: str) -> list[str]:
    """The secret values of a `.env`-style file (`KEY=VALUE`, `export KEY=VALUE`, quoted and
    multi-line quoted values), to register as known secrets. See `_env_value_is_secret`."""
    lines = text.splitlines()
    found: list[str] = []
    i = 0
    while i < len(lines):
        m = _ENV_LINE.fullmatch(lines[i])
        i += 1
        if not m:
            continue
        values, used = _parse_env_value(m.group("rest").rstrip(), lines[i:])
        i += used
        found += [v for v in values if v and _env_value_is_secret(m.group("key"), v)]
    return list(dict.fromkeys(found))


def secrets_from_environ(environ: Mapping[str, str] | None = None) -> list[str]:
    """Values of the environment's `*KEY*`, `*SECRET*`, `*TOKEN*`, `*PASSWORD*` variables (the
    runner's own environment by default): register them so that a command that obtains one
    anyway cannot print it into a log or a prompt."""
    env = os.environ if environ is None else environ
    values = (v for k, v in sorted(env.items()) if _SECRET_ENV_NAME.search(k) and v.strip())
    return list(dict.fromkeys(values))


# Folders no `.env` finder looks in: coder's and git's own, dependencies, virtualenvs.
_ENV_FILE_SKIP = frozenset({".git", ".coder", "node_modules", ".venv", "venv", "__pycache__"})
ENV_FILE_MAX_BYTES = 1 << 20


def is_env_file(name: str) -> bool:
    """Whether a file named `name` holds `KEY=VALUE` secrets: `.env`, `.env.*` (`.env.local`)
    and direnv's `.envrc` (`export KEY=VALUE`), in any case. The one name rule of every `.env`
    finder; not `.environment` or `.envoy.yaml`, which only start the same."""
    lowered = name.lower()
    return lowered in (".env", ".envrc") or lowered.startswith(".env.")


def is_env_path(rel_posix: str, depth: int | None = None) -> bool:
    """Whether the root-relative `rel_posix` is an env file a finder registers: its name by
    `is_env_file`, at most `depth` folders down (None: any), none of them skipped."""
    *folders, name = rel_posix.split("/")
    if depth is not None and len(folders) > depth:
        return False
    return is_env_file(name) and not _ENV_FILE_SKIP.intersection(folders)


def find_env_files(
    root: Path, *, depth: int | None = None, max_files: int = 50_000
) -> Iterator[Path]:
    """The env files under `root` (`is_env_path`), tracked or not, in walk order; folder
    symlinks are not followed, a symlinked file is (its values are as secret). Stops after
    `max_files` files looked at, so that a huge tree cannot stall a run's start."""
    seen = 0
    for folder, dirs, files in os.walk(root):
        rel = os.path.relpath(folder, root)
        level = 0 if rel == "." else rel.count(os.sep) + 1
        dirs[:] = [] if depth is not None and level >= depth else dirs
        dirs[:] = [d for d in dirs if d not in _ENV_FILE_SKIP]
        seen += len(files)
        if seen > max_files:
            return
        yield from (Path(folder, name) for name in sorted(files) if is_env_file(name))


def read_env_file(path: Path) -> list[str]:
    """The secret values of the env file at `path` ([] when unreadable, not a regular file or
    over ENV_FILE_MAX_BYTES). A command may have left the file: it is read through
    coder.files.safeio (one non-blocking open, checked on the descriptor: a FIFO swapped in
    after a check never blocks), and at most the cap is read (a /proc file reports 0 bytes
    whatever it holds). A link is followed: the user's `.env -> ../shared/.env` holds
    secrets too, and what is read only ever takes text out of what coder shows."""
    try:
        data = safeio.read_regular(path, limit=ENV_FILE_MAX_BYTES + 1)
    except OSError:  # NotRegular too
        return []
    if len(data) > ENV_FILE_MAX_BYTES:
        return []
    return secrets_from_env_file(data.decode("utf-8", errors="replace"))


def secrets_from_repo(root: Path, *, max_files: int = 50_000) -> list[str]:
    """The secret values of every env file under `root` (`find_env_files`), to register
    before a command can print one."""
    found = [v for path in find_env_files(root, max_files=max_files) for v in read_env_file(path)]
    return list(dict.fromkeys(found))


def secret_name(name: str) -> bool:
    """Whether a variable or setting named `name` holds a secret (`API_KEY`, `db_password`)."""
    return bool(_SECRET_NAME.search(name))
