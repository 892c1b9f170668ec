"""One `.env` finder: the run's start (`secrets_from_repo`), the tools' first scan
(`register_env_files`) and a step's prefix (the commit's env files) register the values of
the same files, by one name rule (`coder.redact.is_env_file`)."""

from __future__ import annotations

import os
from pathlib import Path

from coder.agent.prefix import register_env_files as register_commit_env_files
from coder.git.repository import open_repo
from coder.redact import Redactor, is_env_file, secrets_from_repo
from coder.tools.envfiles import register_env_files
from tests.conftest import git

# file -> whether its value is registered (each file holds its own secret value)
FILES = {
    ".env": True,
    ".env.local": True,
    ".ENV.prod": True,
    ".envrc": True,
    "sub/.env": True,
    "sub/.env.test": True,
    ".environment": False,
    ".envoy.yaml": False,
    "env": False,
    "node_modules/.env": False,
    ".venv/.env.x": False,
}


def _value(rel: str) -> str:
    return "s3cret-" + rel.replace("/", "_").replace(".", "d")


def _tree(make_repo) -> Path:
    files = {rel: f"export API_KEY={_value(rel)}\n" for rel in FILES}
    repo = make_repo(files)
    os.symlink("../.env.local", repo / "sub" / ".env.linked")  # a symlinked `.env`
    os.symlink("sub", repo / "linked-dir")  # a folder link: not followed
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "links")
    return repo


def test_the_three_finders_register_the_same_files(make_repo) -> None:
    repo = _tree(make_repo)
    expected = {_value(rel) for rel, found in FILES.items() if found}

    at_start = set(secrets_from_repo(repo))
    tools = Redactor()
    register_env_files(repo, tools)
    prefix = Redactor()
    register_commit_env_files(open_repo(repo), git(repo, "rev-parse", "HEAD").strip(), prefix)

    assert at_start == set(tools.known) == set(prefix.known) == expected


def test_the_run_start_looks_deeper_than_the_tools_first_scan(make_repo) -> None:
    repo = make_repo({"a/b/.env": f"API_KEY={_value('deep')}\n"})
    tools = Redactor()
    register_env_files(repo, tools)
    assert secrets_from_repo(repo) == [_value("deep")] and not tools.known


def test_the_name_rule() -> None:
    assert [n for n in (".env", ".env.local", ".Env", ".envrc") if not is_env_file(n)] == []
    assert [n for n in (".environment", ".envoy.yaml", "x.env", "env") if is_env_file(n)] == []
