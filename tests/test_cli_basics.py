"""The foundation commands as a user runs them: validate, show, init, config, exit codes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from coder.cli import main
from tests.conftest import git
from tests.helpers import ROOT

EXAMPLES = sorted((ROOT / "tasks").glob("*.yaml"))


def run(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """The installed `coder` entry point in a real process."""
    return subprocess.run(
        [sys.executable, "-m", "coder", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )


def invoke(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.stdout, result.stderr


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_every_example_taskfile_validates(path: Path) -> None:
    code, out, _ = invoke("validate", "-f", str(path))
    assert code == 0, out
    assert out.startswith(f"{path}: valid (")


def test_validate_reports_problems_and_exits_2(tmp_path: Path) -> None:
    path = tmp_path / "t.yaml"
    path.write_text("title: t\ngraph:\n  - {id: a, kind: shell, cmd: x, depends_on: [b]}\n")
    code, out, err = invoke("validate", "-f", str(path))
    assert code == 2
    assert out == f"{path}:3:47: step 'a' depends on unknown step 'b'\n"
    assert err == f"{path}: 1 problem\n"


def test_validate_json(tmp_path: Path) -> None:
    path = tmp_path / "t.yaml"
    path.write_text("title: t\ngraph:\n  - {kind: shell}\n")
    code, out, _ = invoke("validate", "-f", str(path), "--json")
    assert code == 2
    assert json.loads(out) == {
        "file": str(path),
        "valid": False,
        "problems": [
            {
                "file": str(path),
                "line": 3,
                "col": 5,
                "path": "$.graph[0]",
                "message": "graph[0]: missing required field 'cmd' for a shell step",
            }
        ],
    }
    code, out, _ = invoke("validate", "-f", str(ROOT / "tasks" / "parallel-levels.yaml"), "--json")
    assert code == 0 and json.loads(out)["valid"] is True and json.loads(out)["steps"] == 6


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"title: t\ngraph: [\n", ":3:1: YAML syntax error"),
        (b"", ":1:1: file is empty"),
        (b"\x00\x01\x02binary", ":1:1: not a text file"),
        (b"title: \xff\xfe\n", ":1:8: not valid UTF-8"),
    ],
)
def test_bad_files_through_the_real_entry_point(
    tmp_path: Path, content: bytes, message: str
) -> None:
    path = tmp_path / "t.yaml"
    path.write_bytes(content)
    proc = run("validate", "-f", str(path))
    assert proc.returncode == 2
    assert proc.stdout.count("\n") == 1 and message in proc.stdout
    assert "Traceback" not in proc.stdout + proc.stderr


def test_missing_and_directory_through_the_real_entry_point(tmp_path: Path) -> None:
    for target, message in ((tmp_path / "nope.yaml", "no such file"), (tmp_path, "is a directory")):
        proc = run("validate", "-f", str(target))
        assert proc.returncode == 2 and message in proc.stdout and "Traceback" not in proc.stderr


def test_show_text_and_json() -> None:
    path = ROOT / "tasks" / "parallel-levels.yaml"
    code, out, _ = invoke("show", "-f", str(path))
    assert code == 0
    assert "order   setup -> docs -> data -> optional -> after-optional -> index" in out
    assert "level 2  (may run in parallel)" in out
    assert "  index           shell    run `ls out > out/INDEX.txt`  <- docs, data" in out
    code, out, _ = invoke("show", "-f", str(path), "--json")
    data = json.loads(out)
    assert data["levels"] == [["setup"], ["docs", "data", "optional"], ["after-optional", "index"]]
    assert data["id"] == "parallel-demo" and data["id_generated"] is False
    assert [s["level"] for s in data["steps"]] == [1, 2, 2, 2, 3, 3]


def test_show_invalid_taskfile_is_one_error_line(tmp_path: Path) -> None:
    path = tmp_path / "t.yaml"
    path.write_text("title: t\n")
    code, out, err = invoke("show", "-f", str(path), "--json")
    assert code == 2
    assert json.loads(out)["error"].startswith(f"{path}:1:1: missing required field 'graph'")
    assert err.startswith("coder: error: ")


def test_init_prepares_the_repository(make_repo, monkeypatch: pytest.MonkeyPatch) -> None:
    repo = make_repo({"pyproject.toml": "[tool.pytest.ini_options]\n", ".gitignore": "*.pyc\n"})
    monkeypatch.chdir(repo)
    monkeypatch.setenv("OLLAMA_HOST", "127.0.0.1:11500")
    code, out, _ = invoke("init")
    assert code == 0, out
    assert all((repo / ".coder" / d).is_dir() for d in ("state", "logs", "artifacts", "worktrees"))
    assert "/.coder/" in (repo / ".git" / "info" / "exclude").read_text().splitlines()
    assert (repo / ".gitignore").read_text() == "*.pyc\n"
    # only what was detected: defaults and the user's own config keep applying
    written = json.loads((repo / "coder.config.json").read_text())
    assert written == {"test_command": "python -m pytest -q"}
    # .coder/ is invisible to git; only the new config file shows up
    assert git(repo, "status", "--porcelain") == "?? coder.config.json\n"
    # a second init keeps the user's edits and does not add the exclude twice
    (repo / "coder.config.json").write_text('{"model": "mine"}\n')
    code, out, _ = invoke("init")
    assert code == 0 and "Kept existing" in out
    assert json.loads((repo / "coder.config.json").read_text()) == {"model": "mine"}
    assert (repo / ".git" / "info" / "exclude").read_text().count("/.coder/") == 1


def test_init_outside_a_repository_is_an_environment_error(tmp_path: Path) -> None:
    proc = run("init", cwd=tmp_path)
    assert proc.returncode == 3
    assert proc.stderr.startswith("coder: error: not a git repository")
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / ".coder").exists() and not (tmp_path / "coder.config.json").exists()


def test_a_full_disk_is_an_environment_error_that_leaves_no_half_file(
    repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`coder init` on a full disk: before, an OSError traceback and an empty
    coder.config.json that broke every later command. Now exit 3 naming the file, and no
    file. A full disk anywhere else (the lock, a log) is exit 3 with the errno's words."""
    import errno

    from coder.files import durable
    from tests.conftest import coder

    def full(fd: int, data: bytes) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    with monkeypatch.context() as patch:
        patch.setattr(durable, "_write_all", full)
        code, out, err = coder(repo, "init")
    assert code == 3, out + err
    assert err.splitlines() == [
        "coder: error: cannot write coder.config.json: No space left on device",
        "  hint: free some disk space (or fix the file system), then run the command again "
        "(`coder resume -t ID` continues a run)",
    ]
    assert not list(repo.glob("coder.config.json*"))  # no empty file, no temp file

    def nowhere(*args: object, **kwargs: object) -> None:
        raise OSError(errno.EDQUOT, os.strerror(errno.EDQUOT), "/somewhere/x")

    monkeypatch.setattr("coder.services.initialize.init", nowhere)
    code, out, err = coder(repo, "init")
    assert code == 3 and err.startswith("coder: error: Disk quota exceeded: /somewhere/x\n")


def test_config_shows_values_and_sources(repo: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(repo)
    (repo / "coder.config.json").write_text('{"max_parallel": 2}')
    monkeypatch.setenv("CODER_MODEL", "llama3.1:8b")
    code, out, _ = invoke("config", "--json")
    data = json.loads(out)
    assert (
        data["values"]["model"] == "llama3.1:8b" and data["sources"]["model"] == "env CODER_MODEL"
    )
    assert data["values"]["max_parallel"] == 2
    assert data["sources"]["max_parallel"] == f"project file {repo / 'coder.config.json'}"
    code, out, _ = invoke("config")
    assert code == 0
    assert any(line.startswith("model") and "env CODER_MODEL" in line for line in out.splitlines())


def test_bad_config_file_is_exit_2_with_position(
    repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(repo)
    (repo / "coder.config.json").write_text('{"max_parallel": "two"}')
    code, _, err = invoke("config")
    assert code == 2
    assert err.splitlines()[0] == (
        f"coder: error: {repo / 'coder.config.json'}:1:18: max_parallel:"
        " must be a whole number or null, got the string 'two'"
    )


def test_version_and_usage_errors() -> None:
    assert run("--version").stdout.strip() == "coder, version 0.1.0"
    proc = run("validate")
    assert proc.returncode == 2 and "Missing option '-f'" in proc.stderr
    proc = run("frobnicate")
    assert proc.returncode == 2 and "No such command 'frobnicate'" in proc.stderr


def test_help_does_not_import_heavy_modules() -> None:
    code = (
        "import sys, coder.cli; coder.cli.main(['--help'], standalone_mode=False);"
        "heavy = {'networkx', 'pygit2', 'ollama', 'mcp', 'jsonschema', 'yaml', 'structlog', 'ray'};"
        "heavy |= {'coder.errors', 'dataclasses'};"
        "heavy |= {'coder.cli.' + m for m, _f, _h in coder.cli.COMMANDS.values()};"
        "print(sorted(heavy & set(sys.modules)))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert proc.stdout.strip().splitlines()[-1] == "[]"


def cli_probe(cwd: Path, modules: tuple[str, ...], *args: str) -> tuple[str, list[str]]:
    """`coder ARGS` in `cwd`, in a fresh interpreter: what it printed, and which of `modules`
    it imported."""
    code = (
        "import sys, coder.cli; coder.cli.main(sys.argv[1:], standalone_mode=False);"
        f"print([m for m in {modules!r} if m in sys.modules])"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    *printed, imported = proc.stdout.splitlines()
    return "\n".join(printed), json.loads(imported.replace("'", '"'))


def status_probe(cwd: Path, *args: str) -> tuple[str, list[str]]:
    """`coder status` in `cwd`: what it printed, and which of the modules the no-runs answer
    does without it imported."""
    return cli_probe(
        cwd, ("pathlib", "json", "coder.run.state", "coder.errors", "dataclasses"), "status", *args
    )


def test_status_with_no_runs_answers_without_loading_the_state(repo: Path) -> None:
    """The first command a new user types: no pathlib, json, state or error classes (a quarter
    of its time), from the root or a subdirectory, with `.coder/` there or not; once a run is
    recorded the full path lists it."""
    (repo / "src").mkdir()
    assert status_probe(repo / "src") == (
        "No runs yet. Start one with `coder run --autonomous -f TASKFILE`.",
        [],
    )
    (repo / ".coder" / "state").mkdir(parents=True)
    assert status_probe(repo)[1] == []
    assert status_probe(repo, "--json")[0] == "[]"
    (repo / ".coder" / "tasks").mkdir()
    (repo / ".coder" / "tasks" / "t1.json").write_text("{}")  # a manifest: a run, maybe
    printed, imported = status_probe(repo)
    assert "coder.run.state" in imported and "t1" in printed


def test_status_outside_a_main_checkout_takes_the_full_path(repo: Path, tmp_path: Path) -> None:
    """From a linked worktree the runs are the main checkout's: the quick answer does not
    guess (a run there is listed); `.coder` as a file is the full path's clear error."""
    path = repo / "t.yaml"
    path.write_text("id: lw\ntitle: t\ngraph:\n  - {id: s1, kind: shell, cmd: 'true'}\n")
    assert run("run", "--autonomous", "-f", str(path), cwd=repo).returncode == 0
    linked = tmp_path / "linked"
    git(repo, "worktree", "add", "-q", "--detach", str(linked))
    assert "lw" in run("status", cwd=linked).stdout
    other = tmp_path / "other"
    other.mkdir()
    git(other, "init", "-q")
    (other / ".coder").write_text("not a directory")
    proc = run("status", cwd=other)
    assert proc.returncode == 3 and ".coder is a file" in proc.stderr, proc.stderr


def test_reading_a_finished_run_loads_no_libgit2_provider_or_structlog(tmp_path: Path) -> None:
    """`coder status`, `show -t` and `logs -t` read a run's files: a run with model usage (the
    demo's) needs neither libgit2, the provider seam nor structlog (which writes the log) for
    that; `diff` and `report` (the files each commit changed) do load libgit2, which the probe
    must see."""
    demo = tmp_path / "demo"
    assert run("demo", "--keep", str(demo), cwd=tmp_path).returncode == 0

    def loaded(*args: str) -> list[str]:
        return cli_probe(demo, ("pygit2", "coder.models.provider", "structlog"), *args)[1]

    for args in (["status"], ["show", "-t", "demo"], ["logs", "-t", "demo"]):
        assert loaded(*args) == [], args
    # status reads each run's manifest for its title, branch, order and parent: its few
    # fields only, never the whole check that loads the taskfile package (and YAML)
    assert cli_probe(demo, ("coder.taskfile", "yaml"), "status")[1] == []
    assert loaded("diff", "-t", "demo", "--stat") == ["pygit2"]
    assert loaded("report", "-t", "demo") == ["pygit2"]


def test_the_command_table_matches_the_commands() -> None:
    """`coder --help` lists commands from coder.cli.COMMANDS without importing them: each
    line there must be what the command's own docstring says, and every command is listed."""
    import importlib

    import click

    from coder.cli import COMMANDS

    ctx = click.Context(main)
    for name, (module, function, line) in COMMANDS.items():
        command = getattr(importlib.import_module(f"coder.cli.{module}"), function)
        assert command.name == name and main.get_command(ctx, name) is command
        assert command.get_short_help_str(10**6) == line, name
    defined = {
        c
        for path in (ROOT / "coder" / "cli").glob("[!_]*.py")
        for c in vars(importlib.import_module(f"coder.cli.{path.stem}")).values()
        if isinstance(c, click.Command) and c is not main
    }
    nested = {c for g in defined if isinstance(g, click.Group) for c in g.commands.values()}
    assert {c.name for c in defined - nested} == set(COMMANDS)  # none left out of the table


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["validate", "--json"], "Missing option '-f' / '--file'."),
        (
            ["run", "--max-parallel", "0", "--json", "-f", "x.yaml"],
            "Invalid value for '--max-parallel': 0 is not in the range 1<=x<=32.",
        ),
        (["show", "--json"], "pass exactly one of -f FILE (a taskfile) or -t ID (a run)"),
        (["frobnicate", "--json"], "No such command 'frobnicate'."),
    ],
)
def test_usage_errors_under_json_are_one_json_object_on_stdout(
    args: list[str], message: str
) -> None:
    proc = run(*args)
    assert proc.returncode == 2
    data = json.loads(proc.stdout)
    assert data["hint"].startswith("see `") and data.pop("hint").endswith(" --help`")
    assert data == {"error": message, "exit_code": 2}
    assert "Usage: " in proc.stderr  # the text for people stays on stderr


def test_init_says_when_no_test_command_is_detected(repo: Path, monkeypatch) -> None:
    monkeypatch.chdir(repo)
    code, out, _ = invoke("init")
    assert code == 0
    assert "None" not in out
    assert "  test_command  none detected (set it in coder.config.json" in out


def test_a_committed_dot_coder_file_is_one_clear_error(make_repo, monkeypatch) -> None:
    repo = make_repo({".coder": "not a directory\n"})
    monkeypatch.chdir(repo)
    task = repo.parent / "task.yaml"
    task.write_text("title: t\ngraph:\n  - {kind: shell, cmd: 'echo a > a'}\n")
    for args in (["init"], ["run", "--autonomous", "-f", str(task)], ["status"]):
        code, out, err = invoke(*args)
        assert code == 3, (args, out, err)
        assert err.splitlines()[0] == (
            f"coder: error: {repo / '.coder'} is a file, but coder keeps its runs, logs and "
            "worktrees in a .coder/ directory there"
        )
    assert git(repo, "status", "--porcelain") == ""
    assert git(repo, "branch", "--list") == "* main\n"


def test_positional_forms_as_gh_and_git_take_them_and_suggestions(make_repo) -> None:
    """`coder run FILE`, `coder show ID`, `coder merge ID` (where -f and -t are the long
    forms), and a mistyped command gets the one it is close to; usage errors are exit 2."""
    from tests.conftest import coder

    repo = make_repo()
    (repo / "tasks").mkdir()
    (repo / "tasks" / "greet.yaml").write_text(
        "id: greet\ntitle: Greet\ngraph:\n  - {kind: shell, cmd: 'echo hi > hi.txt'}\n"
    )
    code, _out, err = coder(repo, "run", "--autonomous", "tasks/greet.yaml")
    assert code == 0, err
    assert git(repo, "show", "agent/greet-greet:hi.txt") == "hi\n"
    shown, by_option = (
        coder(repo, "show", "greet", "--json"),
        coder(repo, "show", "-t", "greet", "--json"),
    )
    assert shown[0] == 0 and json.loads(shown[1]) == json.loads(by_option[1])
    code, _out, err = coder(repo, "merge", "greet", "-t", "other")
    assert code == 2 and "two runs named: greet and -t other" in err
    code, _out, err = coder(repo, "run", "tasks/greet.yaml", "-t", "greet")
    assert code == 2 and "both name a taskfile" in err
    proc = run("log")
    assert proc.returncode == 2 and "No such command 'log'. Did you mean 'logs'?" in proc.stderr
