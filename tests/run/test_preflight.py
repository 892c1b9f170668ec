"""Preflight: the one check of the commands a task's steps would run (run, plan, validate)."""

from __future__ import annotations

from pathlib import Path

from coder import config as config_mod
from coder import taskfile
from coder.policy.commands import Policy
from coder.run.preflight import refusals


def steps(*raw: dict[str, object]) -> tuple[taskfile.Step, ...]:
    return taskfile.from_dict({"title": "t", "graph": list(raw)}).steps


def test_refused_commands_and_missing_test_commands_are_named_by_step(repo: Path) -> None:
    cfg = config_mod.load(repo)
    found = refusals(
        steps(
            {"id": "ok", "kind": "shell", "cmd": "echo hi > a.txt"},
            {"id": "net", "kind": "shell", "cmd": "curl -s https://example.com"},
            {"id": "edit", "kind": "edit", "goal": "no command"},
            {"id": "tests", "kind": "test"},
        ),
        root=repo,
        policy=Policy.from_config(cfg.values),
        config=cfg,
    )
    # the test step comes after steps that may write the tests: it looks for them when it runs
    assert [(r.step_id, r.field, r.refused) for r in found] == [("net", "cmd", True)]
    assert str(found[0]).startswith("step net: command refused: `curl`")


def test_a_first_test_step_with_no_tests_to_find_is_refused_up_front(repo: Path) -> None:
    """Nothing before it could write tests: the missing test command is named at once."""
    cfg = config_mod.load(repo)
    found = refusals(
        steps({"id": "tests", "kind": "test"}, {"id": "after", "kind": "shell", "cmd": "true"}),
        root=repo,
        policy=Policy.from_config(cfg.values),
        config=cfg,
    )
    assert [(r.step_id, r.field, r.refused) for r in found] == [("tests", None, False)]
    assert "no test command could be found" in found[0].message


def test_a_test_step_runs_the_detected_test_command(make_repo) -> None:
    repo = make_repo({"tests/test_x.py": "def test_x():\n    pass\n"})
    cfg = config_mod.load(repo)
    policy = Policy.from_config(cfg.values)
    assert refusals(steps({"kind": "test"}), root=repo, policy=policy, config=cfg) == []


def test_a_steps_own_path_decides_where_its_commands_resolve(repo: Path) -> None:
    """A step's `env: PATH` is the PATH its command is looked up on; the next step's is the
    scrubbed environment's again (the check reads each step's own)."""
    tools = repo / "bin"
    tools.mkdir()
    (tools / "ls").write_text("#!/bin/sh\n")
    (tools / "ls").chmod(0o755)
    cfg = config_mod.load(repo)
    found = refusals(
        steps(
            {"id": "own", "kind": "shell", "cmd": "ls", "env": {"PATH": str(tools)}},
            {"id": "plain", "kind": "shell", "cmd": "ls"},
        ),
        root=repo,
        policy=Policy.from_config(cfg.values),
        config=cfg,
    )
    assert [(r.step_id, r.refused) for r in found] == [("own", True)]
    assert "inside the worktree" in found[0].message
