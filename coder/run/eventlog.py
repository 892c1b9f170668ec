"""The structured event log: `.coder/logs/<task_id>.jsonl`, one JSON object per line.

Each `EventLog` owns a private structlog pipeline (`structlog.wrap_logger` with explicit
processors), so it never reads or changes structlog's global configuration: several runs can
log in one process (tests, an MCP server) without seeing each other's context.

    bound context -> level -> timestamp -> conform -> redact -> order keys -> sink
                                                    (fails closed)        (file, then console)

Lines validate against `schemas/log.schema.json`. Every line reaches the OS with one `write`
as soon as it is logged, so a `kill -9` loses at most the line being written; readers skip a
torn line, and a new `EventLog` terminates one left at the end of the file.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, BinaryIO, Literal, Self

from coder.files import nofollow
from coder.files.durable import make_private_dirs, write_failed
from coder.redact import SCAN_FAILED, Redactor
from coder.run.records import check_task_id

if TYPE_CHECKING:
    from structlog.typing import EventDict, Processor, WrappedLogger

# One line of the event log as a dict (ts, level, event, task_id, step_id, ...: the keys of
# schemas/log.schema.json, then the free-form fields of its event), or the context bound to
# every line of a step.
Event = dict[str, Any]
Console = Callable[[Event], None]
# A live view: receives the bound context (task_id, step_id, ...) and a typed event that is
# not written to the file (coder.agent.events: streamed text, the tool in progress, ...).
LiveView = Callable[[Event, object], None]
Level = Literal["debug", "info", "warning", "error"]

EVENT_NAME = re.compile(r"[a-z_]+(?:\.[a-z_]+)*")
_FIRST_KEYS = ("timestamp", "level", "event", "task_id", "step_id")
_STRING_FIELDS = ("event", "task_id", "step_id", "commit", "reason", "error", "logger")
# Made by coder (a timestamp, a level, a normalized event name, a validated task id): not
# scanned, so that even a line whose redaction failed still says what happened and when.
_GENERATED_FIELDS = ("timestamp", "level", "event", "task_id")


def log_path(coder_dir: Path, task_id: str) -> Path:
    return Path(coder_dir) / "logs" / f"{check_task_id(task_id)}.jsonl"


def _normalize_event(name: str) -> str:
    """Event names are dotted lowercase (`step.started`); repair rather than lose a line."""
    if EVENT_NAME.fullmatch(name):
        return name
    fixed = re.sub(r"[^a-z_.]", "_", name.lower())
    fixed = ".".join(part for part in fixed.split(".") if part)
    return fixed or "event"


def _conform(_: WrappedLogger, __: str, event: EventDict) -> EventDict:
    """Make the schema's string fields strings *before* redaction (`error=exc` must be
    scanned as the text it will be printed as)."""
    for key in _STRING_FIELDS:
        if key in event and not isinstance(event[key], str):
            event[key] = str(event[key])
    if not EVENT_NAME.fullmatch(event.get("event", "")):
        event["event_raw"] = event.get("event", "")
        event["event"] = _normalize_event(event.get("event", ""))
    return event


def _redaction(redactor: Redactor) -> Processor:
    def redact(_: WrappedLogger, __: str, event: EventDict) -> EventDict:
        ours = {k: event[k] for k in _GENERATED_FIELDS if k in event}
        clean = redactor.redact_obj({k: v for k, v in event.items() if k not in ours})
        if not isinstance(clean, dict):
            # Fail closed: keep only what coder generated itself, which cannot hold a secret.
            clean = {"redaction_failed": True, "error": SCAN_FAILED}
        return {**ours, **clean}

    return redact


def _order_and_render(
    _: WrappedLogger, __: str, event: EventDict
) -> tuple[tuple[str, Event], dict[str, Any]]:
    """The last processor: `(line, event)` become the sink's arguments."""
    ordered = {k: event[k] for k in _FIRST_KEYS if k in event}
    ordered.update((k, v) for k, v in event.items() if k not in ordered)
    line = json.dumps(ordered, default=str, ensure_ascii=False)
    return (line, ordered), {}


class _Sink:
    """The wrapped logger: appends whole lines (one write each, under a lock), then hands the
    event to the console. Every level method is the same method."""

    def __init__(self, path: Path, console: Console | None, live: LiveView | None) -> None:
        make_private_dirs(path.parent)
        self.path = path
        self._lock = threading.Lock()
        self._console = console
        self.live = live
        flags = os.O_RDWR | os.O_APPEND | os.O_CREAT  # RDWR: to peek at the end
        self._fd: int | None = nofollow.open_file(path, flags, 0o600)
        size = os.fstat(self._fd).st_size
        if size and os.pread(self._fd, 1, size - 1) != b"\n":
            self._write(b"\n")  # a previous runner was killed mid-line: end its torn line

    def emit(self, line: str, event: Event) -> None:
        with self._lock:
            if self._fd is None:
                raise ValueError("the event log is closed")
            self._write(line.encode("utf-8") + b"\n")
        if self._console is not None:
            self._console(event)

    debug = info = warning = error = critical = exception = msg = emit

    def _write(self, data: bytes) -> None:
        assert self._fd is not None
        view = memoryview(data)
        try:
            while view:
                view = view[os.write(self._fd, view) :]
        except OSError as exc:  # a full disk: the run stops as `error`
            raise write_failed(self.path, exc) from exc

    def close(self) -> None:
        with self._lock:
            fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)


class EventLog:
    """Events of one task. `log.info("step.started", step_id="s1", attempt=1)`.

    `bind(**fields)` gives a child that adds those fields to every event and shares the file;
    closing the log (or leaving its `with` block) is the root's job, a child's close is a no-op.
    `console`, if given, receives every event as written (after redaction); `live`, if given,
    receives the typed events passed to `live()` (never written, so never redacted: a live
    view shows them on the user's own terminal only)."""

    def __init__(
        self,
        coder_dir: Path,
        task_id: str,
        redactor: Redactor | None = None,
        console: Console | None = None,
        live: LiveView | None = None,
    ) -> None:
        self.task_id = check_task_id(task_id)
        self.path = log_path(coder_dir, task_id)
        self.redactor = redactor if redactor is not None else Redactor()
        self._sink = _Sink(self.path, console, live)
        self._owner = True
        self._fields: Event = {"task_id": task_id}
        import structlog  # not at import: reading a log (`coder logs`) needs none

        self._logger: Any = structlog.wrap_logger(
            self._sink,
            processors=[
                structlog.processors.add_log_level,
                structlog.processors.TimeStamper(fmt="iso", utc=True),
                _conform,
                _redaction(self.redactor),
                _order_and_render,
            ],
            wrapper_class=structlog.BoundLogger,
            context_class=dict,
            cache_logger_on_first_use=False,
            task_id=task_id,
        ).bind()

    def bind(self, **fields: Any) -> EventLog:
        child = object.__new__(EventLog)
        child.task_id, child.path, child.redactor = self.task_id, self.path, self.redactor
        child._sink, child._owner = self._sink, False
        child._logger = self._logger.bind(**fields)
        child._fields = {**self._fields, **fields}
        return child

    def live(self, event: object) -> None:
        """Hand a typed event to the live view, if there is one (nothing is written)."""
        if self._sink.live is not None:
            self._sink.live(self._fields, event)

    def log(self, level: Level, event: str, **fields: Any) -> None:
        """An event at `level`, named by the caller (`info(...)` is `log("info", ...)`)."""
        getattr(self._logger, level)(event, **fields)

    def debug(self, event: str, **fields: Any) -> None:
        self._logger.debug(event, **fields)

    def info(self, event: str, **fields: Any) -> None:
        self._logger.info(event, **fields)

    def warning(self, event: str, **fields: Any) -> None:
        self._logger.warning(event, **fields)

    def error(self, event: str, **fields: Any) -> None:
        self._logger.error(event, **fields)

    def exception(self, event: str, **fields: Any) -> None:
        """An error event with the current exception's traceback (redacted like the rest)."""
        self._logger.exception(event, traceback=traceback.format_exc(), **fields)

    def close(self) -> None:
        if self._owner:
            self._sink.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def _parse_line(line: bytes) -> Event | None:
    try:
        event = json.loads(line)
    except (ValueError, RecursionError):  # torn by a crash, or not coder's line at all
        return None
    return event if isinstance(event, dict) else None


def read_events(coder_dir: Path, task_id: str) -> Iterator[Event]:
    """Every event logged so far. Lines that are not whole JSON objects (a line torn by a
    crash) are skipped; a missing log yields nothing."""
    try:
        fh = _open_log(log_path(coder_dir, task_id))
    except FileNotFoundError:
        return
    with fh:
        for line in fh:
            event = _parse_line(line)
            if event is not None:
                yield event


def _open_log(path: Path) -> BinaryIO:
    """The log, for reading, reached without following a link (coder.files.nofollow)."""
    return os.fdopen(nofollow.open_file(path, os.O_RDONLY | os.O_NONBLOCK), "rb")


def follow_events(
    coder_dir: Path, task_id: str, *, stop: Callable[[], bool], poll: float = 0.2
) -> Iterator[Event]:
    """Events from the start of the log, then new ones as they are appended, until `stop()`
    is true (checked between polls; lines written before it turned true are still yielded).
    Only complete lines are yielded; a partial line waits for its newline."""
    path = log_path(coder_dir, task_id)
    fh = None
    pending = b""
    try:
        while True:
            done = stop()
            if fh is None:
                with contextlib.suppress(FileNotFoundError):
                    fh = _open_log(path)
            if fh is not None:
                pending += fh.read()
                *lines, pending = pending.split(b"\n")
                for line in lines:
                    event = _parse_line(line)
                    if event is not None:
                        yield event
            if done:
                return
            time.sleep(poll)
    finally:
        if fh is not None:
            fh.close()
