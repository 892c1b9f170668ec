"""A taskfile's `policies` are read once (coder.taskfile.policies): typed, durations in seconds, defaults
filled in, stored and read back the same; a bad value is named at its line; and nothing else
in the package reads the raw mapping or parses a duration while a run goes."""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path

import pytest

import coder
from coder import taskfile
from coder.errors import InvalidTaskfile
from coder.schemas import validator
from coder.taskfile.policies import Policies

PACKAGE = Path(coder.__file__).resolve().parent


def load(tmp_path: Path, policies: str) -> taskfile.Task:
    path = tmp_path / "task.yaml"
    text = f"title: t\n{policies}\ngraph:\n  - {{kind: shell, cmd: 'true'}}\n"
    path.write_text(textwrap.dedent(text))
    return taskfile.load(path)


def test_policies_are_read_once_into_their_types(tmp_path: Path) -> None:
    task = load(
        tmp_path,
        "policies: {timeout: 5m, run_timeout: 1h, max_turns: 3, approvals: per-edit, "
        "allow_network: false, lint_after_edit: false}",
    )
    assert task.policies == Policies(
        approvals="per-edit",
        timeout=300,
        run_timeout=3600,
        max_turns=3,
        allow_network=False,
        lint_after_edit=False,
    )
    # the defaults: checks on, no retries, the rest the config's (None)
    unset = load(tmp_path, "").policies
    assert unset == Policies()
    assert (unset.veto_syntax_errors, unset.lint_after_edit, unset.retries) == (True, True, 0)
    assert unset.timeout is None and unset.max_parallel is None


def test_stored_policies_read_back_the_same(tmp_path: Path) -> None:
    """What the manifest keeps (`to_dict`) is schema-valid, leaves the defaults out and reads
    back to the same policies, so a resume sees no edit where there is none."""
    task = load(tmp_path, "policies: {timeout: 90s, retries: 2, veto_syntax_errors: true}")
    doc = task.to_dict()
    assert doc["policies"] == {"timeout": 90, "retries": 2}
    assert list(validator("task").iter_errors(doc)) == []
    assert taskfile.from_dict(doc).policies == task.policies
    assert "policies" not in load(tmp_path, "policies: {}").to_dict()


def test_a_bad_policy_is_named_at_its_line(tmp_path: Path) -> None:
    with pytest.raises(InvalidTaskfile) as caught:
        load(tmp_path, "policies:\n  timeout: 5x\n  max_turns: 0\n  max_paralel: 2")
    assert [str(p) for p in caught.value.problems] == [
        f"{tmp_path / 'task.yaml'}:3:12: policies.timeout: '5x' is not valid here: Seconds as "
        "a number, or a string such as 90s, 5m, 1h.",
        f"{tmp_path / 'task.yaml'}:4:14: policies.max_turns: 0 is less than the minimum of 1",
        f"{tmp_path / 'task.yaml'}:5:3: policies: unknown field 'max_paralel' (did you mean "
        "'max_parallel'?)",
    ]


# Where a document is read: the only places that parse a duration.
PARSING = {PACKAGE / "taskfile" / "policies.py", PACKAGE / "taskfile" / "__init__.py"}


def raw_policy_reads(path: Path) -> list[str]:
    """`policies.get(...)`, `policies[...]` and, outside PARSING, `parse_duration(...)`."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))

    def is_policies(node: ast.AST) -> bool:
        return (isinstance(node, ast.Name) and node.id == "policies") or (
            isinstance(node, ast.Attribute) and node.attr == "policies"
        )

    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Subscript) and is_policies(node.value):
            found.append(f"{node.lineno}: policies[...]")
        elif isinstance(node, ast.Call):
            func = node.func
            name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")
            if name == "get" and isinstance(func, ast.Attribute) and is_policies(func.value):
                found.append(f"{node.lineno}: policies.get(...)")
            elif name == "parse_duration" and path not in PARSING:
                found.append(f"{node.lineno}: parse_duration(...)")
    return found


def test_policies_are_applied_as_read() -> None:
    found = [
        f"{path.relative_to(PACKAGE.parent)}:{where}"
        for path in sorted(PACKAGE.rglob("*.py"))
        for where in raw_policy_reads(path)
    ]
    assert not found, (
        "read the typed task.policies (coder.taskfile.policies.Policies) instead:\n"
        + "\n".join(found)
    )


def test_the_checker_sees_a_raw_read(tmp_path: Path) -> None:
    scratch = tmp_path / "scratch.py"
    scratch.write_text(
        "def f(task, policies):\n"
        "    a = task.policies.get('timeout')\n"
        "    b = policies['max_turns']\n"
        "    return parse_duration(a), taskfile.parse_duration(b)\n",
        encoding="utf-8",
    )
    assert raw_policy_reads(scratch) == [
        "2: policies.get(...)",
        "3: policies[...]",
        "4: parse_duration(...)",
        "4: parse_duration(...)",
    ]
