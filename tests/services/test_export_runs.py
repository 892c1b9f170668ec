"""The exported files run: each job's scripts executed here as the engine would run them (a
fresh clone per job, the job's environment, the engine's expressions filled in, GitHub's
GITHUB_ENV honoured), in the DAG's order, against a real bare remote; the run's branch that
the coordinator pushes holds every step's work, each step once."""

from __future__ import annotations

import os
import re
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from coder.cli import COMMANDS
from coder.taskfile import graph
from tests.conftest import coder, git
from tests.helpers import ROOT

pytestmark = pytest.mark.skipif(
    "worker" not in COMMANDS, reason="runs `coder worker` (coder.fleet), not in this tree"
)

TASKFILE = """\
id: exported
title: Six steps on six machines
graph:
  - {id: a, kind: shell, goal: write a, cmd: "echo a > a.txt"}
  - {id: b, kind: shell, goal: write b, cmd: "echo b > b.txt"}
  - {id: c_1, kind: shell, goal: write c, cmd: "echo c > c.txt"}
  - {id: d, kind: shell, goal: join a and b, cmd: "cat a.txt b.txt > d.txt", depends_on: [a, b]}
  - {id: e, kind: shell, goal: copy c, cmd: "cat c.txt > e.txt", depends_on: [c_1]}
  - {id: f, kind: shell, goal: join d and e, cmd: "cat d.txt e.txt > f.txt", depends_on: [d, e]}
"""
FILES = {"a.txt": "a\n", "b.txt": "b\n", "c.txt": "c\n", "d.txt": "a\nb\n", "e.txt": "c\n"}
FILES["f.txt"] = FILES["d.txt"] + FILES["e.txt"]
STEPS = ["a", "b", "c_1", "d", "e", "f"]


@pytest.fixture
def project(make_repo, tmp_path: Path) -> tuple[Path, Path, str]:
    """A repository with the taskfile committed and pushed to a bare remote, and a `coder`
    program on PATH that is this tree's (as `pip install coder` gives a runner one)."""
    repo = make_repo({"README.md": "# exported\n", "tasks/exported.yaml": TASKFILE})
    bare = tmp_path / "remote.git"
    git(tmp_path, "init", "-q", "--bare", str(bare))
    git(repo, "remote", "add", "origin", f"file://{bare}")
    git(repo, "push", "-q", "origin", "main")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    program = bin_dir / "coder"
    program.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m coder "$@"\n')
    program.chmod(program.stat().st_mode | stat.S_IXUSR)
    return repo, bare, f"{bin_dir}{os.pathsep}{os.environ['PATH']}"


def filled(
    text: str, values: dict[str, str], pattern: str, contexts: set[str] | None = None
) -> str:
    """`text` with the engine's expressions (`pattern`'s group 1) replaced; one this runner
    does not know, or of a context not available where it stands (`contexts`: GitHub's
    table of which context each key may use), fails the test."""

    def one(match: re.Match[str]) -> str:
        name = match.group(1)
        assert name in values, f"unknown expression {match.group(0)}"
        assert contexts is None or name.split(".")[0] in contexts, f"{name}: not available here"
        return values[name]

    return re.sub(pattern, one, text)


# GitHub's contexts by where an expression stands (workflow syntax: "Context availability")
WORKFLOW_ENV = {"github", "secrets", "inputs", "vars"}
JOB_ENV = WORKFLOW_ENV | {"needs", "strategy", "matrix"}
STEP = JOB_ENV | {"job", "runner", "env", "steps"}
GITHUB_EXPRESSION = r"\$\{\{ *([\w.]+) *\}\}"


def shell(script: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", "-e", "-c", script], cwd=cwd, env=env, capture_output=True, text=True, timeout=300
    )


def run_github_job(
    name: str, job: dict[str, Any], workflow: dict[str, Any], place: Path, base_env: dict[str, str]
) -> None:
    """One job as a runner runs it: a fresh checkout of the remote at the commit, each step's
    `run:` in bash with the workflow's, the job's and the step's env, GITHUB_ENV read back
    after each step (`uses:` steps other than checkout are the runner's own: Python is here)."""
    temp = place / name / "temp"
    temp.mkdir(parents=True)
    checkout = place / name / "checkout"
    sha = base_env["SHA"]
    git(place, "clone", "-q", base_env["REMOTE"], str(checkout))
    git(checkout, "checkout", "-q", "-B", "main", sha)
    expressions = {
        "github.sha": sha,
        "github.run_id": "4242",
        "github.token": "ghs_not-a-real-token",
        "vars.OLLAMA_HOST": "",
        "vars.CODER_MODEL": "",
        "runner.temp": str(temp),
    }
    github_env = temp / "github_env"
    github_env.touch()
    env = {
        "PATH": base_env["PATH"],
        "HOME": os.environ["HOME"],
        "GIT_CONFIG_NOSYSTEM": "1",
        "RUNNER_TEMP": str(temp),
        "GITHUB_ENV": str(github_env),
        "GITHUB_SERVER_URL": "https://github.com",
        "PYTHONPATH": str(ROOT),
    }
    for scope, contexts in ((workflow.get("env", {}), WORKFLOW_ENV), (job.get("env", {}), JOB_ENV)):
        env |= {
            k: filled(str(v), expressions, GITHUB_EXPRESSION, contexts) for k, v in scope.items()
        }
    for step in job["steps"]:
        if "uses" in step or step.get("name") == "Install coder":
            continue
        step_env = {
            k: filled(str(v), expressions, GITHUB_EXPRESSION, STEP)
            for k, v in step.get("env", {}).items()
        }
        script = filled(step["run"], expressions, GITHUB_EXPRESSION, STEP)
        done = shell(script, checkout, {**env, **step_env})
        assert done.returncode == 0, (name, step.get("name"), done.stdout, done.stderr)
        for line in github_env.read_text().splitlines():
            key, _, value = line.partition("=")
            env[key] = value


def topological(jobs: dict[str, Any]) -> list[str]:
    deps = {name: list(job.get("needs", [])) for name, job in jobs.items()}
    return graph.order(graph.build(deps))


def check_landed(bare: Path, run: str) -> None:
    refs = git(bare, "for-each-ref", "--format=%(refname)", f"refs/coder/{run}/steps/")
    assert sorted(refs.split()) == sorted(f"refs/coder/{run}/steps/{s}" for s in STEPS)
    [branch] = git(
        bare, "for-each-ref", "--format=%(refname:short)", f"refs/heads/agent/{run}-*"
    ).split()
    for path, text in FILES.items():
        assert git(bare, "show", f"{branch}:{path}") == text, path
    trailers = git(
        bare, "log", "--reverse", "--format=%(trailers:key=Coder-Step,valueonly)", f"main..{branch}"
    )
    landed = [line.strip() for line in trailers.splitlines() if line.strip()]
    assert sorted(landed) == sorted(STEPS)  # each step once
    for line in git(
        bare, "log", "--format=%(trailers:key=Coder-Task,valueonly)", f"main..{branch}"
    ).splitlines():
        assert line.strip() in ("", run)


def test_the_github_workflow_runs_job_by_job(project, tmp_path: Path) -> None:
    repo, bare, path = project
    code, out, err = coder(repo, "export", "github", "tasks/exported.yaml")
    assert code == 0, err
    workflow = yaml.safe_load(out)
    sha = git(repo, "rev-parse", "HEAD").strip()
    base_env = {"SHA": sha, "REMOTE": f"file://{bare}", "PATH": path}
    for name in topological(workflow["jobs"]):
        run_github_job(name, workflow["jobs"][name], workflow, tmp_path / "jobs", base_env)
    check_landed(bare, "exported-4242")


def test_the_argo_workflow_runs_task_by_task(project, tmp_path: Path) -> None:
    repo, bare, path = project
    code, out, err = coder(
        repo, "export", "argo", "tasks/exported.yaml", "--remote", f"file://{bare}"
    )
    assert code == 0, err
    document = yaml.safe_load(out.split("\n", 3)[3])
    sha = git(repo, "rev-parse", "HEAD").strip()
    parameters = {p["name"]: p.get("value") for p in document["spec"]["arguments"]["parameters"]}
    parameters.update({"base": sha, "ollama-host": "http://127.0.0.1:9"})
    templates = {t["name"]: t for t in document["spec"]["templates"]}
    [dag] = [t["dag"]["tasks"] for t in templates.values() if "dag" in t]
    order = graph.order(graph.build({t["name"]: t.get("dependencies", []) for t in dag}))
    by_name = {t["name"]: t for t in dag}
    for name in order:
        task = by_name[name]
        inputs = {p["name"]: p["value"] for p in task.get("arguments", {}).get("parameters", [])}
        values = {f"workflow.parameters.{k}": v or "" for k, v in parameters.items()}
        values |= {f"inputs.parameters.{k}": v for k, v in inputs.items()}
        values["workflow.name"] = "exported-x7k2p"
        container = templates[task["template"]]["container"]
        temp = tmp_path / "pods" / name
        temp.mkdir(parents=True)
        env = {
            "PATH": path,
            "HOME": os.environ["HOME"],
            "GIT_CONFIG_NOSYSTEM": "1",
            "PYTHONPATH": str(ROOT),
            "TMPDIR": str(temp),
        }
        env |= {
            e["name"]: filled(e["value"], values, r"\{\{([\w.-]+)\}\}") for e in container["env"]
        }
        script = container["args"][0].replace("pip install coder\n", "")
        # as the container runs it: its command (`sh -c`, a POSIX shell) and the script
        done = subprocess.run(
            [*container["command"], script],
            cwd=temp, env=env, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert done.returncode == 0, (name, done.stdout, done.stderr)
    check_landed(bare, "exported-x7k2p")
