"""`coder doctor` against the fake Ollama server: each failure with its fix."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from coder.policy import kernel
from tests.conftest import coder
from tests.fake_ollama import FakeOllama, down_url


def checks(repo: Path, *args: str) -> tuple[int, dict[str, dict[str, str]]]:
    code, out, _ = coder(repo, "doctor", "--json", *args)
    return code, {c["name"]: c for c in json.loads(out)["checks"]}


@pytest.fixture
def repo_with_tests(make_repo) -> Path:
    return make_repo(
        {
            "pyproject.toml": "[tool.pytest.ini_options]\n",
            "tests/test_a.py": "def test_a():\n    pass\n",
        }
    )


def test_all_good(repo_with_tests: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with FakeOllama() as fake:
        monkeypatch.setenv("OLLAMA_HOST", fake.url)
        code, found = checks(repo_with_tests)
        _, out, _ = coder(repo_with_tests, "doctor")  # the plain-text form, same facts
        assert fake.chat_bodies() == []  # doctor does not load the model
    assert code == (0 if kernel.support().available else 3)
    statuses = {n: c["status"] for n, c in found.items()}
    assert statuses.pop("command sandbox") == ("ok" if kernel.support().available else "fail")
    assert statuses.pop("command network") in ("ok", "warn")  # depends on the kernel
    assert statuses.pop("command metadata") in ("ok", "warn", "fail")  # see the next test
    assert statuses.pop("command view") in ("ok", "warn", "fail")  # and the one after
    assert statuses.pop("process trees") in ("ok", "warn")  # tests/policy/test_process_trees
    assert statuses == {
        "git repository": "ok",
        "test command": "ok",
        "tests": "ok",
        "project settings": "ok",
        "ollama host": "ok",
        "model": "ok",
        "tool protocol": "ok",
        "context window": "ok",
    }
    assert found["test command"]["detail"] == "python -m pytest -q (detected)"
    assert found["context window"]["detail"].startswith("num_ctx 32768 (the model's own, capped")
    assert f"ok    ollama host       {fake.url} (Ollama 0.33.0)" in out


def test_host_down_names_the_host_and_the_fix(
    repo_with_tests: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = down_url()
    monkeypatch.setenv("OLLAMA_HOST", url)
    code, found = checks(repo_with_tests)
    assert code == 3
    host = found["ollama host"]
    assert host["status"] == "fail" and url in host["detail"]
    assert "ollama serve" in host["fix"]
    assert "model" not in found  # nothing more can be known


def test_model_missing_gives_the_pull_command(
    repo_with_tests: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with FakeOllama() as fake:
        monkeypatch.setenv("OLLAMA_HOST", fake.url)
        code, found = checks(repo_with_tests, "--model", "llama9:70b")
    assert code == 3
    assert found["model"]["status"] == "fail" and "ollama pull llama9:70b" in found["model"]["fix"]


def test_no_tool_calling_and_small_context(
    repo_with_tests: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    models = {"tiny:1b": {"context_length": 2048, "capabilities": ["completion"], "arch": "llama"}}
    with FakeOllama(models=models) as fake:
        monkeypatch.setenv("OLLAMA_HOST", fake.url)
        code, found = checks(repo_with_tests, "--model", "tiny:1b")
    assert code == (0 if kernel.support().available else 3)  # no failure of its own
    assert found["tool protocol"] == {  # a model without tool calling works through text
        "name": "tool protocol",
        "status": "ok",
        "detail": "text: the tools are described in the system prompt (the model's "
        "capabilities (completion) do not include tools)",
        "fix": None,
    }
    assert found["context window"]["status"] == "warn"
    assert "num_ctx 2048" in found["context window"]["detail"]


def test_outside_a_repository(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OLLAMA_HOST", down_url())
    code, found = checks(tmp_path)
    assert code == 3
    assert found["git repository"]["status"] == "fail"
    assert found["git repository"]["detail"].startswith("not a git repository")


def test_the_metadata_wall_and_what_is_missing(
    repo_with_tests: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import dataclasses

    monkeypatch.setenv("OLLAMA_HOST", down_url())
    found = kernel.support()
    metadata = checks(repo_with_tests)[1]["command metadata"]
    if found.available and found.mounts_problem is None and found.setid_problem is None:
        assert metadata["status"] == "ok"
        assert metadata["detail"] == (
            "read-only outside the worktree (mount namespace); setuid refused (seccomp)"
        )
    walls = dataclasses.replace(
        found, problem=None, mounts_problem="needs CAP_SYS_ADMIN", setid_problem=None
    )
    monkeypatch.setattr(kernel, "support", lambda: walls)
    metadata = checks(repo_with_tests)[1]["command metadata"]
    assert metadata["status"] == "warn" and "root" in metadata["fix"]
    assert metadata["detail"] == (
        "chmod, chown, touch and setxattr reach files outside the worktree (needs "
        "CAP_SYS_ADMIN); setuid refused (seccomp)"
    )
    none = dataclasses.replace(walls, problem="this kernel has no Landlock")
    monkeypatch.setattr(kernel, "support", lambda: none)
    _, out, _ = coder(repo_with_tests, "doctor")
    assert "FAIL  command metadata  no kernel sandbox: see command sandbox" in out


def test_the_view_and_why_it_is_missing(
    repo_with_tests: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import dataclasses

    monkeypatch.setenv("OLLAMA_HOST", down_url())
    found = kernel.support()
    view = checks(repo_with_tests)[1]["command view"]
    if found.available and found.view_problem is None:
        assert view["status"] == "ok" and "no $HOME, /run, /tmp, /dev/shm" in view["detail"]
    missing = dataclasses.replace(found, problem=None, view_problem="needs CAP_SYS_ADMIN")
    monkeypatch.setattr(kernel, "support", lambda: missing)
    view = checks(repo_with_tests)[1]["command view"]
    assert view["status"] == "warn" and "user namespaces" in view["fix"]
    assert view["detail"].startswith("commands can read whatever you can and connect to UNIX")
    assert view["detail"].endswith("(needs CAP_SYS_ADMIN)")
