"""The step kinds registry is the one place kinds are described: the schema, the runners and
the tools agree with it."""

from __future__ import annotations

import pytest

from coder.run.steps.runners import RUNNERS, runner_for
from coder.schemas import load_schema, validator
from coder.taskfile.kinds import KIND_FIELDS, KINDS, LINTER, STEP_CMD, TESTS, Labels
from coder.tools.registry import tools_for_kind

STEP = load_schema("step")


def test_the_schema_enum_is_the_registry() -> None:
    assert STEP["properties"]["kind"]["enum"] == list(KINDS)


@pytest.mark.parametrize("name", list(KINDS))
def test_the_schema_requires_what_the_kind_requires(name: str) -> None:
    missing = {e.message.split("'")[1] for e in validator("step").iter_errors({"kind": name})}
    assert missing == set(KINDS[name].required)


def test_kind_fields_are_step_fields() -> None:
    assert KIND_FIELDS <= set(STEP["properties"])
    assert "kind" not in KIND_FIELDS and "goal" not in KIND_FIELDS


@pytest.mark.parametrize("name", list(KINDS))
def test_every_kind_has_a_runner(name: str) -> None:
    run = runner_for(name)
    assert callable(run) and run.__module__ == f"coder.run.steps.{KINDS[name].runner}"
    assert run is RUNNERS[KINDS[name].runner]


@pytest.mark.parametrize("name", list(KINDS))
def test_model_kinds_have_tools_and_the_others_none(name: str) -> None:
    if KINDS[name].uses_model:
        assert tools_for_kind(name)[-1] == "step_complete"
    else:
        with pytest.raises(Exception, match="has no model tools"):
            tools_for_kind(name)


def test_a_kind_that_runs_a_command_says_which() -> None:
    assert {k.name: k.command for k in KINDS.values() if k.command} == {
        "shell": STEP_CMD,
        "test": TESTS,
        "lint": LINTER,
    }


def test_a_kind_that_runs_a_command_names_it_while_it_runs() -> None:
    """The live view shows a command kind at work in its own words, never "waiting for the
    model"; a fixable kind has the words of its fix cycles and of its red line."""
    for kind in KINDS.values():
        assert (kind.labels.running is not None) == (kind.command is not None), kind.name
        assert (kind.labels.red != Labels().red) == kind.fixable, kind.name
