"""Command-line conventions: colour (`--color`, NO_COLOR), coder's own options anywhere on the
line, long output paged on a terminal, one exit code for "not a repository"."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from coder.cli import main
from coder.cli.common import hoisted
from tests.conftest import coder, git
from tests.helpers import coder_on_terminal, taskfile

TASK = """
    id: c1
    title: Colours
    graph:
      - {id: a, kind: shell, cmd: "printf 'one\\\\n' > one.txt"}
"""
ESC = "\x1b["


def invoke(repo: Path, args: list[str], *, terminal: bool, env: dict[str, str] | None = None):
    """`coder ARGS` in `repo` as a terminal (`color=True`: click's stand-in for a tty) or a pipe."""
    cwd = os.getcwd()
    os.chdir(repo)
    try:
        return CliRunner().invoke(main, args, color=terminal, env=env or {})
    finally:
        os.chdir(cwd)


@pytest.fixture
def graph_args(make_repo) -> tuple[Path, list[str]]:
    repo = make_repo()
    return repo, ["show", "-f", str(taskfile(repo, TASK)), "--graph"]


def test_colour_on_a_terminal_unless_no_color_or_never(graph_args) -> None:
    repo, args = graph_args
    assert ESC in invoke(repo, args, terminal=True).output
    assert ESC not in invoke(repo, args, terminal=False).output
    assert ESC not in invoke(repo, args, terminal=True, env={"NO_COLOR": "1"}).output
    assert ESC not in invoke(repo, ["--color", "never", *args], terminal=True).output
    # `always` wins over NO_COLOR and a pipe; anywhere on the line
    always = invoke(repo, [*args, "--color=always"], terminal=False, env={"NO_COLOR": "1"})
    assert always.exit_code == 0 and ESC in always.output
    # NO_COLOR set but empty means nothing (no-color.org)
    assert ESC in invoke(repo, args, terminal=True, env={"NO_COLOR": ""}).output


def test_coders_own_options_anywhere_on_the_line(make_repo) -> None:
    repo = make_repo()
    bad = taskfile(repo, "title: t\ngraph: [{kind: nope}]\n")
    code, _, err = coder(repo, "validate", "-f", str(bad), "--debug")
    assert code == 2 and "No such option" not in err
    assert hoisted(["run", "-f", "t.yaml", "--debug", "--color", "never"]) == [
        "--debug", "--color", "never", "run", "-f", "t.yaml",
    ]  # fmt: skip
    assert hoisted(["plan", "--", "--debug"]) == ["plan", "--", "--debug"]


def test_not_a_repository_is_exit_3_for_every_command(tmp_path: Path) -> None:
    for args in (["status"], ["mcp", "serve"], ["diff", "-t", "x"]):
        code, _, err = coder(tmp_path, *args)
        assert code == 3 and "not a git repository" in err, (args, err)


def test_diff_and_logs_page_on_a_terminal_in_colour(make_repo, tmp_path: Path) -> None:
    """Through a real pseudo-terminal: the pager git would use gets the diff coloured, with
    LESS=FRX; the same command into a pipe prints git's diff as it is, with no pager."""
    repo = make_repo()
    code, out, err = coder(repo, "run", "--autonomous", "-f", str(taskfile(repo, TASK)))
    assert code == 0, out + err
    seen, less = tmp_path / "paged.txt", tmp_path / "less.txt"
    env = {
        **os.environ,
        "GIT_PAGER": f'printf %s "$LESS" > {less}; cat > {seen}',
        "NO_COLOR": "",
    }
    proc = coder_on_terminal(repo, env, "diff", "-t", "c1")
    assert proc.returncode == 0, proc.stderr
    paged = seen.read_text()
    assert "\x1b[32m+one\x1b[0m" in paged and "\x1b[1mdiff --git a/one.txt b/one.txt" in paged
    assert less.read_text() == "FRX"
    plain = subprocess.run(
        [sys.executable, "-m", "coder", "diff", "-t", "c1"],
        cwd=repo, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert plain.stdout == git(repo, "diff", "main", "agent/c1-colours")
    seen.unlink()
    logs = subprocess.run(
        [sys.executable, "-m", "coder", "logs", "-t", "c1"],
        cwd=repo, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert " run.started steps=1 branch=agent/c1-colours " in logs.stdout
    assert not seen.exists()  # a pipe: no pager


def complete(repo: Path, words: str, shell: str = "bash") -> list[str]:
    """What the shell would be offered for `words` (the cursor after the last one)."""
    env = {
        **os.environ,
        "_CODER_COMPLETE": f"{shell}_complete",
        "COMP_WORDS": words,
        "COMP_CWORD": str(len(words.split()) - (0 if words.endswith(" ") else 1)),
    }
    out = subprocess.run(
        [sys.executable, "-m", "coder"], cwd=repo, env=env, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    return [line.split(",", 1)[1] for line in out.stdout.splitlines()]


def test_shell_completion_offers_commands_run_ids_and_step_ids(make_repo) -> None:
    repo = make_repo()
    code, out, err = coder(repo, "run", "--autonomous", "-f", str(taskfile(repo, TASK)))
    assert code == 0, out + err
    script = subprocess.run(
        [sys.executable, "-m", "coder", "completion", "bash"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    assert "_CODER_COMPLETE=bash_complete" in script and "complete -o nosort -F" in script
    assert complete(repo, "coder sta") == ["status"]
    assert complete(repo, "coder diff -t ") == ["c1"]
    assert complete(repo, "coder revert -t c1 --to-step ") == ["a"]
    assert complete(repo, "coder diff --step ") == ["a"]  # the only run's steps
    code, _, err = coder(repo, "completion", "tcsh")
    assert code == 2 and "'tcsh' is not one of 'bash', 'fish', 'zsh'" in err


def test_no_help_names_ollama_alone() -> None:
    """Under `provider: openai` the model is not Ollama's: no command's help, nor any of its
    options' (`--model`, `--replay`, ...), names Ollama without the other kind of server.
    (`trust` names the `ollama_host` setting.)"""
    import click

    from coder.cli import COMMANDS, main

    ctx = click.Context(main)
    texts = {"coder": main.help or ""}
    for name in COMMANDS:
        command = main.get_command(ctx, name)
        assert command is not None
        group = command.commands.values() if isinstance(command, click.Group) else [command]
        for each in group:
            texts[each.name or name] = each.help or ""
            for param in each.params:
                texts[f"{each.name} {param.name}"] = getattr(param, "help", None) or ""
    alone = {
        where: text
        for where, text in texts.items()
        if "Ollama" in text.replace("ollama_host", "") and "OpenAI" not in text
    }
    assert alone == {}


def test_every_commit_coder_makes_has_the_git_environments_identity(
    make_repo, monkeypatch: pytest.MonkeyPatch
) -> None:
    """GIT_AUTHOR_*/GIT_COMMITTER_* win over git config, as for `git commit`: the checkout's
    commit (--include-uncommitted), the step's and the merge's, read back with git."""
    repo = make_repo({"README.md": "# r\n"})
    (repo / "README.md").write_text("# edited\n")
    monkeypatch.setenv("GIT_AUTHOR_NAME", "CI Author")
    monkeypatch.setenv("GIT_AUTHOR_EMAIL", "author@ci.example")
    monkeypatch.setenv("GIT_COMMITTER_NAME", "CI Bot")
    monkeypatch.setenv("GIT_COMMITTER_EMAIL", "bot@ci.example")
    path = taskfile(repo, TASK)
    code, out, err = coder(repo, "run", "--autonomous", "--include-uncommitted", "-f", str(path))
    assert code == 0, out + err
    code, out, err = coder(repo, "merge", "-t", "c1")
    assert code == 0, out + err
    who = "--format=%s: %an <%ae>|%cn <%ce>"
    run_commits = git(repo, "log", who, "main~1..agent/c1-colours").splitlines()
    merged = git(repo, "log", "-1", who, "main").splitlines()
    assert len(run_commits) == 2 and len(merged) == 1  # the checkout's and the step's
    for line in run_commits + merged:
        assert line.endswith(": CI Author <author@ci.example>|CI Bot <bot@ci.example>"), line
