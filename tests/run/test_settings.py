"""A run's settings are resolved once (coder.run.settings.resolve, at start and resume alike):
the command line wins, then the taskfile's policies, then the config; and the contexts below
the run carry those settings, never copies of their fields."""

from __future__ import annotations

import textwrap
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, get_type_hints

import click
import pytest
from click.testing import CliRunner

from coder import taskfile
from coder.cli.run_cmd import chosen, per_run_options
from coder.config import DEFAULTS, PerRun, as_config, option
from coder.errors import InvalidInput
from coder.run.context import RunContext
from coder.run.drive import RunOptions
from coder.run.settings import RunSettings, resolve
from coder.run.steps import StepContext
from coder.schemas import load_schema
from coder.taskfile.policies import Policies
from coder.tools.base import ToolContext

CONFIG = as_config(
    {
        "max_parallel": 2,
        "max_turns": 9,
        "max_step_tokens": 5000,
        "step_timeout": 100,
        "command_timeout": 50,
        "run_timeout": 7,
        "run_max_tokens": 70000,
        "allow_network": True,
    }
)


def task(tmp_path: Path, policies: str = "") -> taskfile.Task:
    path = tmp_path / "task.yaml"
    text = f"title: t\n{policies}\ngraph:\n  - {{kind: shell, cmd: 'true'}}\n"
    path.write_text(textwrap.dedent(text))
    return taskfile.load(path)


def test_the_taskfile_wins_over_the_config(tmp_path: Path) -> None:
    ruled = task(
        tmp_path,
        "policies: {max_parallel: 3, timeout: 2m, max_turns: 4, max_tokens: 800, "
        "run_timeout: 1h, run_max_tokens: 9000, allow_network: false}",
    )
    settings = resolve(ruled, CONFIG, RunOptions())
    assert (settings.max_parallel, settings.max_turns, settings.max_step_tokens) == (3, 4, 800)
    assert (settings.model_timeout, settings.command_timeout) == (120, 120)
    assert (settings.run_timeout, settings.run_max_tokens) == (3600, 9000)
    assert settings.policy.allow_network is False  # a taskfile narrows the config's
    assert settings.policies is ruled.policies and settings.config is CONFIG


def test_the_config_where_the_taskfile_says_nothing(tmp_path: Path) -> None:
    settings = resolve(task(tmp_path), CONFIG, RunOptions())
    assert (settings.max_parallel, settings.max_turns, settings.max_step_tokens) == (2, 9, 5000)
    assert (settings.model_timeout, settings.command_timeout) == (100, 50)
    assert (settings.run_timeout, settings.run_max_tokens) == (7, 70000)
    assert settings.policy.allow_network is True
    assert (settings.approvals, settings.fail_fast) == ("none", False)


def test_the_command_line_wins_over_both(tmp_path: Path) -> None:
    ruled = task(tmp_path, "policies: {max_parallel: 3, approvals: per-edit}")
    assert resolve(ruled, CONFIG, RunOptions()).approvals == "per-edit"
    chosen = RunOptions(max_parallel=5, approvals="none", fail_fast=True)
    settings = resolve(ruled, CONFIG, chosen)
    assert (settings.max_parallel, settings.approvals, settings.fail_fast) == (5, "none", True)
    # no choice anywhere: the command's default; `manual` is the old name of per-step
    plain = task(tmp_path)
    assert resolve(plain, CONFIG, RunOptions(default_approvals="per-step")).approvals == "per-step"
    assert resolve(plain, CONFIG, RunOptions(approvals="manual")).approvals == "per-step"
    with pytest.raises(InvalidInput, match="approvals must be one of per-step, per-edit, none"):
        resolve(plain, CONFIG, RunOptions(approvals="sometimes"))


def test_a_per_run_setting_is_the_first_of_its_three_levels_set(tmp_path: Path) -> None:
    """Every `PerRun` field by one rule: the command line's, else the taskfile's, else the
    config's (whose own default is the field's)."""
    ruled = task(tmp_path, "policies: {max_turns: 4, run_timeout: 1h}")
    picked = RunOptions(per_run={"max_turns": 6})
    settings = resolve(ruled, CONFIG, picked)
    assert (settings.max_turns, settings.run_timeout, settings.run_max_tokens) == (6, 3600, 70000)
    plain = resolve(task(tmp_path), as_config({}), RunOptions())
    assert {f.name: getattr(plain, f.name) for f in fields(PerRun)} == {
        f.name: f.default for f in fields(PerRun)
    }


def test_each_per_run_setting_is_a_config_key_and_a_policy_of_its_type() -> None:
    """A `PerRun` field is said once; what a file may hold of it is its property in both
    schemas, and the taskfile's unset value is None."""
    config, policies = load_schema("config")["properties"], get_type_hints(Policies)
    task_policies = load_schema("task")["properties"]["policies"]["properties"]
    for name, kind in get_type_hints(PerRun).items():
        assert name in config and name in task_policies and name in DEFAULTS
        assert policies[name] == kind | None, f"Policies.{name} is not {kind} | None"


@dataclass(frozen=True, kw_only=True)
class Flagged:
    fold_summaries: bool = option(True, "--fold", "Fold the older turns.")
    max_turns: int = option(30, "--turns", "Model turns per step.")
    tool_protocol: str = option("auto", "--protocol", "How tool calls are asked for.")
    seed: int | None = None  # no flag


def test_a_per_run_flag_is_declared_with_its_field() -> None:
    """`coder run` and `coder resume` take an option for each `PerRun` field with a flag: a
    boolean's as a pair, a number or a choice checked as its config setting is."""
    got: list[dict[str, Any]] = []

    @click.command()
    def command(**per_run: Any) -> None:
        got.append(chosen(per_run))

    for make in reversed(per_run_options(Flagged)):
        command = make(command)
    runner = CliRunner()
    assert (
        runner.invoke(command, ["--no-fold", "--turns", "3", "--protocol", "text"]).exit_code == 0
    )
    assert runner.invoke(command, []).exit_code == 0
    assert got == [{"fold_summaries": False, "max_turns": 3, "tool_protocol": "text"}, {}]
    refused = runner.invoke(command, ["--turns", "0"])
    assert refused.exit_code == 2 and "0 is not in the range x>=1" in refused.output
    refused = runner.invoke(command, ["--protocol", "xml"])
    assert (
        refused.exit_code == 2 and "'xml' is not one of 'native', 'text', 'auto'" in refused.output
    )


# What a context may hold under a setting's name, and why it is not a copy of the setting.
OWN = {
    (ToolContext, "policy"): "the run's, with the step's named protected paths writable",
    (ToolContext, "command_timeout"): "the step's own timeout",
}


@pytest.mark.parametrize(
    "context", [RunContext, StepContext, ToolContext], ids=lambda c: c.__name__
)
def test_contexts_carry_the_settings_not_copies(context: type) -> None:
    """A context holds `settings` (a tool context: `config` and `policies`), so a new setting
    reaches every step and tool without a new field on each."""
    names = (
        set(DEFAULTS) | {f.name for f in fields(Policies)} | {f.name for f in fields(RunSettings)}
    )
    carried = {"settings", "config", "policies"}
    copies = {
        f.name
        for f in fields(context)
        if f.name in names - carried and (context, f.name) not in OWN
    }
    assert not copies, f"{context.__name__} copies settings: {sorted(copies)}"
