"""Taskfiles: YAML -> checked `Task`, with every problem reported at once as FILE:LINE:COL.

Checks, in order: the file is readable YAML (yamldoc), the document matches
`schemas/task.schema.json`, then what a schema cannot say: unique step ids, known `depends_on`
targets, no cycles, options that fit the step's kind, paths that stay in the repository.

This module is the package's face (`Task`, `load`, `from_dict`); beside it:

    kinds.py     step kinds: one frozen description per kind, the one place each kind's rules live
    graph.py     the task DAG: build it, find cycles, order it, walk it
    diagram.py   the DAG as a picture: boxes by level, Mermaid and Graphviz DOT
    policies.py  a taskfile's `policies`, read once into a frozen, typed `Policies`

May import: the base modules (errors, yamldoc, schemas, display, files, ...).
"""

from __future__ import annotations

import re
import secrets
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from coder import yamldoc
from coder.display import counted
from coder.errors import DocumentError, InvalidInput, InvalidTaskfile, Problem
from coder.redact import redact
from coder.schemas import TASK_ID, load_schema, validator
from coder.taskfile.kinds import KIND_FIELDS, KINDS, kinds_taking
from coder.taskfile.policies import Policies, parse_duration
from coder.yamldoc import Document, quote

MAX_PROBLEMS = 200


@dataclass(frozen=True)
class Assertion:
    type: str
    path: str
    contains: str | None = None


# A task as a taskfile document (what `Task.to_dict` returns and `from_dict` reads; the manifest
# and the state keep it, secrets left out): free-form JSON that schemas/task.schema.json checks.
TaskDoc = dict[str, Any]


@dataclass(frozen=True)
class Step:
    id: str
    kind: str
    goal: str
    depends_on: tuple[str, ...] = ()
    timeout_s: int | None = None
    retries: int | None = None  # None: the task's policies.retries
    changes: tuple[dict[str, str], ...] = ()
    cmd: str | None = None
    cwd: str | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    framework: str | None = None
    args: tuple[str, ...] = ()
    asserts: tuple[Assertion, ...] = ()
    strategy: str = "revert_and_stop"
    max_cycles: int = 1
    tools: tuple[str, ...] | None = None
    model: str | None = None  # None: the task's model
    fallback_model: str | None = None  # None: the task's fallback_model
    candidates: int = 1  # attempts at once, the best one landing (coder.run.candidates)
    judge: str = "evidence"  # or "model": the model chooses among those that passed

    @property
    def uses_model(self) -> bool:
        """Model steps, and test steps that ask the model to fix failures."""
        return KINDS[self.kind].uses_model or self.strategy == "fix_and_retry"


@dataclass(frozen=True)
class Task:
    id: str
    title: str
    branch: str
    steps: tuple[Step, ...]
    base: str | None = None  # None: the repository's current branch, resolved at run start
    model: str | None = None  # None: the config's model
    fallback_model: str | None = None  # from the third attempt of a step that failed twice
    spec: str | None = None
    created_at: str | None = None
    policies: Policies = field(default_factory=Policies)
    success: Mapping[str, Any] = field(default_factory=dict)
    # No step declares depends_on: each step follows the one before it, in order only (a
    # skipped step does not stop the next). With depends_on, a dependency is a requirement.
    sequential: bool = False
    source: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)

    def step(self, step_id: str) -> Step:
        for s in self.steps:
            if s.id == step_id:
                return s
        known = ", ".join(s.id for s in self.steps)
        raise InvalidInput(f"task {self.id} has no step {step_id!r} (its steps: {known})")

    def deps(self) -> dict[str, tuple[str, ...]]:
        return {s.id: s.depends_on for s in self.steps}

    def retries(self, step: Step) -> int:
        """How often a failed attempt of `step` is tried again: its own `retries`, else the
        task's `policies.retries` (0)."""
        return self.policies.retries if step.retries is None else step.retries

    def resolved(self, *, base: str, model: str) -> Task:
        from dataclasses import replace

        return replace(self, base=self.base or base, model=self.model or model)

    def renamed(self, task_id: str, branch: str | None = None) -> Task:
        """This task as its document would read with `id: task_id` (and `branch`, if given;
        else the document's, or the one the new id gives)."""
        return from_dict({**self.source, "id": task_id, **({"branch": branch} if branch else {})})

    def to_dict(self) -> TaskDoc:
        """The task as a taskfile document with every default filled in (what runs)."""
        doc: TaskDoc = {"id": self.id, "title": self.title, "branch": self.branch}
        for key in ("base", "model", "fallback_model", "spec", "created_at"):
            if getattr(self, key) is not None:
                doc[key] = getattr(self, key)
        policies = self.policies.to_dict()
        if policies:
            doc["policies"] = policies
        if self.success:
            doc["success"] = dict(self.success)
        doc["graph"] = [_step_dict(s, self.sequential) for s in self.steps]
        return doc


def _step_dict(s: Step, sequential: bool) -> dict[str, Any]:
    d: dict[str, Any] = {"id": s.id, "kind": s.kind, "goal": s.goal}
    if not sequential:  # written out, the file order would become requirements
        d["depends_on"] = list(s.depends_on)
    optional = {
        "timeout": s.timeout_s,
        "retries": s.retries,
        "cmd": s.cmd,
        "cwd": s.cwd,
        "framework": s.framework,
        "changes": [dict(c) for c in s.changes] or None,
        "env": dict(s.env) or None,
        "args": list(s.args) or None,
        "assert": [{k: v for k, v in vars(a).items() if v is not None} for a in s.asserts] or None,
        "tools": list(s.tools) if s.tools is not None else None,
        "model": s.model,
        "fallback_model": s.fallback_model,
        "candidates": s.candidates if s.candidates != 1 else None,
        "judge": s.judge if s.judge != "evidence" else None,
    }
    d.update({k: v for k, v in optional.items() if v is not None})
    if s.strategy != "revert_and_stop" or s.max_cycles != 1:
        d["on_fail"] = {"strategy": s.strategy, "max_cycles": s.max_cycles}
    return d


# --- loading -------------------------------------------------------------------------------


def load(path: Path, name: str | None = None) -> Task:
    """A checked Task from a file, or InvalidTaskfile listing every problem."""
    problems, task = check_file(path, name)
    if problems:
        raise InvalidTaskfile(problems)
    assert task is not None
    return task


def check_file(path: Path, name: str | None = None) -> tuple[list[Problem], Task | None]:
    name = name or str(path)
    try:
        doc = yamldoc.load(path, name)
    except DocumentError as exc:
        return exc.problems, None
    return check_document(doc, default_id=id_from_name(path))


def id_from_name(path: Path) -> str | None:
    """The id of a run from the taskfile at `path` when the file sets none: its name,
    `tasks/fix-login.yaml` -> `fix-login`, as `coder run -t fix-login` finds it (None when
    the name is no valid id)."""
    stem = path.name.removesuffix(".yaml").removesuffix(".yml")
    return stem if TASK_ID.fullmatch(stem) else None


def check_document(
    doc: Document, default_id: str | None = None
) -> tuple[list[Problem], Task | None]:
    """Every problem of the taskfile `doc`, or its Task (with `default_id`, else a generated
    one, where it sets no `id`)."""
    if doc.data is None:
        return [
            Problem(
                doc.name,
                1,
                1,
                "file is empty; a taskfile needs at least `title` and `graph` (a list of steps)",
            )
        ], None
    if not isinstance(doc.data, dict):
        line, col = doc.position(())
        return [
            Problem(
                doc.name,
                line,
                col,
                "a taskfile must be a mapping with `title` and "
                f"`graph`, not a {_yaml_type(doc.data)}",
            )
        ], None
    problems = _schema_problems(doc) + _graph_problems(doc)
    problems.sort(key=lambda p: (p.line, p.col))
    if len(problems) > MAX_PROBLEMS:
        extra = counted(len(problems) - MAX_PROBLEMS, "more problem")
        problems = problems[:MAX_PROBLEMS] + [
            Problem(doc.name, problems[MAX_PROBLEMS].line, 1, f"... and {extra}")
        ]
    if problems:
        return problems, None
    return [], from_dict(doc.data, default_id)


def from_dict(data: Mapping[str, Any], default_id: str | None = None) -> Task:
    """Build a Task from a schema-valid document, filling in the defaults."""
    raw_steps = data["graph"]
    ids = [s.get("id") or f"s{i}" for i, s in enumerate(raw_steps, 1)]
    sequential = not any("depends_on" in s for s in raw_steps)
    steps = [
        build_step(
            raw, sid, ([ids[i - 1]] if i else []) if sequential else raw.get("depends_on", [])
        )
        for i, (sid, raw) in enumerate(zip(ids, raw_steps))
    ]
    task_id = data.get("id") or default_id or generate_id()
    return Task(
        id=task_id,
        title=data["title"],
        branch=data.get("branch") or default_branch(task_id, data["title"]),
        steps=tuple(steps),
        base=data.get("base"),
        model=data.get("model"),
        fallback_model=data.get("fallback_model"),
        spec=data.get("spec"),
        created_at=data.get("created_at"),
        policies=Policies.from_dict(data.get("policies", {})),
        success=dict(data.get("success", {})),
        sequential=sequential,
        source=data,
    )


def build_step(raw: Mapping[str, Any], sid: str, depends_on: Sequence[str] = ()) -> Step:
    """A Step from one step of a schema-valid document, with its defaults filled in."""
    on_fail = raw.get("on_fail", {})
    default_goal = KINDS[raw["kind"]].default_goal or ""
    return Step(
        id=sid,
        kind=raw["kind"],
        goal=raw.get("goal") or default_goal.format(cmd=short_command(raw.get("cmd") or "")),
        depends_on=tuple(depends_on),
        timeout_s=parse_duration(raw["timeout"]) if "timeout" in raw else None,
        retries=raw.get("retries"),
        changes=tuple(dict(c) for c in raw.get("changes", [])),
        cmd=raw.get("cmd"),
        cwd=raw.get("cwd"),
        env=dict(raw.get("env", {})),
        framework=raw.get("framework"),
        args=tuple(raw.get("args", [])),
        asserts=tuple(
            Assertion(a["type"], a["path"], a.get("contains")) for a in raw.get("assert", [])
        ),
        strategy=on_fail.get("strategy", "revert_and_stop"),
        max_cycles=on_fail.get("max_cycles", 1),
        tools=tuple(raw["tools"]) if "tools" in raw else None,
        model=raw.get("model"),
        fallback_model=raw.get("fallback_model"),
        candidates=raw.get("candidates", 1),
        judge=raw.get("judge", "evidence"),
    )


def short_command(cmd: str, limit: int = 80) -> str:
    """A command as messages show it: its first line, cut to `limit` characters."""
    lines = cmd.strip().splitlines() or [""]
    first = lines[0]
    return first if len(first) <= limit and len(lines) == 1 else f"{first[:limit]} …"


def shown_command(cmd: str, limit: int = 2000) -> str:
    """A command where it is shown in full (the approval prompt, a dry run, a step commit's
    body): whole up to `limit` characters, else cut at a line with how much was left out
    (a 200 KB heredoc is the taskfile's to hold, not every screen's)."""
    if len(cmd) <= limit:
        return cmd
    head = cmd[:limit]
    head = head[: head.rfind("\n")] if "\n" in head[limit // 2 :] else head
    left = f"{len(cmd) - len(head):,} more characters of {len(cmd):,}"
    return f"{head} … ({left}; the whole command is in the taskfile)"


def generate_id() -> str:
    return time.strftime("T-%Y%m%d-%H%M%S-") + secrets.token_hex(2)


def default_branch(task_id: str, title: str) -> str:
    """`agent/ID-slug`, the slug made of the title with any key it holds redacted (a branch
    name is shown everywhere and goes wherever the repository goes)."""
    return f"agent/{task_id}-{slugify(redact(title))}"


def slugify(title: str, limit: int = 40) -> str:
    slug = re.sub(r"[^a-z0-9]+", "-", title.lower()).strip("-")
    return slug[:limit].rstrip("-") or "task"


# --- schema problems -----------------------------------------------------------------------


def _schema_problems(doc: Document) -> list[Problem]:
    problems = []
    for error in validator("task").iter_errors(doc.data):
        problems.extend(_describe(doc, error))
    return problems


def _describe(doc: Document, error: Any) -> list[Problem]:
    path = list(error.absolute_path)
    where = field_path(path)
    if len(path) >= 2 and path[0] == "graph" and isinstance(path[1], int):
        step = doc.data["graph"][path[1]]
        if isinstance(step, dict) and isinstance(step.get("id"), str) and len(step["id"]) < 65:
            where = f"{where} (step {step['id']})"
    prefix = f"{where}: " if where else ""
    instance, schema = error.instance, error.schema
    if error.validator == "additionalProperties" and isinstance(instance, dict):
        allowed = list(schema.get("properties", {}))
        out = []
        for key in [k for k in instance if k not in allowed]:
            line, col = doc.position([*path, key], key=True)
            hint = yamldoc.did_you_mean(str(key), allowed)
            out.append(
                Problem(
                    doc.name,
                    line,
                    col,
                    f"{prefix}unknown field {quote(key)}{hint}",
                    json_path([*path, key]),
                )
            )
        return out
    line, col = doc.position(path)
    message = yamldoc.schema_message(doc, error)
    if error.validator == "required":
        missing = [k for k in error.validator_value if k not in instance]
        message = f"missing required field {missing[0]!r}" if missing else message
        if (
            isinstance(instance, dict)
            and isinstance(instance.get("kind"), str)
            and len(path) == 2
            and path[0] == "graph"
        ):
            kind = instance["kind"]
            message += f" for {'an' if kind.startswith(tuple('aeiou')) else 'a'} {kind} step"
    elif error.validator == "enum":
        hint = yamldoc.did_you_mean(str(instance), [str(v) for v in error.validator_value])
        choices = ", ".join(map(str, error.validator_value))
        message = f"{quote(instance)} is not one of {choices}{hint}"
    elif error.validator in ("oneOf", "anyOf") and "description" in schema:
        message = f"{quote(instance)} is not valid here: {schema['description']}"
    elif error.validator == "pattern" and path and path[-1] == "branch":
        message = f"{quote(instance)} is not a valid branch: {_branch_problem(instance)}"
    elif error.validator == "pattern" and path and path[-1] == "id":
        message = (
            f"{quote(instance)} is not a valid id: use letters, digits, - and _ "
            "(step ids start with a letter)"
        )
    return [Problem(doc.name, line, col, f"{prefix}{message}", json_path(path))]


def _branch_problem(branch: str) -> str:
    """What is wrong with a branch name the schema's pattern refused, said precisely."""
    if not branch.startswith("agent/"):
        return "it must start with agent/ (e.g. agent/add-health)"
    bad = re.search(r"[^A-Za-z0-9._/-]", branch)
    if bad:
        what = "a space" if bad.group() == " " else quote(bad.group())
        return f"it contains {what}; use letters, digits, ., _, - and / (e.g. agent/add-health)"
    return (
        "each part after agent/ must be non-empty and start with a letter, digit, _ or - "
        "(e.g. agent/add-health)"
    )


def field_path(path: list[Any]) -> str:
    """A document path as people write it: graph[1].cmd."""
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def json_path(path: list[Any]) -> str:
    """The same path in JSONPath form: $.graph[1].cmd."""
    return "$" + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in path)


def _yaml_type(value: Any) -> str:
    return {list: "list", str: "string", int: "number", float: "number", bool: "boolean"}.get(
        type(value), type(value).__name__
    )


# --- graph and kind problems ---------------------------------------------------------------


def _graph_problems(doc: Document) -> list[Problem]:
    data = doc.data
    graph = data.get("graph")
    if not isinstance(graph, list):
        return []
    problems: list[Problem] = []

    def report(path: list[Any], message: str, *, key: bool = False) -> None:
        line, col = doc.position(path, key=key)
        problems.append(Problem(doc.name, line, col, message, json_path(path)))

    # ids as the run will see them (positional defaults included)
    ids: dict[str, int] = {}
    steps: list[tuple[int, str, dict[str, Any]]] = []
    for i, raw in enumerate(graph):
        if not isinstance(raw, dict):
            continue
        sid = raw.get("id", f"s{i + 1}")
        if not isinstance(sid, str):
            continue
        _kind_problems(i, sid, raw, report)
        if sid in ids:
            first_line, _ = doc.position(["graph", ids[sid]])
            report(
                ["graph", i, "id"] if "id" in raw else ["graph", i],
                f"duplicate step id {quote(sid)} (first defined at line {first_line})",
            )
            continue
        ids[sid] = i
        steps.append((i, sid, raw))

    sequential = not any(isinstance(r, dict) and "depends_on" in r for r in graph)
    deps: dict[str, list[str]] = {}
    for i, sid, raw in steps:
        needs = raw.get("depends_on", [])
        deps[sid] = []
        if not isinstance(needs, list):
            continue
        for j, dep in enumerate(needs):
            if not isinstance(dep, str):
                continue
            if dep == sid:
                report(["graph", i, "depends_on", j], f"step {quote(sid)} depends on itself")
            elif dep not in ids:
                hint = yamldoc.did_you_mean(dep, list(ids))
                report(
                    ["graph", i, "depends_on", j],
                    f"step {quote(sid)} depends on unknown step {quote(dep)}{hint}",
                )
            else:
                deps[sid].append(dep)
    _path_problems(data, report)
    _branch_problems(data, report)

    if not sequential and any(deps.values()):
        from coder.taskfile import graph as dag

        for cycle in dag.cycles(dag.build(deps)):
            first = ids[cycle[0]]
            report(["graph", first, "depends_on"], "dependency cycle: " + " -> ".join(cycle))
    return problems


def _kind_problems(i: int, sid: str, raw: dict[str, Any], report: Any) -> None:
    kind = raw.get("kind")
    if not isinstance(kind, str) or kind not in KINDS:  # the schema reports it
        return
    where = ["graph", i]
    for key in sorted(KIND_FIELDS & raw.keys() - KINDS[kind].fields, key=list(raw).index):
        report(
            [*where, key],
            f"step {quote(sid)}: `{key}` is only used by {_and(kinds_taking(key))} steps "
            f"(this is {_article(kind)} {kind} step)",
            key=True,
        )
    on_fail = raw.get("on_fail")
    if isinstance(on_fail, dict):
        if on_fail.get("strategy") == "fix_and_retry" and not KINDS[kind].fixable:
            fixable = _and([k.name for k in KINDS.values() if k.fixable])
            report(
                [*where, "on_fail", "strategy"],
                f"step {quote(sid)}: fix_and_retry applies to {fixable} steps "
                f"(use retries for {_article(kind)} {kind} step)",
            )
        if "max_cycles" in on_fail and on_fail.get("strategy") != "fix_and_retry":
            report(
                [*where, "on_fail", "max_cycles"],
                f"step {quote(sid)}: max_cycles only applies with strategy fix_and_retry",
                key=True,
            )


def _branch_problems(data: dict[str, Any], report: Any) -> None:
    """What the schema's pattern lets through but git refuses (`..`, a name ending in `.`, a
    component ending in `.lock`), by git's own refname rules (`git check-ref-format`)."""
    branch = data.get("branch")
    shape = load_schema("task")["properties"]["branch"]["pattern"]
    if not isinstance(branch, str) or not re.search(shape, branch):
        return  # absent, or the schema reports it
    if not _valid_branch_name(branch):
        report(
            ["branch"],
            f"branch: {quote(branch)} is not a valid git branch name (no `..`, and no part "
            "may end with `.` or `.lock`; see `git check-ref-format`)",
        )


def _valid_branch_name(branch: str) -> bool:
    """Whether git takes `branch`, one the schema's pattern allows (letters, digits, `._-/`, no
    empty part, none starting with `.`), as a branch name: what is left of git's refname
    rules for such names (tests/test_taskfile.py checks them against libgit2's)."""
    parts = branch.split("/")
    return (
        ".." not in branch
        and not branch.endswith(".")
        and not any(p.endswith(".lock") for p in parts)
    )


def _article(word: str) -> str:
    return "an" if word[:1] in "aeiou" else "a"


def _path_problems(data: dict[str, Any], report: Any) -> None:
    """Paths in a taskfile are repository-relative and may not climb out of it."""

    def items(value: Any) -> list[Any]:  # a wrong type is the schema check's to report
        return value if isinstance(value, list) else []

    candidates: list[tuple[list[Any], Any]] = []
    for i, raw in enumerate(items(data.get("graph"))):
        if not isinstance(raw, dict):
            continue
        candidates.append((["graph", i, "cwd"], raw.get("cwd")))
        for j, a in enumerate(items(raw.get("assert"))):
            if isinstance(a, dict):
                candidates.append((["graph", i, "assert", j, "path"], a.get("path")))
        for j, c in enumerate(items(raw.get("changes"))):
            if isinstance(c, dict):
                candidates.append((["graph", i, "changes", j, "path"], c.get("path")))
    success = data.get("success")
    if isinstance(success, dict):
        for j, p in enumerate(items(success.get("required_files"))):
            candidates.append((["success", "required_files", j], p))
    for path, value in candidates:
        if isinstance(value, str) and not is_repo_relative(value):
            report(
                path,
                f"{field_path(path)}: {quote(value)} must be a path inside the repository "
                "(relative, without ..)",
            )


def is_repo_relative(value: str) -> bool:
    p = PurePosixPath(value.replace("\\", "/"))
    return not p.is_absolute() and ".." not in p.parts and not re.match(r"^[A-Za-z]:", value)


def _and(names: list[str]) -> str:
    """`a`, `a and b`, `a, b and c`."""
    return ", ".join(names[:-1]) + " and " + names[-1] if len(names) > 1 else "".join(names)
