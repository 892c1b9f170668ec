"""Progress on stderr while a run works: a live view on a terminal, plain event lines elsewhere.

A run hands every logged event to its console (`progress(event)`) and, once the model loop
reports them, typed loop events (`progress.loop_event(fields, event)`: the tool in progress,
streamed text, ...). Both update one `Board`, the run as the user sees it. Two displays:

- **Plain** (stderr is not a terminal, `TERM=dumb`, or `--quiet`): one line per step event,
  `HH:MM:SS  STEP  WHAT  DETAIL`, no colour, no cursor movement: byte-stable for logs and CI.
- **Live** (a terminal; `coder.cli.live`, with rich, imported only then): the same lines
  scroll above a region that redraws: the DAG's steps with their status and, per running
  step, its fix cycle, turn, the tool call in progress, tokens so far, tokens/s and elapsed
  time; with `-v` the last lines of the model's streamed text.

Anything that asks the user runs inside `progress.paused()`: the live region is taken down
first and drawn again after, so a prompt is never drawn over or erased.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from typing import IO, Any

from coder.agent import events as ev
from coder.display import escaped
from coder.taskfile.kinds import KINDS, Labels

SHOWN = {
    "run.started": "run started",
    "run.warning": "warning",
    "step.started": "started",
    "step.retry": "failed, retrying",
    "fix.cycle": "fixing",
    "step.noted": "noted",
    "context.summarized": "summarized",
    "step.succeeded": "done",
    "step.failed": "FAILED",
    "step.errored": "ERROR",
    "step.skipped": "skipped",
    "step.interrupted": "interrupted",
    "run.stop_requested": "stopping",
    "run.finished": "run finished",
}
ENDED = {
    "step.succeeded": "success",
    "step.failed": "failed",
    "step.errored": "error",
    "step.skipped": "skipped",
    "step.interrupted": "interrupted",
}
COLOURS = {
    "success": "green",
    "failed": "red",
    "error": "red",
    "skipped": "yellow",
    "interrupted": "yellow",
    "running": "cyan",
}
LABEL_STATUS = {"step.retry": "interrupted", "run.warning": "interrupted", **ENDED}


def format_line(event: dict[str, Any], clock: str) -> str:
    """The plain line of a SHOWN event (no colour): what a log file gets."""
    return "".join(line_parts(event, clock)).rstrip()


def line_parts(event: dict[str, Any], clock: str) -> tuple[str, str, str]:
    """A SHOWN event's line in three parts: time and step, what happened, the detail (its
    control characters escaped: a goal, a file name or a command's output is not the
    terminal's to obey)."""
    name, step = event.get("event", ""), event.get("step_id", "")
    if name == "step.started":
        detail = f"{event.get('kind', '')}: {event.get('goal', '')}"
        if int(event.get("attempt", 1)) > 1:
            detail += f" (attempt {event['attempt']})"
    elif name == "step.succeeded":
        commit = event.get("commit") or ""
        detail = f"commit {commit[:8]}" if commit else "no changes"
        if event.get("summary"):
            detail += f" · {event['summary']}"
    elif name == "fix.cycle":
        red = labels_of(str(event.get("kind", ""))).red
        detail = f"{red} ({event.get('failing')}); fix cycle {event.get('cycle')}"
    elif name == "run.started":
        steps = event.get("steps")
        detail = f"{steps} step{'' if steps == 1 else 's'} on {event.get('branch')}"
    elif name == "context.summarized":
        detail = f"{event.get('replaced')} older messages into {event.get('chars')} characters"
    elif name == "run.finished":
        detail = event.get("status", "") + (f": {event['error']}" if event.get("error") else "")
    else:
        detail = str(event.get("error") or event.get("reason") or event.get("message") or "")
    return f"{clock}  {step:<10} ", f"{SHOWN[name]:<11}", f" {escaped(detail)}"


def labels_of(kind: str) -> Labels:
    """How a step of `kind` is named at work (`coder.taskfile.kinds.Kind.labels`); an event of
    a kind this coder does not know (an older log) gets the plain ones."""
    return KINDS[kind].labels if kind in KINDS else Labels()


# --- the run as the user sees it ------------------------------------------------------------


@dataclass
class StepActivity:
    id: str
    kind: str = ""
    goal: str = ""
    status: str = "pending"
    attempt: int = 0
    started: float | None = None  # monotonic, when the current attempt started
    ended: float | None = None
    cycle: int = 0  # the fix cycle of a fixable step (0: none yet)
    turn: int = 0  # model calls so far in this attempt
    tool: str = ""  # the tool call in progress, `fs_edit app.py`
    queued: list[str] = field(default_factory=list)  # calls of the last turn not yet run
    tokens: int = 0  # prompt + generated, over the attempt's finished model calls
    streaming: int = 0  # generated tokens of the call in flight
    tokens_per_s: float = 0.0
    text: str = ""  # the tail of the model's streamed text
    commanding: bool = False  # the step's own command runs (not its model): its tests, ...
    typed: bool = False  # the model loop's typed events arrive for this step

    def reset(self, now: float, attempt: int) -> None:
        self.status, self.attempt, self.started, self.ended = "running", attempt, now, None
        self.cycle = self.turn = self.tokens = self.streaming = 0
        self.tool, self.queued, self.tokens_per_s, self.text = "", [], 0.0, ""
        self.commanding = labels_of(self.kind).running is not None

    def doing(self, now: float) -> str:
        """What a running step is doing, in one line, in its kind's words."""
        parts = [f"fix cycle {self.cycle}"] if self.cycle else []
        running = labels_of(self.kind).running
        if self.commanding and running is not None:
            parts.append(running.format(goal=self.goal))
        elif self.turn:
            parts += [f"turn {self.turn}", self.tool or "waiting for the model"]
        else:
            parts.append(self.tool or "waiting for the model")
        if self.tokens or self.streaming:
            parts.append(f"{self.tokens + self.streaming:,} tokens")
        if self.tokens_per_s:
            parts.append(f"{self.tokens_per_s:.1f} tok/s")
        parts.append(clock_of(now - (now if self.started is None else self.started)))
        return escaped(" · ".join(parts))


TEXT_TAIL = 2000  # characters of streamed text kept per step


class Board:
    """Every step's activity, updated from the run's events. Not thread-safe by itself: the
    displays hold their lock around it."""

    def __init__(self, steps: Sequence[tuple[str, str, str]] = ()) -> None:
        self.steps: dict[str, StepActivity] = {sid: StepActivity(sid, k, g) for sid, k, g in steps}
        self.total = len(self.steps)
        self.started = time.monotonic()
        self.finished = ""

    def step(self, step_id: str) -> StepActivity:
        if step_id not in self.steps:
            self.steps[step_id] = StepActivity(step_id)
        return self.steps[step_id]

    @property
    def done(self) -> int:
        return sum(1 for s in self.steps.values() if s.status in ENDED.values())

    def apply(self, event: dict[str, Any], now: float) -> None:
        """A logged event (a dict, as in the JSONL log)."""
        name, sid = event.get("event", ""), event.get("step_id")
        if name == "run.started":
            self.total = max(self.total, int(event.get("steps", 0)))
        elif name == "run.finished":
            self.finished = str(event.get("status", ""))
        if not sid:
            return
        step = self.step(sid)
        if name == "step.started":
            step.kind = event.get("kind", step.kind)
            step.goal = event.get("goal", step.goal)
            step.reset(now, int(event.get("attempt", 1)))
        elif name in ENDED:
            step.status, step.ended, step.tool, step.queued = ENDED[name], now, "", []
        elif name == "fix.cycle":  # red checks go to the model
            step.cycle, step.turn, step.tool = int(event.get("cycle", 0)), 0, ""
            step.commanding = False
        elif name == "model.turn":  # the call ended: its tool calls run next, in order
            usage = event.get("usage") or {}
            step.turn = int(event.get("turn", step.turn))
            step.tokens += int(usage.get("prompt_tokens", 0)) + int(usage.get("eval_tokens", 0))
            step.streaming = 0
            step.tokens_per_s = float(usage.get("tokens_per_s") or step.tokens_per_s)
            calls = [str(c) for c in event.get("calls") or []]
            if step.cycle and "step_complete" in calls:  # the fix done: its check reruns
                step.commanding, step.tool, step.queued = True, "", []
            elif not step.typed:  # without typed events: the calls run in order
                step.queued = calls
                step.tool = step.queued.pop(0) if step.queued else ""
        elif name == "tool.called" and not step.typed:  # the next call runs, or the model
            step.tool = step.queued.pop(0) if step.queued else ""

    def apply_loop(self, fields: dict[str, Any], event: object) -> None:
        """A typed event of the model loop (`coder.agent.events`), with the step's log fields
        (`step_id`, and `fix_cycle` in a fixable step's fix). Once a step has them, they say
        which tool runs (with its target), not the logged turn's list of calls."""
        sid = fields.get("step_id")
        if not sid:
            return
        step = self.step(str(sid))
        step.typed = True
        if fields.get("fix_cycle") is not None:
            step.cycle, step.commanding = int(fields["fix_cycle"]), False
        shown = LOOP_SHOWN.get(type(event))
        if shown is not None:
            shown(step, event)


# What the loop's events change on a step's row; the other events it does not show.


def _turn_started(step: StepActivity, event: ev.TurnStarted) -> None:
    step.turn, step.tool, step.streaming = event.turn, "", 0


def _model_text(step: StepActivity, event: ev.ModelText) -> None:
    step.streaming = event.tokens
    step.tokens_per_s = event.tokens_per_s or step.tokens_per_s
    step.text = (step.text + event.text)[-TEXT_TAIL:]


def _tool_started(step: StepActivity, event: ev.ToolStarted) -> None:
    step.tool = event.label


def _tool_ended(step: StepActivity, event: ev.ToolFinished | ev.LoopFinished) -> None:
    step.tool = ""


LOOP_SHOWN: dict[type, Callable[[StepActivity, Any], None]] = {
    ev.TurnStarted: _turn_started,
    ev.ModelText: _model_text,
    ev.ToolStarted: _tool_started,
    ev.ToolFinished: _tool_ended,
    ev.LoopFinished: _tool_ended,
}


@contextmanager
def holding(lock: threading.RLock) -> Iterator[None]:
    with lock:
        yield


def clock_of(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


# --- the displays ---------------------------------------------------------------------------


HEARTBEAT_S = 30.0  # plain mode: a line at least this often while a step works


class Progress:
    """Plain mode: one line per SHOWN event, and a `working` line for each running step after
    `heartbeat` seconds without one (a CI log that shows nothing for minutes looks hung);
    `silent` (under --json) prints nothing. The live view (`coder.cli.live.LiveProgress`)
    extends it. `clock` gives the lines' time of day."""

    live = False

    def __init__(
        self,
        stream: IO[str] | None = None,
        *,
        silent: bool = False,
        clock: Callable[[], str] | None = None,
        steps: Sequence[tuple[str, str, str]] = (),
        heartbeat: float = HEARTBEAT_S,
    ) -> None:
        self.stream = stream or sys.stderr
        self.silent = silent
        self.clock = clock or (lambda: time.strftime("%H:%M:%S"))
        self.board = Board(steps)
        self.lock = threading.RLock()
        self.heartbeat = heartbeat
        self._last_line = time.monotonic()
        self._closed = threading.Event()
        self._beating: threading.Thread | None = None

    def __call__(self, event: dict[str, Any]) -> None:
        if self.silent:
            return
        with self.lock:
            self.board.apply(event, time.monotonic())
            if event.get("event") in SHOWN:
                self.line(event, self.clock())
                self._last_line = time.monotonic()
            if not self.live and self._beating is None:
                self._beating = threading.Thread(target=self._beat, name="coder-progress")
                self._beating.daemon = True
                self._beating.start()

    def _beat(self) -> None:
        while not self._closed.wait(min(self.heartbeat, 5.0)):
            with self.lock:
                now = time.monotonic()
                if now - self._last_line < self.heartbeat:
                    continue
                for step in self.board.steps.values():
                    if step.status == "running":
                        line = f"{self.clock()}  {step.id:<10} {'working':<11} {step.doing(now)}"
                        self.stream.write(line + "\n")
                self.stream.flush()
                self._last_line = now

    def loop_event(self, fields: dict[str, Any], event: object) -> None:
        """A typed model-loop event: only the live view draws these."""

    def line(self, event: dict[str, Any], clock: str) -> None:
        self.stream.write(format_line(event, clock) + "\n")
        self.stream.flush()

    def paused(self) -> AbstractContextManager[None]:
        """Around a prompt: nothing is drawn meanwhile (plain mode draws only whole lines)."""
        return holding(self.lock)

    def close(self) -> None:
        self._closed.set()


def can_redraw(stream: IO[str]) -> bool:
    import os

    try:
        tty = stream.isatty()
    except (AttributeError, ValueError):
        return False
    return tty and os.environ.get("TERM", "") not in ("", "dumb", "unknown")


class Activity:
    """Progress of one long task that is not a run (`coder plan`, `coder merge --if-green`):
    its notes as plain lines; on a terminal (`coder.cli.live.LiveActivity`) a status line
    redraws under them. `silent` (under --json) prints nothing."""

    def __init__(self, stream: IO[str] | None = None, *, silent: bool = False) -> None:
        self.stream = stream or sys.stderr
        self.silent = silent
        self.lock = threading.RLock()
        self._status = ""

    def note(self, message: str) -> None:
        if not self.silent:
            with self.lock:
                self.stream.write(escaped(message, lines=True) + "\n")
                self.stream.flush()

    def status(self, text: str, *, restart: bool = False) -> None:
        """What is going on now (`restart`: a new stage, its clock starts again). Only the
        live status line shows it."""
        self._status = text

    def paused(self) -> AbstractContextManager[None]:
        return holding(self.lock)

    def close(self) -> None:
        pass
