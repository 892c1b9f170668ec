"""The README and the docs/ pages stay true: every `coder ...` command they show parses with
today's CLI, and the journey docs/journey.md describes works (the blocks that need Ollama are
marked "needs Ollama")."""

from __future__ import annotations

import re
import shlex

import pytest
from click.testing import CliRunner

from coder.cli import main
from tests.conftest import coder, git
from tests.helpers import ROOT

README = (ROOT / "README.md").read_text()
PAGES = sorted((ROOT / "docs").glob("*.md"))


def command_lines(text: str) -> list[str]:
    """Every line of a fenced sh/console block of `text` that runs coder (comments dropped)."""
    lines = []
    for block in re.findall(r"```(?:sh|console)\n(.*?)```", text, re.S):
        for line in block.splitlines():
            line = line.removeprefix("$ ").split("  #")[0].strip()
            if line.startswith("coder "):
                lines.append(line)
    return lines


COMMANDS = [
    line for text in [README, *(p.read_text() for p in PAGES)] for line in command_lines(text)
]
JOURNEY = command_lines((ROOT / "docs" / "journey.md").read_text())


def test_the_docs_show_the_commands() -> None:
    assert len(COMMANDS) >= 20
    assert "coder demo" in COMMANDS and "pip install ." in README and "\ntox\n" in README


@pytest.mark.parametrize("line", COMMANDS)
def test_each_command_parses(line: str) -> None:
    """With --help appended, click parses every option first: an unknown command or option
    (a README out of date) fails, a known one shows the help and exits 0."""
    result = CliRunner().invoke(main, [*shlex.split(line)[1:], "--help"], prog_name="coder")
    assert result.exit_code == 0, f"{line}: {result.output}"
    assert result.output.startswith("Usage: coder ")


def test_the_journey_without_a_model(make_repo) -> None:
    """docs/journey.md's journey block, on a real repository, with its example taskfile."""
    repo = make_repo({"pyproject.toml": "[tool.pytest.ini_options]\n"})
    run_id = None  # "the task id `coder run` printed"
    for line in JOURNEY:
        if (
            "plan" in line
            or "ID" not in line
            and "hello-shell" not in line
            and line not in ("coder init", "coder status")
        ):
            continue
        args = shlex.split(line.replace("ID", str(run_id)))[1:]
        if args[0] == "revert" or (args[0] == "resume" and "revert" not in line):
            continue  # exercised in test_revert.py, on a run with several steps
        code, out, err = coder(repo, *args)
        assert code == 0, f"{line}: {out}{err}"
        if args[0] == "run":
            [state] = (repo / ".coder" / "state").glob("*.json")
            run_id = state.stem
            assert f"Run {run_id}: success" in out
        if args[0] == "clean":  # the end of the journey
            break
    # merged (tagged), then cleaned: the merged branch went with the run
    assert git(repo, "tag") == f"coder/{run_id}\n"
    assert git(repo, "branch", "--list", "agent/*") == ""
    assert "greet" in git(repo, "show", "main:greeting.py")
