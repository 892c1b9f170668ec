"""The README and the docs/ pages stay true: every `coder ...` command they show parses with
today's CLI, and the journey docs/journey.md describes works (the blocks that need Ollama are
marked "needs Ollama")."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from coder.cli import COMMANDS as COMMANDS_TABLE
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
        if args[0] == "push":
            continue  # needs a remote: tests/services/test_push.py pushes to a bare one
        code, out, err = coder(repo, *args)
        assert code == 0, f"{line}: {out}{err}"
        if args[0] == "run":
            [state] = (repo / ".coder" / "state").glob("*.json")
            run_id = state.stem
            assert f"Run {run_id}: success" in out
        if args[0] == "clean":  # the end of the journey
            break
    # merged (tagged), then cleaned: the merged branch went with the run; its fork stays
    assert git(repo, "tag") == f"coder/{run_id}\n"
    assert git(repo, "branch", "--list", "--format=%(refname:short)", "agent/*").split() == [
        f"agent/{run_id}-fork-1-add-a-greeting-module-and-prove-it-works"
    ]
    assert "greet" in git(repo, "show", "main:greeting.py")


def section(text: str, heading: str) -> str:
    """The text under `heading` up to the next heading of its level or above."""
    start = text.index(f"\n{heading}\n")
    level = heading.split(" ")[0]
    nxt = re.search(rf"\n#{{1,{len(level)}}} ", text[start + len(heading) + 2 :])
    return text[start : start + len(heading) + 2 + nxt.start()] if nxt else text[start:]


QUICKSTART, UNDO = re.findall(
    r"```sh\n(.*?)```", section(README, "## Five minutes on your own repository"), re.S
)


@pytest.mark.parametrize(
    ("project", "runner", "ran"),
    [
        (
            {
                "pyproject.toml": "[tool.pytest.ini_options]\n",
                "tests/test_app.py": "def test_sum():\n    assert 1 + 1 == 2\n",
            },
            "pytest",
            "1 passed",
        ),
        (
            {
                "tests/test_app.py": "import unittest\n\n\nclass TestSum(unittest.TestCase):\n"
                "    def test_sum(self):\n        self.assertEqual(1 + 1, 2)\n"
            },
            "unittest",
            "Ran 1 test",
        ),
    ],
    ids=["pytest", "unittest"],
)
def test_the_quickstart_as_written(
    make_repo, project: dict[str, str], runner: str, ran: str
) -> None:
    """The README's quickstart, taken from its text and run by the shell with the installed
    `coder`, in a fresh project of each test runner: a green merge on main, then the undo."""
    repo = make_repo(project)
    result = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", QUICKSTART], cwd=repo, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert runner in json.loads((repo / "coder.config.json").read_text())["test_command"]
    assert "Run greet: success" in result.stdout
    assert "Merged run greet into main" in result.stdout
    # --if-green ran the project's tests on the merge result
    assert ran in (repo / ".coder" / "artifacts" / "greet" / "merge-check.log").read_text()
    assert git(repo, "rev-parse", "main") == git(repo, "rev-parse", "coder/greet^{commit}")
    assert "Coder-Task: greet" in git(repo, "log", "-1", "--format=%B", "main")
    assert git(repo, "show", "main:greeting.py") == 'def greet(name): return "hello " + name\n'
    assert (repo / "greeting.py").is_file()  # the checkout followed the merge
    undo = subprocess.run(["bash", "-euo", "pipefail", "-c", UNDO], cwd=repo, capture_output=True)
    assert undo.returncode == 0, undo.stderr
    assert git(repo, "ls-tree", "--name-only", "main", "greeting.py") == ""


def prose(text: str) -> str:
    """`text` without its fenced code blocks (a fence is a line that starts with ```)."""
    kept, fenced = [], False
    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced:
            kept.append(line)
    return "\n".join(kept)


def anchors(text: str) -> set[str]:
    """GitHub's anchors for the headings of a Markdown text (code blocks left out)."""
    found: set[str] = set()
    for heading in re.findall(r"^#{1,6} (.+)$", prose(text), re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        n, unique = 0, slug
        while unique in found:  # a repeated heading gets -1, -2, ...
            n += 1
            unique = f"{slug}-{n}"
        found.add(unique)
    return found


DOCS = [ROOT / "README.md", *PAGES]


def test_the_docs_index_links_every_page() -> None:
    index = (ROOT / "docs" / "README.md").read_text()
    linked = set(re.findall(r"\]\(([\w-]+\.md)\)", index))
    assert linked == {p.name for p in PAGES if p.name != "README.md"}


@pytest.mark.parametrize("page", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page: Path) -> None:
    """Each relative link leads to a file that exists and, with a #fragment, to a heading."""
    for link in re.findall(r"\]\(([^)\s]+)\)", prose(page.read_text())):
        if re.match(r"[a-z]+:", link):
            continue  # https:, mailto:
        path, _, fragment = link.partition("#")
        target = (page.parent / path).resolve() if path else page
        assert target.exists(), f"{page.name}: {link} leads nowhere"
        if fragment:
            assert fragment in anchors(target.read_text()), f"{page.name}: no heading for {link}"


def help_pages() -> list[tuple[str, str]]:
    """(command, the help's last line) for every command and subcommand."""
    found = []
    for name in main.list_commands(click.Context(main)):
        command = main.get_command(click.Context(main), name)
        assert command is not None
        for words in [[name], *([name, sub] for sub in getattr(command, "commands", {}))]:
            result = CliRunner().invoke(main, [*words, "--help"], prog_name="coder")
            assert result.exit_code == 0, result.output
            found.append((" ".join(words), result.output.rstrip().splitlines()[-1].strip()))
    return found


def test_each_commands_help_ends_with_its_docs_page() -> None:
    pages = help_pages()
    assert {name for name, _ in pages} >= set(COMMANDS_TABLE) | {"mcp serve", "config set"}
    for name, last in pages:
        assert last.startswith("See "), f"coder {name} --help ends {last!r}"
        path, _, fragment = last.removeprefix("See ").partition("#")
        assert fragment in anchors((ROOT / path).read_text()), f"coder {name}: {last}"


def test_the_ci_job_is_a_workflow_whose_coder_commands_parse() -> None:
    """docs/journey.md's CI job: valid YAML, one job per task (a matrix), and each coder
    command it runs is one coder knows (with --help appended, as test_each_command_parses)."""
    import yaml

    text = section(
        (ROOT / "docs" / "journey.md").read_text(), "### Many tasks on many machines: a CI job"
    )
    [block] = re.findall(r"```yaml\n(.*?)```", text, re.S)
    job = yaml.safe_load(block)["jobs"]["task"]
    assert len(job["strategy"]["matrix"]["task"]) > 1
    runs = [step["run"] for step in job["steps"] if "run" in step]
    commands = [
        line.strip()
        for run in runs
        for line in run.splitlines()
        if line.strip().startswith("coder ")
    ]
    assert [c.split()[1] for c in commands] == ["run", "push"]
    assert "--autonomous" in commands[0]
    for line in commands:
        args = shlex.split(line.replace("${{ matrix.task }}", "T"))[1:]
        result = CliRunner().invoke(main, [*args, "--help"], prog_name="coder")
        assert result.exit_code == 0, f"{line}: {result.output}"
