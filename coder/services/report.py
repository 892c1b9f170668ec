"""`coder report`: what a reviewer needs to judge a run, as Markdown for a pull request (or
JSON): the task and its spec, the DAG with statuses, per step its goal, outcome, commit, files
changed, tests before and after, fix cycles and why, tokens, time and cache reuse; the whole
diff's stat; how to merge or revert.

Built on what `coder show -t` reads (`coder.run.opened.open_run`), so its figures are show's;
the event log adds what the state does not keep (the failing tests each fix cycle started
from), git the files each commit changed. Everything that leaves is redacted, as logs are (file
names first, each on its own); a file name is quoted as git quotes an unusual one, and what
goes into a table cannot break its row (`|` and newlines escaped).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, cast

from coder.agent.fallback import model_at
from coder.display import escaped, quoted_name
from coder.git import branches, diffs
from coder.models.usage import cache_share
from coder.run import eventlog, judge
from coder.run.opened import OpenRun
from coder.taskfile import diagram

if TYPE_CHECKING:
    from coder.models.usage import UsageRecord
    from coder.redact import Redactor
    from coder.run.records import CandidateRecord, MergeRecord, NoteRecord, TestCounts
    from coder.taskfile import Task

EMOJI = {
    "success": "✅",
    "failed": "❌",
    "error": "⛔",
    "skipped": "⏭️",
    "interrupted": "⏸️",
    "running": "⏳",
    "pending": "⬜",
}
NOT_REPORTED = "not reported"


@dataclass(frozen=True)
class FixCycle:
    cycle: int
    why: str  # the tests' counts that started it


@dataclass(frozen=True)
class StepReport:
    id: str
    kind: str
    goal: str
    status: str
    attempts: int
    commit: str | None
    outcome: str  # the step's summary, or its error
    files: list[diffs.FileChange]
    tests_before: str | None  # counts before the fix cycles (test steps that had any)
    tests_after: str | None  # the counts the step ended with
    fix_cycles: list[FixCycle]
    usage: UsageRecord  # the state's, as `coder show --json` prints it
    duration_s: float | None
    reasons: list[str]
    notes: list[NoteRecord] = field(default_factory=list)  # the user's guidance (run/notes.py)
    candidates: list[CandidateRecord] = field(default_factory=list)  # run/candidates.py

    @property
    def tokens(self) -> int:
        """Prompt + generated tokens, as `coder show`'s table counts them."""
        return int(self.usage.get("prompt_tokens", 0) + self.usage.get("eval_tokens", 0))

    @property
    def cache_share(self) -> float | None:
        """The share of prompt tokens the server served from its cache; None when no call's
        server reported it (Ollama does not): never estimated."""
        return cache_share(self.usage) if self.usage else None


@dataclass(frozen=True)
class RunReport:
    task_id: str
    title: str
    spec: str | None
    taskfile: str | None
    model: str | None
    status: str
    error: str | None
    branch: str
    base: str
    base_commit: str
    tip: str | None  # None: the branch is gone
    merge: MergeRecord | None
    steps: list[StepReport]
    files: list[diffs.FileChange]  # base..tip
    mermaid: str
    next_steps: list[tuple[str, str]] = field(default_factory=list)  # (what, command)
    models: list[str] = field(default_factory=list)  # every model that answered, run's first
    # --include-uncommitted: the run's first commit and the files it changed (in `files` too)
    checkout_commit: str | None = None
    checkout_files: list[diffs.FileChange] = field(default_factory=list)
    parent: str | None = None  # a fork's parent run (`coder fork`), and the step it left at
    forked_at: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "task_id": self.task_id,
            "title": self.title,
            "spec": self.spec,
            "taskfile": self.taskfile,
            "model": self.model,
            "models": self.models,
            "status": self.status,
            "error": self.error,
            "branch": self.branch,
            "base": self.base,
            "base_commit": self.base_commit,
            "checkout_commit": self.checkout_commit,
            "checkout_files": [f.as_dict() for f in self.checkout_files],
            "tip": self.tip,
            "merge": self.merge,
            "parent": self.parent,
            "forked_at": self.forked_at,
            "totals": totals(self),
            "steps": [
                {
                    "id": s.id,
                    "kind": s.kind,
                    "goal": s.goal,
                    "status": s.status,
                    "attempts": s.attempts,
                    "commit": s.commit,
                    "outcome": s.outcome,
                    "files": [f.as_dict() for f in s.files],
                    "tests_before": s.tests_before,
                    "tests_after": s.tests_after,
                    "fix_cycles": [{"cycle": c.cycle, "why": c.why} for c in s.fix_cycles],
                    "tokens": s.tokens,
                    "usage": s.usage,
                    "cache_share": s.cache_share,
                    "duration_s": s.duration_s,
                    "reasons": s.reasons,
                    "notes": s.notes,
                    "candidates": s.candidates,
                }
                for s in self.steps
            ],
            "files": [f.as_dict() for f in self.files],
            "mermaid": self.mermaid,
            "next_steps": [{"what": w, "command": c} for w, c in self.next_steps],
        }


def build(view: OpenRun) -> RunReport:
    state = view.state.to_dict()  # as `coder show -t --json` prints it
    manifest = view.manifest
    repo = view.repo
    tip = branches.branch_tip(repo, manifest.branch)
    cycles = _fix_cycles(view)
    steps = []
    for step in manifest.doc["graph"]:
        st = state["steps"].get(step["id"], {})
        commit = st.get("commit")
        files = diffs.diff_files(repo, f"{commit}^", commit) if commit else []
        mine = cycles.get(step["id"], [])
        steps.append(
            StepReport(
                id=step["id"],
                kind=step["kind"],
                goal=step.get("goal", ""),
                status=st.get("status", "pending"),
                attempts=int(st.get("attempts") or 0),
                commit=commit,
                outcome=str(st.get("error") or st.get("summary") or ""),
                files=files,
                tests_before=mine[0].why if mine else None,
                tests_after=tests_summary(st["tests"]) if st.get("tests") else None,
                fix_cycles=mine,
                usage=cast("UsageRecord", dict(st.get("usage") or {})),
                duration_s=st.get("duration_s"),
                reasons=list(st.get("reasons") or []),
                notes=list(st.get("notes") or []),
                candidates=list(st.get("candidates") or []),
            )
        )
    report = RunReport(
        task_id=manifest.task_id,
        title=manifest.task.title,
        spec=manifest.doc.get("spec"),
        taskfile=_relative(manifest.taskfile, view.root),
        model=manifest.doc.get("model"),
        status=state["status"],
        error=state.get("error"),
        branch=manifest.branch,
        base=manifest.base,
        base_commit=manifest.base_commit,
        tip=tip,
        merge=state.get("merge"),
        steps=steps,
        files=diffs.diff_files(repo, manifest.base_commit, tip) if tip else [],
        mermaid=diagram.mermaid(diagram.nodes_of_run(view.manifest.task, state["steps"])),
        models=models_used(view.manifest.task, {s.id: s.attempts for s in steps if s.usage}),
        checkout_commit=manifest.checkout_commit,
        checkout_files=(
            diffs.diff_files(repo, manifest.base_commit, manifest.checkout_commit)
            if manifest.checkout_commit
            else []
        ),
        parent=manifest.parent,
        forked_at=manifest.forked_at["step"] if manifest.forked_at else None,
    )
    return _with_next_steps(report)


def _relative(path: str | None, root: Any) -> str | None:
    """A taskfile inside the repository by its repository path (the report is shared)."""
    from pathlib import Path

    if not path:
        return None
    try:
        return Path(path).resolve().relative_to(root).as_posix()
    except ValueError:
        return path


def _fix_cycles(view: OpenRun) -> dict[str, list[FixCycle]]:
    """Per step, the fix cycles of its last attempt (an attempt starts afresh)."""
    found: dict[str, list[FixCycle]] = {}
    for event in eventlog.read_events(view.coder_dir, view.task_id):
        step = event.get("step_id")
        if not step:
            continue
        if event.get("event") == "step.started":
            found[step] = []
        elif event.get("event") == "fix.cycle":
            found.setdefault(step, []).append(
                FixCycle(int(event.get("cycle", 0)), str(event.get("failing", "")))
            )
    return found


def tests_summary(tests: TestCounts) -> str:
    """The counts a test step recorded, worded as the test report words them, with the
    command's exit status: the verdict (a suite's own report may claim anything)."""
    parts = [f"{tests[key]} {key}" for key in ("passed", "failed", "skipped") if tests.get(key)]
    exit_status = f"exit {tests.get('exit_code')}"
    return f"{', '.join(parts)} ({exit_status})" if parts else f"no counts ({exit_status})"


def totals(report: RunReport) -> dict[str, Any]:
    usage: dict[str, float] = {}
    for step in report.steps:
        for key, value in step.usage.items():
            if isinstance(value, (int, float)):
                usage[key] = usage.get(key, 0) + value
    return {
        "steps": len(report.steps),
        "commits": sum(1 for s in report.steps if s.commit),
        "files": len(report.files),
        "added": sum(f.added for f in report.files),
        "removed": sum(f.removed for f in report.files),
        "tokens": sum(s.tokens for s in report.steps),
        "model_calls": int(usage.get("calls", 0)),
        "fix_cycles": sum(len(s.fix_cycles) for s in report.steps),
        "cache_share": cache_share(usage) if usage else None,
        "duration_s": round(sum(s.duration_s or 0 for s in report.steps), 3),
    }


def _with_next_steps(report: RunReport) -> RunReport:
    from dataclasses import replace

    tid, tag = report.task_id, f"coder/{report.task_id}"
    merge = report.merge or {}
    if merge.get("commit"):
        undo = "git revert --no-edit" + (" -m 1" if merge.get("mode") == "no-ff" else "")
        steps = [
            ("undo the merge with a new commit", f"{undo} {tag}"),
            ("remove the run (its branch too, once merged)", f"coder clean -t {tid}"),
        ]
    elif report.status == "success":
        steps = [
            ("read the whole change", f"coder diff -t {tid}"),
            (
                f"land it on {report.base} as one squash commit (tests run on the merge result)",
                f"coder merge -t {tid} --if-green",
            ),
        ]
    else:
        steps = [("continue the run where it stopped", f"coder resume -t {tid}")]
    committed = [s.id for s in report.steps if s.commit]
    if not merge.get("commit") and committed:
        steps.append(
            (
                "undo the steps after one (they run again on resume)",
                f"coder revert -t {tid} --to-step {committed[0]}",
            )
        )
    if not merge.get("commit"):
        steps.append(("drop the run and its branch", f"coder clean -t {tid} --delete-branch"))
    return replace(report, next_steps=steps)


# --- Markdown --------------------------------------------------------------------------------


def markdown(report: RunReport) -> str:
    """The report as GitHub-flavoured Markdown (tables, a mermaid block, <details>)."""
    out = _head(report) + _task_section(report)
    out += ["## The DAG", "", "```mermaid", report.mermaid.rstrip(), "```", ""]
    out += _steps_table(report.steps)
    for s in report.steps:
        out += _step_section(s)
    out += _changes_section(report) + _next_section(report)
    return "\n".join(out)


def _models_cell(report: RunReport) -> str:
    """`model | NAME`, or `models | A, B (together)` when steps' own or fallback models
    answered too: their calls are in the totals, never counted as the run's model's."""
    if len(report.models) > 1:
        return f"models | {_inline(', '.join(report.models))} (together)"
    return f"model | {_inline(report.model or '-')}"


def models_used(task: Task, attempts: dict[str, int]) -> list[str]:
    """The models the attempts of a run's model steps used (`attempts`: made per step id),
    the run's own first: a step's `model`, and its `fallback_model` once it took over; none
    when no step uses a model."""
    if not any(step.uses_model for step in task.steps):
        return []
    found = [task.model] if task.model else []
    for step in task.steps:
        if not step.uses_model:
            continue
        for attempt in range(1, attempts.get(step.id, 0) + 1):
            name = model_at(task, step, attempt)[0] or task.model
            if name and name not in found:
                found.append(name)
    return found


def _head(report: RunReport) -> list[str]:
    """The title, the run's status and its facts table."""
    t = totals(report)
    out = [f"# {_inline(report.title)}", ""]
    status = f"{EMOJI.get(report.status, '')} **{report.status}**"
    if report.error:
        status += f": {_inline(report.error)}"
    out.append(f"Run `{report.task_id}` · {status}")
    out.append("")
    facts = [
        f"| branch | {_code(report.branch)} from {_code(report.base)} at "
        f"`{report.base_commit[:8]}` |",
        f"| steps | {t['steps']} ({_count(t['commits'], 'commit')}, "
        f"{_count(t['fix_cycles'], 'fix cycle')}) |",
        f"| changes | {_count(t['files'], 'file')}, +{t['added']} −{t['removed']} |",
        (
            f"| {_models_cell(report)}: {t['tokens']:,} tokens in "
            f"{_count(t['model_calls'], 'call')}, cache reuse {_share(t['cache_share'])} |"
            if report.models
            else "| model | none: no step of the run uses one |"
        ),
        f"| time | {t['duration_s']:.1f} s in steps |",
    ]
    if report.checkout_commit:
        facts.insert(
            1,
            f"| checkout | first commit `{report.checkout_commit[:8]}`: "
            f"{_count(len(report.checkout_files), 'uncommitted file')} from the checkout |",
        )
    if report.parent:
        facts.append(
            f"| forked | from run {_code(report.parent)} at step {_code(report.forked_at or '')} |"
        )
    merge = report.merge or {}
    if merge.get("commit"):
        facts.append(
            f"| merged | into `{merge.get('base')}` as `{str(merge['commit'])[:8]}` "
            f"({merge.get('mode')}, tag `{merge.get('tag')}`) |"
        )
    return out + ["| | |", "|---|---|", *facts, ""]


def _task_section(report: RunReport) -> list[str]:
    out = ["## Task", ""]
    if report.taskfile:
        out += [f"Taskfile: {_code(report.taskfile)}", ""]
    if report.spec:
        spec = escaped(report.spec.strip(), lines=True)
        out += ["<details open><summary>Spec</summary>", "", spec, "", "</details>"]
    else:
        out.append("No spec: the taskfile was written by hand.")
    return out + [""]


def _steps_table(steps: list[StepReport]) -> list[str]:
    out = ["## Steps", ""]
    out.append(
        "| step | kind | outcome | commit | files | tests (before → after) "
        "| fix cycles | tokens | time | cache reuse |"
    )
    out.append("|---|---|---|---|---|---|---|---:|---:|---|")
    for s in steps:
        out.append(
            "| "
            + " | ".join(
                [
                    f"[{s.id}](#{_anchor(s)})",
                    s.kind,
                    f"{EMOJI.get(s.status, '')} {s.status}",
                    f"`{s.commit[:8]}`" if s.commit else "—",
                    _files_cell(s.files),
                    _tests_cell(s),
                    str(len(s.fix_cycles)) if s.fix_cycles else "—",
                    f"{s.tokens:,}" if s.usage else "—",
                    f"{s.duration_s:.1f} s" if s.duration_s is not None else "—",
                    _cache_cell(s),
                ]
            )
            + " |"
        )
    return out + [""]


def _changes_section(report: RunReport) -> list[str]:
    out = ["## Changes", ""]
    if report.files:
        t = totals(report)
        out += _files_table(report.files)
        out += ["", f"{_count(t['files'], 'file')} changed, +{t['added']} −{t['removed']}"]
    else:
        out.append("No changes on the branch.")
    return out + [""]


def _next_section(report: RunReport) -> list[str]:
    out = ["## Merge or revert", ""]
    for what, cmd in report.next_steps:
        out.append(f"- {what[:1].upper()}{what[1:]}: `{cmd}`")
    return out + [
        "",
        f"<sub>Written by `coder report -t {report.task_id}`. Each step is one commit on "
        f"`{report.branch}` with the trailers `Coder-Task: {report.task_id}` and "
        "`Coder-Step`.</sub>",
        "",
    ]


def _step_section(s: StepReport) -> list[str]:
    out = [f"### {s.id} · {s.kind}", "", f"**Goal:** {_inline(s.goal)}", ""]
    tries = _count(s.attempts, "attempt")
    out.append(f"- **Outcome:** {EMOJI.get(s.status, '')} {s.status} ({tries})")
    if s.outcome:
        out[-1] += f": {_inline(s.outcome)}"
    out.append(f"- **Commit:** `{s.commit}`" if s.commit else "- **Commit:** none")
    if s.tests_after or s.tests_before:
        out.append(f"- **Tests:** {_tests_cell(s)}")
    for cycle in s.fix_cycles:
        out.append(f"- **Fix cycle {cycle.cycle}:** started from red tests ({_inline(cycle.why)})")
    if s.usage:
        u = s.usage
        out.append(
            f"- **Model:** {_count(int(u.get('calls', 0)), 'call')}, "
            f"{int(u.get('prompt_tokens', 0)):,} prompt + {int(u.get('eval_tokens', 0)):,} "
            f"generated tokens, {float(u.get('total_s', 0)):.1f} s of model time; "
            f"cache reuse {_cache_cell(s)}"
        )
    if s.duration_s is not None:
        out.append(f"- **Time:** {s.duration_s:.1f} s")
    if s.candidates:
        out.append(f"- **Candidates:** {_inline(judge.summary(s.candidates))}")
        out += [f"  - {_inline(judge.shown(c))}" for c in s.candidates]
    for reason in s.reasons:
        out.append(f"- **Note:** {_inline(reason)}")
    for note in s.notes:
        out.append(
            f"- **Guidance for attempt {note['attempt']}** (via {note['via']}): "
            f"{_inline(note['text'])}"
        )
    out.append("")
    if s.files:
        out += _files_table(s.files) + [""]
    return out


def _files_table(files: list[diffs.FileChange]) -> list[str]:
    rows = ["| file | | + | − |", "|---|---|---:|---:|"]
    for f in files:
        name = f"{_code(f.old_path)} → {_code(f.path)}" if f.old_path else _code(f.path)
        rows.append(f"| {name} | {f.status} | {f.added} | {f.removed} |")
    return rows


def _code(name: str) -> str:
    """A file name as a Markdown code span that keeps to its table cell: quoted when unusual
    (its controls and newlines escaped), `|` escaped, fenced by more backticks than it holds."""
    shown = quoted_name(name)
    longest = max((len(run) for run in re.findall("`+", shown)), default=0)
    fence = "`" * (longest + 1)
    pad = " " if shown.startswith("`") or shown.endswith("`") else ""
    return f"{fence}{pad}{shown}{pad}{fence}".replace("|", "\\|")


def _files_cell(files: list[diffs.FileChange]) -> str:
    if not files:
        return "—"
    return f"{len(files)} (+{sum(f.added for f in files)} −{sum(f.removed for f in files)})"


def _tests_cell(s: StepReport) -> str:
    if s.tests_before and s.tests_after:
        return f"{s.tests_before} → {s.tests_after}"
    return s.tests_after or s.tests_before or "—"


def _cache_cell(s: StepReport) -> str:
    return _share(s.cache_share) if s.usage else "—"


def _share(share: float | None) -> str:
    return NOT_REPORTED if share is None else f"{share:.0%}"


def _anchor(s: StepReport) -> str:
    """GitHub's heading anchor for `### {id} · {kind}`."""
    text = f"{s.id} · {s.kind}".lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def _inline(text: str) -> str:
    """One line that cannot break a table, open HTML or drive a terminal."""
    line = escaped(" ".join(str(text).split()))
    return line.replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;")


def _count(n: int, word: str) -> str:
    return f"{n} {word}{'s' * (n != 1)}"


def commit_summary(report: RunReport) -> str:
    """The report as plain lines for a merge commit's body (`coder merge --report`): the run's
    totals, then per step its title and what it came to."""
    t = totals(report)
    lines = [
        f"Run {report.task_id}: {report.status}; {_count(t['commits'], 'commit')}, "
        f"{_count(t['files'], 'file')} +{t['added']} -{t['removed']}, "
        f"{t['tokens']} tokens in {_count(t['model_calls'], 'model call')}, "
        f"{t['duration_s']:.1f}s in steps.",
        "",
    ]
    for s in report.steps:
        parts = [s.status, s.commit[:8] if s.commit else "no commit"]
        if s.files:
            added, removed = sum(f.added for f in s.files), sum(f.removed for f in s.files)
            parts.append(f"{_count(len(s.files), 'file')} +{added} -{removed}")
        if s.tests_after or s.tests_before:
            parts.append(f"tests {_tests_cell(s).replace('→', '->')}")
        if s.fix_cycles:
            parts.append(_count(len(s.fix_cycles), "fix cycle"))
        if s.usage:
            parts.append(f"{s.tokens} tokens")
        title = f"{s.id}: {' '.join(s.goal.split())}"
        lines.append(f"- {title if len(title) <= 70 else title[:69] + '…'}")
        lines.append(f"  {', '.join(parts)}")
    return "\n".join(lines)


def render(report: RunReport, redactor: Redactor, fmt: str = "md") -> str:
    """The report as Markdown (`md`) or JSON, redacted by `redactor` (the run's secrets as
    far as this process knows them, coder.services.history.redactor_of): each file name on its
    own first (before it is quoted), then the whole text."""
    import json

    def names(files: list[diffs.FileChange]) -> list[diffs.FileChange]:
        return [
            replace(
                f,
                path=redactor.redact(f.path),
                old_path=f.old_path and redactor.redact(f.old_path),
            )
            for f in files
        ]

    report = replace(
        report,
        files=names(report.files),
        steps=[replace(s, files=names(s.files)) for s in report.steps],
    )
    if fmt == "json":
        return json.dumps(redactor.redact_obj(report.as_dict()), indent=2) + "\n"
    return redactor.redact(markdown(report))
