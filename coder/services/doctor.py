"""`coder doctor`: is this machine ready for a run? Each check says ok, warn or fail, and how to
fix what is not ok."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from coder import config as config_mod
from coder.checks.testcommand import detect_test_command
from coder.errors import CoderError, ModelMissing
from coder.git import branches, repository
from coder.models import protocol
from coder.models.factory import endpoints, make_provider, model_config, named_models, provider_of
from coder.models.served import place_hint
from coder.policy import cgroups, kernel, userns
from coder.policy.sandbox import network_isolation_available
from coder.services import testprobe

if TYPE_CHECKING:
    from coder.models.provider import ModelFacts, ServerProvider
    from coder.policy.kernel import Support

MIN_USEFUL_CTX = 8192


@dataclass(frozen=True)
class Check:
    name: str
    status: str  # ok | warn | fail
    detail: str
    fix: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def run_checks(cwd: Path, *, model: str | None = None, probe: bool = True) -> list[Check]:
    cfg = config_mod.load(cwd, flags={"model": model})
    checks = [_git(cwd), _test_command(cwd, cfg)]
    if probe:
        checks += _tests_found(cwd, cfg)
    checks += [*_sandbox(cfg), _trust(cfg)]
    checks += _models(cfg)
    return checks


def _git(cwd: Path) -> Check:
    try:
        repo = repository.open_repo(cwd)
        branch = branches.current_branch(repo)
    except CoderError as exc:
        return Check("git repository", "fail", exc.message, exc.hint)
    fallback = repository.identity(repo).fallback
    libgit2 = f"libgit2 {repository.libgit2_version()}"
    if fallback:
        return Check(
            "git repository",
            "warn",
            f"on branch {branch}; {libgit2}; user.name/email "
            "not set, commits would be authored by coder <coder@localhost>",
            "git config --global user.name 'Your Name' && "
            "git config --global user.email you@example.com",
        )
    return Check(
        "git repository",
        "ok",
        f"on branch {branch}; {libgit2} (git hooks do not run for coder's commits)",
    )


def _test_command(cwd: Path, cfg: config_mod.Config) -> Check:
    root = cfg.project_root or cwd
    configured = cfg.test_command
    if configured:
        return Check("test command", "ok", f"{configured} (from {cfg.sources['test_command']})")
    detected = detect_test_command(root)
    if detected:
        return Check("test command", "ok", f"{detected} (detected)")
    return Check(
        "test command",
        "warn",
        "no test command configured or detected; test steps and require_green_tests cannot run",
        "set test_command in coder.config.json (coder init writes one)",
    )


def _tests_found(cwd: Path, cfg: config_mod.Config) -> list[Check]:
    """The test command, run once (coder.services.testprobe); nothing without one."""
    root = cfg.project_root or cwd
    command = cfg.test_command or detect_test_command(root)
    if not command:
        return []
    found = testprobe.probe(cwd, command, cfg)
    return [Check("tests", found.status, found.detail, found.fix)]


def _sandbox(cfg: config_mod.Config) -> list[Check]:
    """Which protection commands get: the kernel sandbox (Landlock) and the network wall."""
    found = kernel.support()
    off = cfg.sandbox == "off"
    if off:
        files = Check(
            "command sandbox",
            "warn",
            f'OFF ("sandbox": "off" from {cfg.sources["sandbox"]}): commands can write '
            "anywhere you can, including your checkout, .git and $HOME",
            'remove "sandbox": "off" where it is set'
            + ("" if found.available else " once this machine has Landlock"),
        )
    elif found.available:
        files = Check(
            "command sandbox",
            "ok",
            f"Landlock ABI {found.abi}: commands write only their worktree, its git admin "
            "dir and a private TMPDIR; no signals or sockets reach outside",
        )
    else:
        files = Check(
            "command sandbox",
            "fail",
            f"{found.problem}; runs refuse to run commands",
            'use Linux 6.2+ with Landlock enabled, or run unconfined with "sandbox": "off" '
            "in coder.config.json (or --no-sandbox)",
        )
    if network_isolation_available():
        how = {
            "thread": "a private network namespace, capabilities dropped",
            "per-command": "a private user and network namespace per command",
        }.get(found.netns, "a private network namespace per command")
        net = Check("command network", "ok", f"off by default: {how}")
    else:
        net = Check(
            "command network",
            "warn",
            "this kernel does not allow unprivileged network namespaces: only the "
            "allowlist and Landlock's TCP rules keep commands off the network",
            "enable user namespaces (sysctl kernel.unprivileged_userns_clone=1) if you can",
        )
    return [
        files,
        net,
        _metadata(found, off=off),
        _view(found, off=off),
        _processes(found, off=off),
    ]


def _metadata(found: Support, *, off: bool) -> Check:
    """The metadata wall: what a command can do to files' modes, owners, times and xattrs
    (Landlock has no rights for them) and whether it can make a setuid or setgid file."""
    name = "command metadata"
    if off or not found.available:
        return Check(name, "warn" if off else "fail", "no kernel sandbox: see command sandbox")
    parts, missing = [], []
    if found.mounts_problem is None:
        parts.append("read-only outside the worktree (mount namespace)")
    else:
        missing.append(
            "chmod, chown, touch and setxattr reach files outside the worktree "
            f"({found.mounts_problem})"
        )
    if found.setid_problem is None:
        parts.append("setuid refused (seccomp)")
    else:
        missing.append(f"setuid/setgid files can be made ({found.setid_problem})")
    if not missing:
        return Check(name, "ok", "; ".join(parts))
    return Check(
        name,
        "warn",
        "; ".join([*missing, *parts]),
        "run coder as root, or allow unprivileged user namespaces, for the read-only mount "
        "namespace (coder drops every capability before starting a command)"
        if found.mounts_problem is not None
        else None,
    )


def _processes(found: Support, *, off: bool) -> Check:
    """The process wall: whether `limits.processes` binds, and how what a step's commands
    and its MCP servers' tools leave behind is found at the step's end."""
    import os

    name = "process trees"
    if off or not found.available:
        return Check(name, "warn" if off else "fail", "no kernel sandbox: see command sandbox")
    problem = cgroups.problem()
    if problem is None:
        return Check(
            name,
            "ok",
            "a pids cgroup per sandbox and per MCP server: limits.processes binds root too, "
            "and what a step or an MCP tool started is ended with the step",
        )
    trees = "an MCP server is the subreaper of what its tools start"
    if os.geteuid() != 0:
        return Check(
            name, "ok", f"limits.processes by ulimit -u (no pids cgroup: {problem}); {trees}"
        )
    return Check(
        name,
        "warn",
        f"limits.processes is not enforced for root (no pids cgroup: {problem}); {trees}",
        "mount the cgroup v1 pids hierarchy (/sys/fs/cgroup/pids), or run coder as another user",
    )


def _view(found: Support, *, off: bool) -> Check:
    """What a command sees (coder.policy.view): only its worktree, its temp dir, the system
    and its toolchain, or the whole filesystem (read-only to it)."""
    name = "command view"
    if off or not found.available:
        return Check(name, "warn" if off else "fail", "no kernel sandbox: see command sandbox")
    if found.view_problem is None:
        return Check(
            name,
            "ok",
            "commands see only their worktree, its temp dir, the system and their toolchain: "
            "no $HOME, /run, /tmp, /dev/shm or terminals of this machine, no other repository",
        )
    why = userns.problem() or found.view_problem
    return Check(
        name,
        "warn",
        "commands can read whatever you can and connect to UNIX sockets by path (an ssh "
        f"agent, a container daemon) ({why})",
        "run coder as root, or allow unprivileged user namespaces "
        "(sysctl kernel.unprivileged_userns_clone=1, user.max_user_namespaces > 0)",
    )


def _trust(cfg: config_mod.Config) -> Check:
    problem = config_mod.untrusted_problem(cfg)
    if problem:
        return Check(
            "project settings",
            "warn",
            f"{problem}; runs refuse until you do",
            f"review them, then `coder trust` in {cfg.project_root}",
        )
    return Check("project settings", "ok", "nothing untrusted widens what runs")


def _models(cfg: config_mod.Config) -> list[Check]:
    """The model server checks, once per endpoint: of the default model, then of each named
    model (config `models`, labelled with its name), then of the embedding model."""
    default = str(cfg.model)
    embedding = cfg.embedding_model
    checks = _server(*model_config(cfg, default), name=None)
    for name in named_models(cfg):
        if name not in (default, embedding):  # those two are checked as such
            checks += _server(*model_config(cfg, name), name=name)
    if embedding:
        checks += _embeddings(*model_config(cfg, str(embedding)))
    return checks


def _server(cfg: config_mod.Config, model: str, *, name: str | None) -> list[Check]:
    """Host, model, tool protocol and context window at each endpoint of one server; the
    fixes for a named model's server name its fields (`models.NAME.base_url`)."""
    from dataclasses import replace

    what = "model server" + (f" ({name})" if name else "")
    try:
        urls = endpoints(cfg)
        providers = [make_provider(_quick(cfg), url, model) for url in urls]
    except CoderError as exc:  # e.g. api_key_env names a variable that is not set
        return [Check(what, "fail", exc.message, place_hint(cfg, name, exc.hint))]
    checks: list[Check] = []
    down: list[Check] = []  # an endpoint that does not answer
    for url, provider in zip(urls, providers, strict=True):
        at = _label(name, url if len(urls) > 1 else None)
        try:
            found = _endpoint(cfg, provider, url, at=at)
        finally:
            provider.close()
        down += found[:1] if len(found) == 1 and found[0].status == "fail" else []
        checks += found
    if down and len(down) < len(urls):  # runs fail over to the endpoints that answer
        checks = [
            replace(c, status="warn", detail=f"{c.detail}; runs use the other endpoints")
            if c in down
            else c
            for c in checks
        ]
    return [replace(c, fix=place_hint(cfg, name, c.fix)) for c in checks]


def _embeddings(cfg: config_mod.Config, model: str) -> list[Check]:
    """Does the embedding model embed at each endpoint (one short text, as code_search
    would)? A failure is a warning: code_search then ranks by BM25 alone."""
    checks: list[Check] = []
    fallback = "set embedding_model to an embedding model the server has, or null"
    try:
        urls = endpoints(cfg)
    except CoderError as exc:
        return [Check("embedding model", "warn", exc.message, exc.hint or fallback)]
    for url in urls:
        name = f"embedding model{_label(None, url if len(urls) > 1 else None)}"
        try:
            provider = make_provider(_quick(cfg), url, model)
            try:
                (vector,) = provider.embed(["def parse_config(path): ..."])
            finally:
                provider.close()
        except CoderError as exc:
            problem = f"{exc.message}; code_search ranks by BM25 alone"
            checks.append(Check(name, "warn", problem, exc.hint or fallback))
            continue
        detail = f"{model} embeds ({len(vector)} dimensions); code_search is hybrid"
        checks.append(Check(name, "ok", detail))
    return checks


def _tool_protocol(cfg: config_mod.Config, model: str, facts: ModelFacts, at: str) -> Check:
    """Which tool protocol a run would use with the model, and why (coder.models.protocol:
    the setting, a remembered choice, or the server's evidence; doctor remembers nothing)."""
    name = f"tool protocol{at}"
    remembered = protocol.Remembered(protocol.cache_path(cfg.project_root), write=False)
    choice = protocol.decide(cfg, model, facts, remembered)
    caps = facts.capabilities
    if choice.protocol == "native" and caps and "tools" not in caps:  # set so, by hand
        return Check(
            name,
            "fail",
            f"native ({choice.reason}), but {model} does not call tools (capabilities: "
            f"{', '.join(caps)}): its requests would be refused",
            'set "tool_protocol": "auto" (or "text") for it in coder.config.json',
        )
    if choice.protocol == "text":
        detail = f"text: the tools are described in the system prompt ({choice.reason})"
        return Check(name, "ok", detail)
    if not choice.proven:
        return Check(
            name,
            "warn",
            f"native, unproven: {choice.reason}",
            'set "tool_protocol" to "native" or "text" in coder.config.json to decide it '
            "yourself (llama.cpp calls tools with --jinja; vLLM with --enable-auto-tool-choice)",
        )
    return Check(name, "ok", f"native: {choice.reason}")


def _quick(cfg: config_mod.Config) -> config_mod.Config:
    return cfg.updated({"request_timeout": 15})


def _label(name: str | None, url: str | None) -> str:
    """ " (big: http://...)", " (big)", " (http://...)" or ""."""
    inside = ": ".join(part for part in (name, url) if part)
    return f" ({inside})" if inside else ""


def _endpoint(
    cfg: config_mod.Config, provider: ServerProvider, url: str, *, at: str
) -> list[Check]:
    """Host, model, tool protocol and context window at one endpoint (the model is not
    loaded: `probe` only asks the server what it has); `at` labels the checks."""
    model = str(cfg.model)
    kind = provider_of(cfg)
    host = f"{kind.host_label}{at}"
    try:
        facts = provider.probe()
    except ModelMissing as exc:
        return [Check(host, "ok", url), Check(f"model{at}", "fail", exc.message, exc.hint)]
    except CoderError as exc:
        return [Check(host, "fail", exc.message, exc.hint)]
    server = f"{kind.server_name} " if kind.server_name else ""
    version = f" ({server}{facts.version})" if facts.version else ""
    checks = [Check(host, "ok", url + version)]
    trained = facts.context_length
    checks.append(
        Check(
            f"model{at}",
            "ok",
            f"{model} is available ({facts.arch or 'unknown'} "
            f"architecture, context {trained or 'unknown'})",
        )
    )
    checks.append(_tool_protocol(cfg, model, facts, at))
    num_ctx = facts.num_ctx or 0
    if cfg.num_ctx:
        source = cfg.sources["num_ctx"]
    elif kind.caps_context:
        source = f"the model's own, capped by max_num_ctx={cfg.max_num_ctx}"
    elif facts.context_length:
        source = "as the server reports it"
    else:
        source = "the server does not say; coder's default"
    if num_ctx < MIN_USEFUL_CTX:
        checks.append(
            Check(
                f"context window{at}",
                "warn",
                f"num_ctx {num_ctx} ({source}) is small for coding; prompts may be cut",
                f"set num_ctx to at least {MIN_USEFUL_CTX} in coder.config.json if memory allows",
            )
        )
    else:
        checks.append(
            Check(
                f"context window{at}",
                "ok",
                f"num_ctx {num_ctx} ({source}); coder budgets prompts to it",
            )
        )
    return checks
