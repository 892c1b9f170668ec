"""Step kinds: one frozen description per kind, the one place each kind's rules live.

Everything that treats kinds differently asks this registry: the taskfile check (which fields
a kind takes), preflight (the command a kind runs), the planner, the prompts (the model's
instructions), the tools a model step gets, the approval prompt (read-only kinds are not
asked about), the check of a model's step_complete claim, and the executor (`runner`: the
module in `coder/run/steps/` whose `run(ctx)` does the work, imported when a step of the kind
runs). A test holds the step schema's `kind` enum and its required fields equal to this table.

Adding a kind: an entry here, its runner module, and the name in `schemas/step.schema.json`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

# What a model step may do: read only (its findings become notes for the steps after it),
# edit files, edit documentation only, or use every tool.
ModelRole = Literal["read", "edit", "docs", "all"]


@dataclass(frozen=True)
class Kind:
    name: str
    about: str  # one line for people and the planner
    runner: str  # coder.run.steps.<runner>.run(ctx) does the work
    fields: frozenset[str] = frozenset()  # kind-specific step fields it takes (KIND_FIELDS)
    required: tuple[str, ...] = ()  # fields a step of this kind must have
    command: Literal["cmd", "tests", "lint"] | None = None  # its `cmd`, the tests, the linter
    model: ModelRole | None = None  # None: no model (unless on_fail fix_and_retry)
    instructions: str | None = None  # said to the model in the step's first message
    fixable: bool = False  # on_fail: fix_and_retry applies
    default_goal: str | None = None  # when a step has no goal; `{cmd}` is filled in

    @property
    def uses_model(self) -> bool:
        return self.model is not None

    @property
    def read_only(self) -> bool:
        """Changes no file: its summary is kept as notes; interactive mode does not ask."""
        return self.model == "read"

    @property
    def must_change(self) -> bool:
        """A model step that must change a file, or say why none needed changing."""
        return self.model in ("edit", "docs")


_COMMAND_FIELDS = frozenset({"cmd", "cwd", "env"})
_MODEL_FIELDS = frozenset({"model", "fallback_model"})  # which model answers the step
_MODEL = ("goal",)

KINDS: Mapping[str, Kind] = {
    k.name: k
    for k in (
        Kind(
            "analyze",
            "read-only model step; its findings go to the steps that depend on it",
            runner="model",
            fields=_MODEL_FIELDS,
            required=_MODEL,
            model="read",
            instructions=(
                "This step is read-only: study the code and finish with step_complete, putting "
                "your findings (what later steps need to know) in the summary."
            ),
        ),
        Kind(
            "edit",
            "model step that edits files",
            runner="model",
            fields=_MODEL_FIELDS | {"changes"},
            required=_MODEL,
            model="edit",
        ),
        Kind(
            "doc",
            "model step that edits documentation files only",
            runner="model",
            fields=_MODEL_FIELDS | {"changes"},
            required=_MODEL,
            model="docs",
            instructions="Only documentation files may be changed in this step.",
        ),
        Kind(
            "shell",
            "runs `cmd` in the sandbox and commits what it changed",
            runner="shell",
            fields=_COMMAND_FIELDS | {"changes"},
            required=("cmd",),
            command="cmd",
            default_goal="run `{cmd}`",
        ),
        Kind(
            "test",
            "runs the test command (its `cmd`, `framework`, the config's, or detected)",
            runner="test",
            fields=_COMMAND_FIELDS | _MODEL_FIELDS | {"framework", "args"},  # model: fix cycles
            command="tests",
            fixable=True,
            default_goal="run the tests",
        ),
        Kind(
            "lint",
            "runs the linter (its `cmd`, the config's `lint_command`, or detected) on the files "
            "the run changed; a finding on a line the run added or changed fails it",
            runner="lint",
            fields=_MODEL_FIELDS | {"cmd"},  # model: fix cycles
            command="lint",
            fixable=True,
            default_goal="lint the run's changes",
        ),
        Kind(
            "custom",
            "model step with every tool, including shell_run",
            runner="model",
            fields=_MODEL_FIELDS | {"changes"},
            required=_MODEL,
            model="all",
        ),
    )
}

# The step fields only some kinds take; every other field is common to all kinds.
KIND_FIELDS = frozenset().union(*(k.fields for k in KINDS.values()))


def kinds_taking(field: str) -> list[str]:
    return [k.name for k in KINDS.values() if field in k.fields]
