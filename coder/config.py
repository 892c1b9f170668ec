"""Configuration: defaults < user file < project file < environment < flags.

Each value remembers where it came from, so `coder config` can say why it is what it is.
Files are JSON, checked against `schemas/config.schema.json`; a bad file is an error that names
the file, the field and the fix, and nothing runs.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from coder.errors import DocumentError, EnvironmentProblem, InvalidInput
from coder.schemas import validator

PROJECT_FILE = "coder.config.json"
DEFAULT_MODEL = "qwen2.5-coder:7b"
DEFAULT_HOST = "http://127.0.0.1:11434"


def option(default: Any, flag: str, help: str) -> Any:
    """A `PerRun` field that `coder run` and `coder resume` also take as `flag` (a switch
    pair `--x/--no-x` for a boolean), described by `help` (coder.cli.run_cmd.run_options)."""
    return field(default=default, metadata={"flag": flag, "help": help})


@dataclass(frozen=True, kw_only=True)
class PerRun:
    """The settings a run takes from three levels, each said once here (its type and default,
    and, given with `option`, its command-line flag): the config's value is every run's
    default (`Config` is a `PerRun`), the taskfile's policy of the same name the task's
    (coder.taskfile.policies.Policies), the command line's this run's. One rule applies them
    to every field alike (coder.run.settings.resolve: `RunSettings` is a `PerRun` too); the
    two schemas say what a file may hold."""

    max_turns: int = 30  # model turns per step
    run_max_tokens: int | None = None  # model tokens for the whole run; None: no limit
    run_timeout: int | None = None  # seconds of step time for the whole run; None: no limit


DEFAULTS: dict[str, Any] = {
    "model": DEFAULT_MODEL,
    "provider": "ollama",
    "ollama_host": DEFAULT_HOST,
    "base_url": None,
    "api_key_env": None,
    "models": {},
    "test_command": None,
    "num_ctx": None,
    "max_num_ctx": 32768,
    "temperature": 0.2,
    "seed": None,
    "keep_alive": "30m",
    "request_timeout": 600,
    "max_output_tokens": 4096,
    "max_prose_chars": 600,
    "fold_summaries": True,
    "warm_prefix": True,
    "tool_protocol": "auto",
    "allow_network": False,
    "allowed_commands": [],
    "env_passthrough": [],
    "visible_paths": [],
    "protected_paths": [],
    "command_timeout": 600,
    "output_cap": 65536,
    "max_parallel": None,
    **{f.name: f.default for f in fields(PerRun)},  # said once, with the field
    "max_step_tokens": None,
    "step_timeout": 900,
    "mcp_servers": [],
    "plan_attempts": 3,
    "sandbox": "on",
    "limits": None,
    "instruction_files": ["AGENTS.md", "CLAUDE.md", "CONVENTIONS.md"],
    "instructions_max_chars": 12000,
    "repo_map_tokens": None,
    "lint_command": None,
    "embedding_model": None,
    "slots": None,
}

# Resource limits of each command (`limits`; 0: none). The defaults stop a runaway command
# without getting in the way of a real build or test suite; coder.policy.commands.Limits.
LIMITS: dict[str, int] = {
    "cpu_seconds": 600,  # CPU time
    "memory_mb": 16384,  # address space (AddressSanitizer needs 0: it maps terabytes)
    "file_size_mb": 1024,  # largest file a command may write
    "processes": 4096,  # of the user (ulimit -u counts them all); as root, of the sandbox (cgroup)
}
# The time limits that bound a repository's commands and the model's work in a step.
TIMEOUTS = ("command_timeout", "step_timeout")

# environment variable -> config key
ENVIRONMENT = {"OLLAMA_HOST": "ollama_host", "CODER_MODEL": "model"}


@dataclass(frozen=True)
class Config(PerRun):
    """The settings, read once (`load`) into typed attributes, one per key of DEFAULTS (the
    schema checked the files; `values` keeps them by name, `sources` where each came from);
    those a taskfile and the command line also set are its `PerRun` fields."""

    model: str
    provider: str  # "ollama" | "openai"
    ollama_host: str
    base_url: str | list[str] | None
    api_key_env: str | None
    models: dict[str, dict[str, Any]]  # named models: name -> {model, provider?, ...}
    test_command: str | None
    num_ctx: int | None
    max_num_ctx: int
    temperature: float
    seed: int | None
    keep_alive: str
    request_timeout: float
    max_output_tokens: int | None  # None: a named model's own server sets no cap
    max_prose_chars: int
    fold_summaries: bool
    warm_prefix: bool
    tool_protocol: str  # "native" | "text" | "auto" (coder.models.protocol)
    allow_network: bool
    allowed_commands: list[str]
    env_passthrough: list[str]
    visible_paths: list[str]
    protected_paths: list[str]
    command_timeout: int
    output_cap: int
    max_parallel: int | None  # None: as many as the model server serves at once (`slots`)
    max_step_tokens: int | None
    step_timeout: int
    mcp_servers: list[dict[str, Any]]  # each as schemas/config.schema.json describes it
    plan_attempts: int
    sandbox: str  # "on" | "off"
    limits: dict[str, int] | None
    instruction_files: list[str]
    instructions_max_chars: int
    repo_map_tokens: int | None
    lint_command: str | None
    embedding_model: str | None
    slots: int | None  # requests the model server serves at once; None: as it says, else 1

    values: Mapping[str, Any]
    sources: Mapping[str, str]
    project_root: Path | None
    files: tuple[Path, ...]  # the files that were read, lowest precedence first
    # widening settings of the repository's own coder.config.json that were NOT applied,
    # because the user has not trusted them (`coder trust`); see `require_trusted`
    untrusted: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def of(
        cls,
        values: Mapping[str, Any],
        sources: Mapping[str, str],
        project_root: Path | None = None,
        files: tuple[Path, ...] = (),
        untrusted: Mapping[str, Any] | None = None,
    ) -> Config:
        """The one constructor: each typed attribute from `values` (else its default)."""
        typed = {key: values.get(key, default) for key, default in DEFAULTS.items()}
        return cls(
            **typed,
            values=values,
            sources=sources,
            project_root=project_root,
            files=files,
            untrusted=untrusted or {},
        )

    def updated(
        self, values: Mapping[str, Any], sources: Mapping[str, str] | None = None
    ) -> Config:
        """The same config with `values` set over its own (a named model's server, a
        shorter timeout), every typed attribute following."""
        return Config.of(
            {**self.values, **values},
            {**self.sources, **(sources or {})},
            self.project_root,
            self.files,
            self.untrusted,
        )

    def __getitem__(self, key: str) -> Any:
        """A setting by its name (what `coder config` lists); code reads the attributes."""
        return self.values[key]


def as_config(cfg: Config | Mapping[str, Any]) -> Config:
    """`cfg` itself, or the settings of a plain mapping over the defaults (tests, bench)."""
    return cfg if isinstance(cfg, Config) else Config.of({**DEFAULTS, **cfg}, {})


def api_key(cfg: Config, environ: Mapping[str, str] | None = None) -> str | None:
    """The value of the variable `api_key_env` names (the key itself is never in a file)."""
    name = cfg.api_key_env
    if not name:
        return None
    value = (os.environ if environ is None else environ).get(name)
    if not value:
        raise EnvironmentProblem(
            f"api_key_env names {name}, which is not set",
            hint=f"export {name}=... (the model server's API key), or remove api_key_env",
        )
    return value


def find_project_root(start: Path) -> Path | None:
    """The nearest directory at or above `start` holding `.git` (a dir, or a worktree's file)."""
    start = start.resolve()
    for candidate in (start, *start.parents):
        if (candidate / ".git").exists():
            return candidate
    return None


def user_config_path() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "coder" / "config.json"


def load(
    cwd: Path | None = None,
    flags: Mapping[str, Any] | None = None,
    env: Mapping[str, str] | None = None,
) -> Config:
    env = os.environ if env is None else env
    root = find_project_root(cwd or Path.cwd())
    values = dict(DEFAULTS)
    sources = dict.fromkeys(DEFAULTS, "default")
    files: list[Path] = []

    layers: list[tuple[Path, str]] = [(user_config_path(), "user file")]
    if env.get("CODER_CONFIG"):
        path = Path(env["CODER_CONFIG"]).expanduser()
        if not path.is_file():
            raise InvalidInput(
                f"CODER_CONFIG points to {path}, which is not a file",
                hint="fix the path or unset CODER_CONFIG",
            )
        layers.append((path, "CODER_CONFIG"))
    elif root is not None:
        layers.append((root / PROJECT_FILE, "project file"))

    untrusted: dict[str, Any] = {}
    for path, label in layers:
        if path.is_file():
            data = read_file(path)
            if label == "project file" and root is not None:
                untrusted = widening(data)
                if untrusted and trusted_hash(root) == settings_hash(untrusted):
                    untrusted = {}
            for key, value in data.items():
                if key in untrusted:
                    value = _trusted_part(value, untrusted[key])
                if value is not None and key != TRUST_KEY:
                    values[key], sources[key] = value, f"{label} {path}"
            files.append(path)
    for var, key in ENVIRONMENT.items():
        if env.get(var):
            values[key], sources[key] = env[var], f"env {var}"
    for key, value in (flags or {}).items():
        if value is not None:
            values[key], sources[key] = value, "flag"
    try:
        values["ollama_host"] = normalize_host(str(values["ollama_host"]))
    except InvalidInput as exc:
        where = sources.get("ollama_host", "the default")
        raise InvalidInput(f"{exc.message} (from {where})", hint=exc.hint) from None
    return Config.of(values, sources, root, tuple(files), untrusted)


# --------------------------------------------------------------------------------------------
# Trust: a repository's own config may widen what runs (programs, network, variables passed to
# commands, MCP servers, the sandbox off, a model server elsewhere) or loosen a wall (resource
# limits and timeouts above the defaults) only once the user said so for exactly those values.
# --------------------------------------------------------------------------------------------

TRUST_KEY = "trusted_projects"  # in the user file: {realpath of the root: settings hash}


def widening(data: Mapping[str, Any]) -> dict[str, Any]:
    """The settings of `data` that widen what runs (as set: `allow_network: false` narrows)."""
    found = {
        key: data[key]
        # api_key_env: the value of a variable of yours, sent to the model server
        for key in (
            "mcp_servers",
            "allowed_commands",
            "env_passthrough",
            "visible_paths",  # files of yours shown to commands
            "api_key_env",
        )
        if data.get(key)
    }
    for key in ("ollama_host", "base_url"):  # your task and prompts, sent off this machine
        if data.get(key) and not _loopback(data[key]):
            found[key] = data[key]
    named = data.get("models")
    entries = named.values() if isinstance(named, dict) else []
    if any(  # the same, for a named model's own server
        isinstance(e, dict)
        and (e.get("api_key_env") or (e.get("base_url") and not _loopback(e["base_url"])))
        for e in entries
    ):
        found["models"] = named
    if data.get("allow_network") is True:
        found["allow_network"] = True
    if data.get("sandbox") == "off":
        found["sandbox"] = "off"
    # a wall loosened: a time limit above the default, a resource limit above it or off (0)
    found.update(
        {key: data[key] for key in TIMEOUTS if _above(data.get(key), DEFAULTS[key], none=None)}
    )
    limits = data.get("limits")
    loose = {
        key: value
        for key, value in (limits.items() if isinstance(limits, dict) else ())
        if _above(value, LIMITS.get(key), none=0)
    }
    if loose:
        found["limits"] = loose
    return found


def _above(value: Any, default: Any, *, none: int | None) -> bool:
    """Whether `value` (an integer setting; `none` turns the limit off) is looser than
    `default`."""
    if isinstance(value, bool) or not isinstance(value, int) or not isinstance(default, int):
        return False
    return value == none or value > default


def _trusted_part(value: Any, held: Any) -> Any:
    """What of a setting applies while `held` (its widening part) waits for trust: the rest of
    an object (the limits that tighten), else nothing (None)."""
    if isinstance(value, dict) and isinstance(held, dict) and held != value:
        return {key: item for key, item in value.items() if key not in held}
    return None


def _loopback(urls: Any) -> bool:
    """Whether every model server URL in `urls` (one or a list) is on this machine."""
    import ipaddress
    from urllib.parse import urlsplit

    for url in urls if isinstance(urls, list) else [urls]:
        name = urlsplit(normalize_host(str(url))).hostname or ""
        try:
            if not (name == "localhost" or ipaddress.ip_address(name).is_loopback):
                return False
        except ValueError:  # a host name: it may resolve anywhere
            return False
    return True


def settings_hash(settings: Mapping[str, Any]) -> str:
    import hashlib

    canonical = json.dumps(settings, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def edit_file(path: Path, key: str, value: Any = None, *, remove: bool = False) -> None:
    """Set `key` to `value` in the config file at `path` (or with `remove`, take it out),
    keeping the rest of the file as it is. The result is checked before anything is written:
    an unknown setting or a bad value changes nothing."""
    from coder import yamldoc
    from coder.files.durable import write_atomic

    if key not in DEFAULTS:
        raise InvalidInput(
            f"unknown setting {key!r}{yamldoc.did_you_mean(key, list(DEFAULTS))}",
            hint="`coder config` lists the settings",
        )
    # a file that is not valid now is fixed by hand first (read_file says where)
    data = read_file(path, keep_schema=True) if path.is_file() else {}
    if remove:
        data.pop(key, None)
    else:
        data[key] = value
    text = json.dumps(data, indent=2, ensure_ascii=False) + "\n"
    doc = yamldoc.parse_json(text, str(path))
    problems = [
        f"{'.'.join(map(str, e.absolute_path)) or key}: {yamldoc.schema_message(doc, e)}"
        for e in validator("config").iter_errors(data)
    ]
    if problems:
        raise InvalidInput(
            f"{key} cannot be {json.dumps(value)}: {'; '.join(problems)}",
            hint="see docs/configuration.md",
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, text.encode("utf-8"), new_mode=0o644, crash_point=None)


def _user_data() -> dict[str, Any]:
    path = user_config_path()
    return read_file(path) if path.is_file() else {}


def trusted_hash(root: Path) -> str | None:
    """The hash of the settings the user trusted for the repository at `root`, if any."""
    trusted = _user_data().get(TRUST_KEY) or {}
    value = trusted.get(os.path.realpath(root))
    return value if isinstance(value, str) else None


def trust(root: Path, *, revoke: bool = False) -> dict[str, Any]:
    """Record (or with `revoke`, remove) the user's trust in the widening settings of the
    repository at `root`, as they are now; returns those settings."""
    from coder.files.durable import write_atomic

    path = root / PROJECT_FILE
    settings = widening(read_file(path)) if path.is_file() else {}
    data = _user_data()
    trusted = dict(data.get(TRUST_KEY) or {})
    key = os.path.realpath(root)
    if revoke or not settings:
        trusted.pop(key, None)
    else:
        trusted[key] = settings_hash(settings)
    data[TRUST_KEY] = trusted
    user = user_config_path()
    user.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(user, (json.dumps(data, indent=2) + "\n").encode("utf-8"), crash_point=None)
    return settings


def untrusted_problem(cfg: Config) -> str | None:
    """One line naming the repository's settings that are not honoured, or None."""
    if not cfg.untrusted:
        return None
    names = ", ".join(f"{k}={json.dumps(v)}" for k, v in cfg.untrusted.items())
    return (
        f"{cfg.project_root}/{PROJECT_FILE} widens what runs ({names}), and you have not "
        "trusted these settings"
    )


def require_trusted(cfg: Config) -> None:
    """InvalidInput when the repository's config holds widening settings the user has not
    trusted: they would change what runs, so nothing runs until the user decides."""
    problem = untrusted_problem(cfg)
    if problem:
        raise InvalidInput(
            problem,
            hint=f"review them, then run `coder trust` in {cfg.project_root} (asked again "
            "whenever they change), or remove them from the file",
        )


def read_file(path: Path, *, keep_schema: bool = False) -> dict[str, Any]:
    """A config file's contents, checked; InvalidInput names the file, position and field.
    Read like every document coder reads (yamldoc): a FIFO, a huge or deeply nested file,
    or a key given twice is refused with its position. `$schema` is left out unless
    `keep_schema` (to write the file back as it was)."""
    from coder import yamldoc

    fix = "fix the syntax, or delete the file and run `coder init`"
    try:
        doc = yamldoc.parse_json(yamldoc.read_text(path, str(path)), str(path))
    except DocumentError as exc:
        raise InvalidInput(exc.message, hint=fix) from None
    data = doc.data
    if not isinstance(data, dict):
        raise InvalidInput(f"{path}:1:1: a config file must be a JSON object")

    errors = validator("config").iter_errors(data)
    problems = sorted(problem for error in errors for problem in _config_problems(doc, error))
    if problems:
        raise InvalidInput(
            "; ".join(f"{doc.name}:{line}:{col}: {text}" for line, col, text in problems),
            hint=f"fix {path} (see docs/configuration.md)",
        )
    if not keep_schema:
        data.pop("$schema", None)
    return data


def _config_problems(doc: Any, error: Any) -> list[tuple[int, int, str]]:
    """(line, col, text) of each problem a schema error names: an unknown setting at its own
    key, with the setting it was probably meant to be."""
    from coder import yamldoc

    at = list(error.absolute_path)
    if error.validator == "additionalProperties":
        known = list(error.schema.get("properties", {}))
        return [
            (
                *doc.position([*at, key], key=True),
                f"{'.'.join(map(str, [*at, key]))}: unknown setting {yamldoc.quote(key)}"
                + yamldoc.did_you_mean(str(key), known),
            )
            for key in error.instance
            if key not in known
        ]
    field = ".".join(str(p) for p in at) or "(top level)"
    return [(*doc.position(at), f"{field}: {yamldoc.schema_message(doc, error)}")]


def normalize_host(host: str) -> str:
    """`scheme://host:port` for the forms OLLAMA_HOST accepts (`h`, `h:p`, `:p`, `http://h[:p]`),
    with the ollama client's default ports; a listen-all 0.0.0.0 is reached on 127.0.0.1."""
    given = host
    host = host.strip().rstrip("/")
    scheme, sep, rest = host.partition("://")
    if not sep:
        scheme, rest = "http", host
    rest, slash, path = rest.partition("/")  # an OpenAI-compatible base URL's /v1
    if rest.startswith("["):  # an IPv6 address: [::1]:11434
        name, bracket, after = rest.partition("]")
        name, colon, port = name + bracket, after[:1], after[1:]
        valid_name = bool(bracket) and after[:1] in ("", ":")
    else:
        name, colon, port = rest.partition(":")
        valid_name = re.fullmatch(r"[A-Za-z0-9._-]*", name) is not None
    if not colon:
        port = {"http": "80", "https": "443"}.get(scheme, "11434") if sep else "11434"
    if name in ("", "0.0.0.0"):
        name = "127.0.0.1"
    # checked here, once: the ollama client parses OLLAMA_HOST when it is imported and fails
    # with a traceback on anything it cannot read
    if (
        scheme not in ("http", "https")
        or not valid_name
        or not port.isdigit()
        or not (0 < int(port) < 65536)
    ):
        raise InvalidInput(
            f"{given!r} is not a model server address",
            hint="give host, host:port or http://host:port (for example 127.0.0.1:11434)",
        )
    return f"{scheme}://{name}:{port}{slash}{path}"
