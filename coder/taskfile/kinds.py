"""Step kinds: one frozen description per kind, the one place each kind's rules live.

Everything that treats kinds differently asks its entry, never its name: the taskfile check
(which fields a kind takes), preflight and the runners (`command`: how the kind finds the
command it runs), the planner, the prompts (`instructions`, and `fix`: the words of a fix
cycle), the tools a model step gets (`model`), the approval prompt (read-only kinds are not
asked about), the check of a model's step_complete claim, the live view (`labels`) and the
executor (`runner`: the name of its `StepRunner` in `coder.run.steps.RUNNERS`; the runners
live a layer up, where the sandbox and the model are). A test holds the step schema's `kind`
enum and its required fields equal to this table.

Adding a kind: an entry here, its runner module in `coder/run/steps/` (one line in `RUNNERS`
when it is a new runner), and the name in `schemas/step.schema.json`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal, Protocol

if TYPE_CHECKING:
    from coder.config import Config

# What a model step may do: read only (its findings become notes for the steps after it),
# edit files, edit documentation only, or use every tool.
ModelRole = Literal["read", "edit", "docs", "all"]


class Step(Protocol):
    """What a kind reads of a step to find its command (a `coder.taskfile.Step` is one)."""

    @property
    def cmd(self) -> str | None: ...
    @property
    def framework(self) -> str | None: ...
    @property
    def args(self) -> tuple[str, ...]: ...


@dataclass(frozen=True)
class Command:
    """How a kind finds the command it runs: `find(step, root, config)` (InvalidInput when
    there is none); `later(step, config)`: the command is detected from files an earlier
    step may still write, so preflight does not refuse a step that comes after others."""

    find: Callable[[Step, Path, Config], str | None]
    later: Callable[[Step, Config], bool] = lambda step, config: False


def _step_cmd(step: Step, root: Path, config: Config) -> str | None:
    return step.cmd


def test_command(step: Step, root: Path, config: Config) -> str:
    """The test command of a test step (InvalidInput when there is none)."""
    from coder.checks import testreport

    return testreport.test_command(
        root=root,
        framework=step.framework,
        cmd=step.cmd,
        args=step.args,
        configured=config.test_command,
    )


def _lint_command(step: Step, root: Path, config: Config) -> str | None:
    from coder.checks import lintreport

    return " && ".join(
        linter.command_for("FILE")
        for linter in lintreport.lint_commands(root, step.cmd or config.lint_command)
    )


STEP_CMD = Command(_step_cmd)  # the step's own `cmd`
TESTS = Command(  # its `cmd`, else its `framework`, else the config's, else detected
    test_command,
    later=lambda step, config: not (step.cmd or step.framework or config.test_command),
)
LINTER = Command(_lint_command)  # its `cmd`, else the config's `lint_command`, else detected


@dataclass(frozen=True)
class Fix:
    """The words of a fixable kind's fix cycles (`on_fail: fix_and_retry`): `head` opens the
    message to the model ({summary}, {command}, {cycle}, {max_cycles} filled in), `rule` is
    what every cycle must respect (said once in the prefix: prompts.kinds_section), `tag`
    wraps the failures, `rerun` is what coder runs again after the fix, `check` names what
    still fails when the cycles run out."""

    head: str
    rule: str
    tag: str
    rerun: str
    check: str


@dataclass(frozen=True)
class Labels:
    """How the live view and the event lines name a step's work: `running` while its own
    command runs (`{goal}` filled in; None: a model step, "waiting for the model"), `red`
    before the failures of a fix cycle ("tests red (1 failed); fix cycle 1")."""

    running: str | None = None
    red: str = "red"


@dataclass(frozen=True)
class Kind:
    name: str
    about: str  # one line for people and the planner
    runner: str  # its StepRunner: coder.run.steps.RUNNERS[runner](ctx) does the work
    fields: frozenset[str] = frozenset()  # kind-specific step fields it takes (KIND_FIELDS)
    required: tuple[str, ...] = ()  # fields a step of this kind must have
    command: Command | None = None  # how it finds the command it runs (None: it runs none)
    model: ModelRole | None = None  # None: no model (unless on_fail fix_and_retry)
    instructions: str | None = None  # its rules for the model (prompts.kinds_section)
    fix: Fix | None = None  # on_fail: fix_and_retry applies, in these words
    default_goal: str | None = None  # when a step has no goal; `{cmd}` is filled in
    labels: Labels = field(default_factory=Labels)

    @property
    def fixable(self) -> bool:
        return self.fix is not None

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
# a step that changes files, tried several ways at once, the evidence picking the winner
_CANDIDATES = frozenset({"candidates", "judge"})

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
                "Read-only: study the code and finish with step_complete, putting your "
                "findings (what later steps need to know) in the summary."
            ),
        ),
        Kind(
            "edit",
            "model step that edits files",
            runner="model",
            fields=_MODEL_FIELDS | _CANDIDATES | {"changes"},
            required=_MODEL,
            model="edit",
        ),
        Kind(
            "doc",
            "model step that edits documentation files only",
            runner="model",
            fields=_MODEL_FIELDS | _CANDIDATES | {"changes"},
            required=_MODEL,
            model="docs",
            instructions="Only documentation files may be changed.",
        ),
        Kind(
            "shell",
            "runs `cmd` in the sandbox and commits what it changed",
            runner="shell",
            fields=_COMMAND_FIELDS | {"changes"},
            required=("cmd",),
            command=STEP_CMD,
            default_goal="run `{cmd}`",
            labels=Labels(running="{goal}"),
        ),
        Kind(
            "test",
            "runs the test command (its `cmd`, `framework`, the config's, or detected)",
            runner="test",
            fields=_COMMAND_FIELDS | _MODEL_FIELDS | {"framework", "args"},  # model: fix cycles
            command=TESTS,
            fix=Fix(
                head="The tests fail ({summary}) when running `{command}`. Fix cycle {cycle} of "
                "{max_cycles}.",
                rule="Change the code so the failing tests pass. Change a test only if the test "
                "itself is wrong.",
                tag="test-output",
                rerun="the tests",
                check="tests",
            ),
            default_goal="run the tests",
            labels=Labels(running="running the tests", red="tests red"),
        ),
        Kind(
            "lint",
            "runs the linter (its `cmd`, the config's `lint_command`, or detected) on the files "
            "the run changed; a finding on a line the run added or changed fails it",
            runner="lint",
            fields=_MODEL_FIELDS | {"cmd"},  # model: fix cycles
            command=LINTER,
            fix=Fix(
                head="The linter reports new findings ({summary}) when running `{command}` on "
                "the lines this run changed. Fix cycle {cycle} of {max_cycles}.",
                rule="Change the code so the new findings go away. Silence a finding only if "
                "it is wrong.",
                tag="lint-output",
                rerun="the linter",
                check="lint",
            ),
            default_goal="lint the run's changes",
            labels=Labels(running="running the linter", red="lint red"),
        ),
        Kind(
            "custom",
            "model step with every tool, including shell_run",
            runner="model",
            fields=_MODEL_FIELDS | _CANDIDATES | {"changes"},
            required=_MODEL,
            model="all",
        ),
    )
}

# The step fields only some kinds take; every other field is common to all kinds.
KIND_FIELDS = frozenset().union(*(k.fields for k in KINDS.values()))


def kinds_taking(field: str) -> list[str]:
    return [k.name for k in KINDS.values() if field in k.fields]
