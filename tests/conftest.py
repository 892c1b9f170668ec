"""Shared fixtures: an isolated HOME and config for every test, and real git repositories."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

GIT_ENV = {
    "GIT_AUTHOR_NAME": "Test User",
    "GIT_AUTHOR_EMAIL": "test@example.com",
    "GIT_COMMITTER_NAME": "Test User",
    "GIT_COMMITTER_EMAIL": "test@example.com",
}


@pytest.fixture(autouse=True)
def isolated_home(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> Path:
    """Never read or write the developer's real ~/.config or ~/.gitconfig."""
    home = tmp_path_factory.mktemp("home")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(home / ".config"))
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")
    # As in an activated venv: `python` is the one running the tests (commands name programs
    # by what PATH finds; an interpreter named by another path is refused).
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    for var in ("OLLAMA_HOST", "CODER_MODEL", "CODER_CONFIG", "GIT_DIR", "GIT_WORK_TREE"):
        monkeypatch.delenv(var, raising=False)
    (home / ".gitconfig").write_text(
        "[user]\n\tname = Test User\n\temail = test@example.com\n[init]\n\tdefaultBranch = main\n"
    )
    return home


@pytest.fixture(autouse=True)
def libgit2_config(isolated_home: Path, tmp_path_factory: pytest.TempPathFactory):
    """libgit2 fixes its config search path when pygit2 is imported (the real HOME, before the
    isolated HOME exists); point it at the test's HOME for each test, in this process."""
    import pygit2
    from pygit2.enums import ConfigLevel

    wanted = {
        ConfigLevel.SYSTEM: str(tmp_path_factory.mktemp("nosystem")),
        ConfigLevel.XDG: str(isolated_home / ".config" / "git"),
        ConfigLevel.GLOBAL: str(isolated_home),
    }
    paths = pygit2.settings.search_path
    saved = {level: paths[level] for level in wanted}
    for level, value in wanted.items():
        paths[level] = value
    yield
    for level, value in saved.items():
        paths[level] = value


@pytest.fixture(params=["libgit2", "git"])
def scan(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Run the test with each of the step scan's two ways (coder.git.staging): libgit2 in
    process (small trees), and the git program run confined (large ones)."""
    from coder.git import staging

    below = 10**9 if request.param == "libgit2" else 0
    monkeypatch.setattr(staging, "IN_PROCESS_BELOW", below)
    return str(request.param)


def git(repo: Path, *args: str) -> str:
    """Run the real git CLI (tests verify what coder did with it, not with pygit2)."""
    out = subprocess.run(
        ["git", *args],
        cwd=repo,
        check=True,
        capture_output=True,
        text=True,
        env={**os.environ, **GIT_ENV},
    )
    return out.stdout


def coder(repo: Path, *args: str) -> tuple[int, str, str]:
    """`coder ARGS` in-process in `repo` (exit code, stdout, stderr); a crash is re-raised."""
    from click.testing import CliRunner

    from coder.cli import main

    cwd = os.getcwd()
    os.chdir(repo)
    try:
        result = CliRunner().invoke(main, list(args))
    finally:
        os.chdir(cwd)
    if result.exception and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, result.stdout, result.stderr


@pytest.fixture
def make_repo(tmp_path: Path):
    """Factory: a git repo with `files` committed on main."""

    def make(files: dict[str, str] | None = None, name: str = "repo") -> Path:
        repo = tmp_path / name
        repo.mkdir()
        git(repo, "init", "-q", "-b", "main")
        for rel, text in (files or {"README.md": "# sample\n"}).items():
            path = repo / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
        git(repo, "add", "-A")
        git(repo, "commit", "-q", "-m", "initial")
        return repo

    return make


@pytest.fixture
def repo(make_repo) -> Path:
    return make_repo()


SAMPLE = Path(__file__).resolve().parent.parent / "fixtures" / "pyproject-sample"


def sample_files() -> dict[str, str]:
    """The sample project (fixtures/pyproject-sample) as {path: text}."""
    return {str(p.relative_to(SAMPLE)): p.read_text() for p in SAMPLE.rglob("*") if p.is_file()}


@pytest.fixture
def sample(make_repo) -> Path:
    """A git repository holding the sample calculator project."""
    return make_repo(sample_files())


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch):
    """The fake Ollama server, with OLLAMA_HOST pointing at it."""
    from tests.fake_ollama import FakeOllama

    with FakeOllama() as server:
        monkeypatch.setenv("OLLAMA_HOST", server.url)
        yield server


@pytest.fixture(scope="session")
def installed_wheel(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """coder built as a wheel and installed from it (not editable) into a directory of its
    own: (the wheel, the directory to put on PYTHONPATH)."""
    import subprocess
    import sys

    root = Path(__file__).resolve().parent.parent
    tmp = tmp_path_factory.mktemp("wheel")
    pip = [sys.executable, "-m", "pip", "-q"]
    subprocess.run(
        [*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", str(tmp / "dist"), str(root)],
        check=True,
        capture_output=True,
    )
    [wheel] = (tmp / "dist").glob("coder-*.whl")
    subprocess.run(
        [*pip, "install", "--no-deps", "--target", str(tmp / "site"), str(wheel)],
        check=True,
        capture_output=True,
    )
    return wheel, tmp / "site"
