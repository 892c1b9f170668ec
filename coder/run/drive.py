"""A started or resumed run driven to its end: `execute` builds the run's RunContext (the one
place), takes SIGTERM and SIGHUP as a stop while it runs, and hands the walk to the executor.
What start and resume share lives here too: `RunOptions` (what the command line chose),
`RunResult`, the run's redactor, its agent session, and the preflight of its commands.

Files per run, under `.coder/`:
    tasks/<id>.json       the run's manifest: the resolved taskfile, base commit, branch,
                          worktree. Written once, before anything else, never changed.
    state/<id>.json       the checkpoint (coder.run.state): a snapshot, and a journal of the
    state/<id>.journal    step transitions since; can be rebuilt from the manifest and the
                          branch's trailers.
    worktrees/<id>/       the git worktree on the run's branch: all work happens there.
    logs/<id>.jsonl       the event log. artifacts/<id>/: per-step diffs and command logs.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Collection, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from coder import config as config_mod
from coder import taskfile
from coder.agent import session as agent_session
from coder.config import api_key
from coder.display import counted
from coder.errors import (
    InvalidInput,
)
from coder.interrupts import detach_terminal, taken
from coder.policy.sandbox import require_sandbox
from coder.redact import Redactor, secrets_from_repo
from coder.run import approvals
from coder.run import manifest as manifests
from coder.run.approvals import EditApprovals
from coder.run.context import Approver, Dispatcher, RunContext
from coder.run.eventlog import EventLog
from coder.run.executor import Executor
from coder.run.preflight import refusals
from coder.run.records import RunState
from coder.run.secrets import run_secrets, stored_task
from coder.run.settings import Chosen, RunSettings, serving
from coder.run.state import StateStore

if TYPE_CHECKING:
    from coder.agent.session import AgentSession, ToolAttacher
    from coder.git.repository import Repo
    from coder.policy.commands import Policy
    from coder.run.approvals import EditPrompt, Mode
    from coder.run.eventlog import Console, LiveView


@dataclass(frozen=True)
class RunOptions(Chosen):
    """What a run is given: the command line's choice of its settings (`Chosen`, resolved by
    coder.run.settings.resolve), and the rest."""

    model: str | None = None
    record: Path | None = None  # write the model's replies here
    replay: Path | None = None  # answer model calls from this recording instead of Ollama
    approve: Approver | None = None  # the terminal's question before a step (per-step)
    approve_edit: EditPrompt | None = None  # and before an edit or a command (per-edit)
    attach_tools: ToolAttacher | None = None  # extra tools for the model (the MCP servers')
    sandbox: str | None = None  # "off" (--no-sandbox) overrides the config's `sandbox`
    # The live view: gets each typed model-loop event (coder.agent.events) with its step's
    # context (run.events.LiveView); nothing it gets is written to the log.
    live: LiveView | None = None
    # resume: take the taskfile's new version for the steps not yet done ("": the file the
    # run started from; else the path of another). None: keep the run's own copy when
    # `ignore_edits`, else refuse an edited taskfile (coder.run.amend.TaskfileEdited).
    taskfile: str | None = None
    ignore_edits: bool = False
    # resume: guidance notes, (step id or None for the next model step, text) (run/notes.py)
    notes: tuple[tuple[str | None, str], ...] = ()
    # start: the checkout's uncommitted changes become the run's first commit
    include_uncommitted: bool = False
    # start: every step that takes candidates is tried this many ways (coder.run.candidates)
    candidates: int | None = None
    # start: the steps run on other machines (--executor; kept in the manifest for resume)
    fleet: manifests.Fleet | None = None
    # what dispatches a run's steps when its manifest says they run elsewhere (coder.fleet)
    dispatcher: Dispatcher | None = None


@dataclass(frozen=True)
class RunResult:
    task_id: str
    status: str  # success | failed | error | interrupted
    manifest: manifests.Manifest
    state: RunState
    warnings: tuple[str, ...] = ()
    resume: str = ""  # how to continue it: `coder resume -t ID`, with -f when its files are gone


# --- start ---------------------------------------------------------------------------------


def refuse_unasked(mode: Mode, options: RunOptions) -> None:
    """Refuse an approvals mode that asks when nobody can be asked (no terminal)."""
    prompt = options.approve if mode == "per-step" else options.approve_edit
    approvals.require_prompt(mode, can_ask=prompt is not None)


def run_redactor(
    roots: list[Path], task: taskfile.Task, policy: Policy, cfg: config_mod.Config
) -> Redactor:
    """The run's redactor: every secret it knows (coder.run.secrets.run_secrets)."""
    return Redactor(run_secrets(roots, task, policy, cfg.values))


def open_agent(
    task: taskfile.Task,
    cfg: config_mod.Config,
    repo: Repo,
    base_commit: str,
    options: RunOptions,
    redactor: Redactor,
    done: Collection[str] = (),
    attempts: Mapping[str, int] | None = None,
) -> AgentSession | None:
    """coder.agent.session.open_agent for this run: its prefix shows the task as the manifest
    keeps it."""
    return agent_session.open_agent(
        task,
        cfg,
        repo,
        base_commit,
        stored=stored_task(task.to_dict(), redactor),
        redactor=redactor,
        replay=options.replay,
        record=options.record,
        done=done,
        attempts=attempts,
    )


def preflight(task: taskfile.Task, policy: Policy, root: Path, cfg: config_mod.Config) -> None:
    """Refuse a run whose commands the policy forbids (or that has a test step with no test
    command), or that needs a sandbox the machine lacks, before anything is created."""
    require_sandbox(policy)
    found = refusals(task.steps, root=root, policy=policy, config=cfg)
    if found:
        more = f" (and {counted(len(found) - 1, 'more refusal')})" if len(found) > 1 else ""
        raise InvalidInput(f"{found[0]}{more}", hint=found[0].hint)


# --- resume --------------------------------------------------------------------------------


def execute(
    task: taskfile.Task,
    settings: RunSettings,
    *,
    root: Path,
    manifest: manifests.Manifest,
    state: RunState,
    store: StateStore,
    agent: AgentSession | None,
    redactor: Redactor,
    warnings: tuple[str, ...],
    options: RunOptions,
    console: Console | None,
) -> RunResult:
    """Run a started or resumed run to its end: the one place its RunContext is built."""
    coder_dir, worktree = store.coder_dir, manifest.worktree_path
    settings = serving(settings, agent.facts.slots if agent is not None else None)
    fleet = manifest.fleet
    if fleet is not None:  # a batch is as many steps as the engine runs at once
        settings = replace(settings, max_parallel=fleet.workers or settings.max_parallel)
        if options.dispatcher is None:
            raise InvalidInput(f"run {task.id}'s steps run on --executor {fleet.executor}")
    # the worktree's `.env*` files too, before anything is logged or any command runs
    redactor.add(*secrets_from_repo(worktree))
    if agent is not None and options.replay is None:  # the server's API key stays secret
        redactor.add(*filter(None, [api_key(settings.config)]))
    live = options.live
    with EventLog(coder_dir, task.id, redactor=redactor, console=console, live=live) as log:
        for warning in warnings:
            log.warning("run.warning", message=warning)
        stop = threading.Event()  # the run's, which its questions watch too
        run = RunContext(
            task=task,
            manifest=manifest,
            settings=settings,
            repo_root=root,
            coder_dir=coder_dir,
            worktree=worktree,
            state=state,
            store=store,
            log=log,
            redactor=redactor,
            stop=stop,
            agent=agent,
            approve=options.approve if settings.approvals == "per-step" else None,
            approve_edit=EditApprovals(options.approve_edit, redactor, stop)
            if settings.approvals == "per-edit" and options.approve_edit is not None
            else None,
        )
        run.dispatch = options.dispatcher(run, fleet) if fleet and options.dispatcher else None
        try:
            status = _drive(run, options)
        finally:
            if run.dispatch is not None:
                run.dispatch.close()
    resume = f"coder resume -t {task.id}"
    if not manifests.run_exists(coder_dir, task.id):  # deleted under the run
        resume += f" -f {manifest.taskfile or 'TASKFILE'}"
    return RunResult(task.id, status, manifest, state, warnings, resume)


def _drive(run: RunContext, options: RunOptions) -> str:
    """The executor's walk, with the model's extra tools attached and its prefix sent ahead;
    the model side closed whatever happens."""
    agent, config = run.agent, run.settings.config
    if agent is not None:
        run.log.info("model.ready", **agent.facts.as_dict())
    attached = None
    try:
        if agent is not None and options.attach_tools is not None:  # they join the prefix
            attached = options.attach_tools(
                agent, config, cwd=run.worktree, log=run.log, redactor=run.redactor
            )
        if agent is not None:
            agent.prime()  # unless it is already being sent
        with _stop_on_signals(run.stop, run.log):
            return Executor(run).execute()
    finally:
        if attached is not None:
            attached.close()
        if agent is not None:
            agent.stop_priming()  # a warm prefix still being sent is ended first
            agent.models.close()


@contextmanager
def _stop_on_signals(stop: threading.Event, log: EventLog) -> Iterator[None]:
    """SIGTERM (`coder stop`), Ctrl-C and a hang-up (the terminal closed; not under nohup:
    coder.interrupts.taken) stop gracefully: the current step is interrupted, its commands
    and model requests ended and the checkpoint written. A second Ctrl-C stops at once."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, _frame: Any) -> None:
        if signum == signal.SIGHUP:  # before anything is written to the terminal that is gone
            detach_terminal()
        if stop.is_set() and signum == signal.SIGINT:
            raise KeyboardInterrupt
        stop.set()
        log.warning("run.stop_requested", signal=signal.Signals(signum).name)

    previous = {s: signal.signal(s, handler) for s in taken()}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
