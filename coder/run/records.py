"""A run's checkpoint as typed records: `RunState` (the run: its status, its steps, its
merges, pushes and notes) and `StepRecord` (one step's progress), with the JSON each is kept as.
coder.run.state keeps them on disk (a snapshot and a journal); git has the last word.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Literal, TypedDict, cast

from coder.display import listed
from coder.errors import (
    InvalidInput,
)
from coder.schemas import TASK_ID

if TYPE_CHECKING:
    from coder.models.usage import Usage, UsageRecord


StepStatus = Literal["pending", "running", "success", "failed", "skipped", "interrupted"]
RunStatus = Literal["pending", "running", "success", "failed", "error", "interrupted"]
SkipCause = Literal["failed", "user", "requirement"]
DONE: tuple[StepStatus, ...] = ("success", "skipped")  # a step that will not run again
VERSION = 2  # the checkpoint's format: 2 holds progress only (1 held the run's identity too)

# Why a step was skipped, as said in a run's summary ("1 step skipped after failing: s2").
SKIP_PHRASES: dict[SkipCause, str] = {
    "failed": "after failing",  # its own on_fail: skip
    "user": "by the user",  # at the approval prompt
    "requirement": "because a step they require was skipped",  # explicit depends_on
}


def now_iso() -> str:
    """The current time, UTC, ISO-8601 with a "Z" (e.g. 2026-11-22T03:57:43.897528Z)."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def seconds_since(started_at: str) -> float:
    """The seconds from an `now_iso` time until now (0 for a clock set back)."""
    begin = datetime.fromisoformat(started_at.replace("Z", "+00:00"))
    return round(max(0.0, datetime.now(UTC).timestamp() - begin.timestamp()), 3)


def check_task_id(task_id: str) -> str:
    """A task id is used as a file name: refuse anything that could leave the directory."""
    if not isinstance(task_id, str) or not TASK_ID.fullmatch(task_id):
        raise InvalidInput(
            f"invalid task id {task_id!r}",
            hint="task ids are 1-64 letters, digits, '-' or '_', starting with a letter or digit",
        )
    return task_id


# --- the records ----------------------------------------------------------------------------


@dataclass
class StepRecord:
    """One step of a run, as checkpointed."""

    status: StepStatus = "pending"
    attempts: int = 0
    commit: str | None = None
    start_tip: str | None = None  # the branch tip the current attempt started from
    started_at: str | None = None
    ended_at: str | None = None
    duration_s: float | None = None
    error: str | None = None
    skip_cause: SkipCause | None = None
    reasons: list[str] = field(default_factory=list)  # why rerun, skipped, reset, oldest first
    summary: str | None = None
    tool_protocol: str | None = None  # native | text: how its model got its tools (last attempt)
    tests: TestCounts | None = None
    usage: Usage | None = None  # model usage over all attempts
    notes: list[NoteRecord] = field(default_factory=list)  # the user's guidance (run/notes.py)
    # a step tried several ways at once: each try of its last round (coder.run.candidates)
    candidates: list[CandidateRecord] = field(default_factory=list)

    @property
    def tokens(self) -> int:
        return self.usage.prompt_tokens + self.usage.eval_tokens if self.usage else 0

    def to_dict(self) -> dict[str, Any]:
        data = {f.name: getattr(self, f.name) for f in fields(self)}
        data["reasons"] = list(self.reasons)
        data["notes"] = [dict(n) for n in self.notes]
        data["candidates"] = [dict(c) for c in self.candidates]
        data["usage"] = _usage_dict(self.usage) if self.usage else None
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> StepRecord:
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in data.items() if k in known}
        values["reasons"] = list(data.get("reasons") or [])
        values["notes"] = [cast(NoteRecord, dict(n)) for n in data.get("notes") or []]
        values["candidates"] = [
            cast(CandidateRecord, dict(c)) for c in data.get("candidates") or []
        ]
        usage = data.get("usage")
        if usage:
            from coder.models.usage import Usage  # not at import: a run of no model needs none

            values["usage"] = Usage(**usage)
        return cls(**values)


def _usage_dict(usage: Usage) -> UsageRecord:
    """As the state schema has it (durations rounded to the microsecond)."""
    record = {
        f.name: round(v, 6) if isinstance(v := getattr(usage, f.name), float) else v
        for f in fields(usage)
    }
    return cast("UsageRecord", record)


class CandidateRecord(TypedDict, total=False):
    """One try of a step tried several ways at once (coder.run.candidates), as judged."""

    number: int  # 1..N
    seed: int  # its sampling: the base seed + number - 1
    verdict: Literal["won", "passed", "failed"]
    error: str | None  # why it failed
    commit: str | None  # its own commit (on no branch but `branch`)
    branch: str | None  # where it is kept for a person to look at
    failing_tests: int | None
    diff_lines: int
    tokens: int
    why: str | None  # the winner's: what set it above the others


class NoteRecord(TypedDict):
    """A guidance note the user gave a step (coder.run.notes), stored redacted."""

    text: str
    via: str  # resume | revert | prompt
    at: str  # when it was given (ISO-8601, UTC)
    attempt: int  # the attempt it was given before (it reaches that one and every later one)


class TestCounts(TypedDict):
    """What a test step's last run counted (None: its output did not say)."""

    passed: int | None
    failed: int | None  # failures and errors
    skipped: int | None
    exit_code: int | None  # None: timed out or cancelled


class MergeRecord(TypedDict, total=False):
    """How the run was merged (`coder merge`), as the state schema has it."""

    commit: str
    base: str
    mode: str  # "squash" | "ff-only" | "no-ff"
    tag: str | None
    merged_at: str


class ForkPoint(TypedDict):
    """Where a fork (`coder fork`) left its parent run: the step it reruns from, and the
    parent's commit its branch's history copies up to (the parent's base: none)."""

    step: str
    commit: str


class PushRecord(TypedDict):
    """What `coder push` last pushed: the remote (its URL without user or password), the
    remote branch and the commit, so the next push replaces only what coder put there."""

    remote: str
    url: str
    ref: str
    commit: str
    pushed_at: str


@dataclass
class RunState:
    """One run's progress, as checkpointed: `.coder/state/ID.json` (schemas/state.schema.json).

    What the run is (its task, base, branch, worktree, taskfile, parent, order) is its
    manifest's alone (coder.run.manifest); a version 1 checkpoint also held those, and is
    read through `coder.run.state.identity_moved_to_manifest`. `task_id` stays as the key
    that ties the file to its run; `pid` and `error` say how the last runner left it."""

    task_id: str
    updated_at: str
    steps: dict[str, StepRecord]
    status: RunStatus = "pending"
    pid: int | None = None
    error: str | None = None
    merge: MergeRecord | None = None
    pushed: PushRecord | None = None  # `coder push`
    pushing: PushRecord | None = None  # a push recorded before it was made, not yet seen land
    journal_seq: int = 0  # the last journal line this snapshot contains
    version: int = VERSION

    _KEYS = (  # the file's key order
        "version",
        "task_id",
        "status",
        "pid",
        "error",
        "updated_at",
        "merge",
        "pushed",
        "pushing",
        "journal_seq",
    )

    def to_dict(self) -> dict[str, Any]:
        data = {key: getattr(self, key) for key in self._KEYS}
        if data["pushing"] is None:  # unset: the file as it was
            del data["pushing"]
        data["steps"] = {sid: record.to_dict() for sid, record in self.steps.items()}
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RunState:
        """From a version 2 object (`identity_moved_to_manifest` makes one of a version 1)."""
        values = {key: data[key] for key in cls._KEYS if key in data}
        steps = {sid: StepRecord.from_dict(r) for sid, r in data["steps"].items()}
        return cls(**values, steps=steps)

    @classmethod
    def new(cls, task_id: str, step_ids: list[str]) -> RunState:
        """The first checkpoint of a run: every step pending."""
        return cls(task_id=task_id, updated_at=now_iso(), steps={s: StepRecord() for s in step_ids})

    def skipped(self) -> list[tuple[str, StepRecord]]:
        return [(sid, r) for sid, r in self.steps.items() if r.status == "skipped"]

    def skipped_note(self) -> str | None:
        """What the run skipped and why, in one line (None when nothing was skipped):
        `1 step skipped after failing: s2; 2 steps skipped because ...: s3, s4`."""
        by_cause: dict[str, list[str]] = {}
        for step_id, record in self.skipped():
            by_cause.setdefault(record.skip_cause or "failed", []).append(step_id)
        parts = []
        for cause, phrase in SKIP_PHRASES.items():
            ids = by_cause.get(cause, [])
            if ids:
                shown = listed(ids, 10)
                parts.append(f"{len(ids)} step{'s' * (len(ids) != 1)} skipped {phrase}: {shown}")
        return "; ".join(parts) or None

    def usage(self) -> Usage:
        """Model usage of the whole run."""
        from coder.models.usage import Usage

        total = Usage()
        for record in self.steps.values():
            if record.usage:
                total += record.usage
        return total
