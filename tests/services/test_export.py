"""`coder export github|argo`: the generated files validate against the engines' own schema
(SchemaStore's github-workflow schema, as check-jsonschema vendors it) and models (hera's),
their job edges are the taskfile's DAG, and bad input writes nothing."""

from __future__ import annotations

import base64
import json
import os
import re
import shlex
import subprocess
import sys
from importlib import resources
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from hera.workflows import Workflow
from hera.workflows import models as argo_models

from coder import taskfile
from coder.services import export as exporting
from tests.conftest import coder

# Two levels whose steps run in parallel (a, b; then c, d), then e and f.
SIX = """\
id: six-steps
title: Six steps, two parallel levels
graph:
  - id: a
    kind: shell
    goal: write a
    cmd: "true"
  - id: b
    kind: shell
    goal: write b
    cmd: "true"
  - id: c
    kind: shell
    goal: write c from a
    cmd: "true"
    depends_on: [a]
  - id: d
    kind: shell
    goal: write d from a and b
    cmd: "true"
    depends_on: [a, b]
  - id: e
    kind: shell
    goal: join c and d
    cmd: "true"
    depends_on: [c, d]
  - id: f
    kind: shell
    goal: after e
    cmd: "true"
    depends_on: [e]
"""

# Step ids that are good step ids but not good job names as they stand (case, `_`, the
# coordinator's and the Argo template's names), and one that is a mapped one's first choice.
ODD = """\
id: odd_names
title: Odd step names
graph:
  - {id: Build, kind: shell, goal: one, cmd: "true"}
  - {id: build, kind: shell, goal: two, cmd: "true"}
  - {id: fix_login, kind: shell, goal: three, cmd: "true", depends_on: [Build]}
  - {id: fix-login, kind: shell, goal: four, cmd: "true", depends_on: [fix_login, build]}
  - {id: coordinator, kind: shell, goal: five, cmd: "true", depends_on: [fix-login]}
  - {id: worker, kind: shell, goal: six, cmd: "true", depends_on: [coordinator]}
  - {id: build-2, kind: shell, goal: seven, cmd: "true"}
"""

GITHUB_JOB = re.compile(r"^[_a-zA-Z][a-zA-Z0-9_-]*$")  # the schema's patternProperties
ARGO_TASK = re.compile(r"^[a-zA-Z0-9][-a-zA-Z0-9]*$")  # Argo's name rule for DAG tasks


def github_schema() -> dict[str, Any]:
    vendor = resources.files("check_jsonschema.builtin_schemas.vendor")
    return json.loads((vendor / "github-workflows.json").read_text(encoding="utf-8"))


def dag_of(text: str) -> dict[str, list[str]]:
    task = taskfile.from_dict(yaml.safe_load(text))
    return {s.id: list(s.depends_on) for s in task.steps}


@pytest.fixture
def six(make_repo) -> Path:
    return make_repo({"README.md": "# six\n", "tasks/six.yaml": SIX})


def export(repo: Path, *args: str) -> tuple[int, str, str]:
    return coder(repo, "export", *args)


def github(repo: Path, path: str = "tasks/six.yaml", *args: str) -> dict[str, Any]:
    code, out, err = export(repo, "github", path, *args)
    assert code == 0, err
    return yaml.safe_load(out)


def argo(repo: Path, path: str = "tasks/six.yaml", *args: str) -> str:
    code, out, err = export(repo, "argo", path, *args)
    assert code == 0, err
    return out


def github_edges(workflow: dict[str, Any]) -> dict[str, list[str]]:
    jobs = workflow["jobs"]
    return {job: list(spec.get("needs", [])) for job, spec in jobs.items() if job != "coordinator"}


def argo_edges(text: str) -> tuple[dict[str, list[str]], list[str]]:
    """Each step task's dependencies, and the coordinator's, read back through hera's
    Workflow model."""
    built = Workflow.from_yaml(text).build()
    assert isinstance(built, argo_models.Workflow)
    [dag] = [t.dag for t in built.spec.templates or [] if t.dag is not None]
    edges = {task.name: task.dependencies or [] for task in dag.tasks}
    for task in dag.tasks:
        assert task.depends is None  # Argo refuses both in one DAG
    return edges, edges.pop("coordinator")


def test_the_github_workflow_validates_and_its_needs_are_the_dag(six: Path) -> None:
    workflow = github(six)
    # the schema names no remote reference: it validates offline, as SchemaStore serves it
    jsonschema.Draft7Validator(github_schema()).validate(workflow)
    assert github_edges(workflow) == dag_of(SIX)
    coordinator = workflow["jobs"]["coordinator"]
    assert coordinator["needs"] == ["a", "b", "c", "d", "e", "f"]
    assert "if" not in coordinator  # only once every step is pushed: see coordinator_commands
    # RUN is new for each workflow run; the model server is the repository's variable
    env = workflow["env"]
    assert env["CODER_RUN"] == "six-steps-${{ github.run_id }}"
    assert env["CODER_BASE"] == "${{ github.sha }}" and env["CODER_TASKFILE"] == "tasks/six.yaml"
    assert env["OLLAMA_HOST"] == "${{ vars.OLLAMA_HOST }}"
    assert "secrets." not in json.dumps(workflow)
    # write only where a push happens: every job pushes (a step ref, the run's branch)
    assert workflow["permissions"] == {"contents": "read"}
    for spec in workflow["jobs"].values():
        assert spec["permissions"] == {"contents": "write"}
        assert spec["steps"][0] == {
            "uses": "actions/checkout@v4",
            "with": {"fetch-depth": 0, "persist-credentials": False},
        }
        assert step_named(spec, "Give git the job's token")["env"] == {
            "TOKEN": "${{ github.token }}"
        }


def step_named(job: dict[str, Any], name: str) -> dict[str, Any]:
    [step] = [step for step in job["steps"] if step.get("name") == name]
    return step


def test_the_token_step_gives_every_git_of_the_job_the_token(six: Path, tmp_path: Path) -> None:
    """The step that lets the worker's own clone (and the coordinator's fetch and push) use
    the job's token, run here as a runner would: git itself reads the header back."""
    script = step_named(github(six)["jobs"]["a"], "Give git the job's token")["run"]
    home, temp, github_env = tmp_path / "home", tmp_path / "temp", tmp_path / "github_env"
    home.mkdir(), temp.mkdir()
    (home / ".gitconfig").write_text("[user]\n\tname = Someone\n")
    env = {
        "PATH": os.environ["PATH"],
        "HOME": str(home),
        "RUNNER_TEMP": str(temp),
        "GITHUB_ENV": str(github_env),
        "GITHUB_SERVER_URL": "https://github.com",
        "TOKEN": "ghs_0123456789abcdef",
    }
    subprocess.run(["bash", "-e", "-c", script], cwd=six, env=env, check=True)
    config = temp / "coder.gitconfig"
    assert github_env.read_text() == f"GIT_CONFIG_GLOBAL={config}\n"
    assert config.stat().st_mode & 0o077 == 0  # the token's file is the runner user's alone
    env["GIT_CONFIG_GLOBAL"] = str(config)
    found = subprocess.run(
        ["git", "config", "--global", "--includes", "--get-regexp", r"^(http\..*\.extraheader|user\.name)$"],
        env=env, capture_output=True, text=True, check=True,
    )  # fmt: skip
    auth = base64.b64encode(b"x-access-token:ghs_0123456789abcdef").decode()
    assert found.stdout.splitlines() == [
        "user.name Someone",  # the runner's own global config still applies
        f"http.https://github.com/.extraheader AUTHORIZATION: basic {auth}",
    ]


def test_the_worker_clones_a_url() -> None:
    assert exporting.remote_url("origin") == '"$(git remote get-url origin)"'
    assert exporting.remote_url("my fork") == "\"$(git remote get-url 'my fork')\""
    for url in ("https://github.com/a/b.git", "git@github.com:a/b.git", "/srv/git/b.git"):
        assert exporting.remote_url(url) == url


def commands_of(workflow: dict[str, Any], job: str) -> list[list[str]]:
    runs = [step["run"] for step in workflow["jobs"][job]["steps"] if "run" in step]
    return [shlex.split(line) for run in runs for line in run.splitlines() if "coder " in line]


def test_the_checks_can_fail(six: Path) -> None:
    """What the schema and the models refuse: a job name with a space, a needs of a number,
    an Argo task without a name."""
    workflow = github(six)
    validator = jsonschema.Draft7Validator(github_schema())
    for broken in (
        {**workflow, "jobs": {**workflow["jobs"], "a b": workflow["jobs"]["a"]}},
        {**workflow, "jobs": {**workflow["jobs"], "c": {**workflow["jobs"]["c"], "needs": 3}}},
        {key: value for key, value in workflow.items() if key != "jobs"},
    ):
        assert not validator.is_valid(broken)
    document = yaml.safe_load(argo(six))
    del document["spec"]["templates"][-1]["dag"]["tasks"][0]["name"]
    with pytest.raises(ValueError, match="name"):
        argo_models.Workflow.model_validate(document)


def test_each_github_job_runs_the_fleet_commands(six: Path) -> None:
    workflow = github(six, "tasks/six.yaml", "--install", "pipx install coder==1.2")
    assert {"name": "Install coder", "run": "pipx install coder==1.2"} in workflow["jobs"]["a"][
        "steps"
    ]
    assert commands_of(workflow, "d") == [
        [
            "coder", "worker", "--remote", "$(git remote get-url origin)", "--step", "d",
            "--taskfile", "$CODER_RUN_TASKFILE", "--base", "$CODER_BASE", "--run", "$CODER_RUN",
        ]
    ]  # fmt: skip
    run, push = commands_of(workflow, "coordinator")
    assert run == [
        "coder", "run", "$CODER_RUN_TASKFILE", "--executor", "pushed", "--remote", "origin",
        "--autonomous",
    ]  # fmt: skip
    assert push == ["coder", "push", "-t", "$CODER_RUN", "--remote", "origin"]
    # `coder push` as written parses with today's CLI (coder worker and run --executor are
    # the fleet's; tests/fleet checks those)
    code, out, _ = coder(six, *push[1:], "--help")
    assert code == 0 and out.startswith("Usage:")


def test_the_runs_taskfile_is_the_repositorys_with_run_as_its_id(make_repo, tmp_path: Path) -> None:
    """The step every job runs before coder's commands, run here: its copy (for the worker and
    the coordinator alike) is the same DAG, id RUN, and starts where the checkout is, on a
    branch of its own; the steps after it are told where it is (GITHUB_ENV)."""
    text = SIX.replace("title:", "base: main\nbranch: agent/six\ntitle:")
    six = make_repo({"tasks/six.yaml": text})
    workflow = github(six)
    script = step_named(workflow["jobs"]["coordinator"], "Name the run")["run"]
    assert step_named(workflow["jobs"]["f"], "Name the run")["run"] == script
    assert exporting.WITH_RUN_ID in script
    out, github_env = tmp_path / "coder-task.yaml", tmp_path / "github_env"
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "CODER_TASKFILE": "tasks/six.yaml",
        "CODER_RUN": "six-steps-123456789",
        "RUNNER_TEMP": str(tmp_path),
        "GITHUB_ENV": str(github_env),
    }
    subprocess.run(["bash", "-e", "-c", script], cwd=six, env=env, check=True)
    assert github_env.read_text() == f"CODER_RUN_TASKFILE={out}\n"
    copy, original = taskfile.load(out), taskfile.load(six / "tasks/six.yaml")
    assert copy.id == "six-steps-123456789" and original.base == "main"
    assert copy.base is None and copy.branch.startswith("agent/six-steps-123456789-")
    assert copy.steps == original.steps and copy.title == original.title


def test_the_argo_workflow_validates_and_its_dependencies_are_the_dag(six: Path) -> None:
    text = argo(six, "tasks/six.yaml", "--remote", "https://git.example/team/six.git")
    # hera's models parse it back whole (pydantic: every field typed and checked)
    document = yaml.safe_load(text)
    model = argo_models.Workflow.model_validate(document)
    assert model.kind == "Workflow" and model.api_version == "argoproj.io/v1alpha1"
    edges, last = argo_edges(text)
    assert edges == dag_of(SIX)
    assert last == ["a", "b", "c", "d", "e", "f"]
    assert document["metadata"] == {"generateName": "six-steps-"}
    params = {p["name"]: p.get("value") for p in document["spec"]["arguments"]["parameters"]}
    assert params == {
        "repo": "https://git.example/team/six.git",
        "branch": "main",
        "base": None,  # given at submit: the commit every task starts from
        "ollama-host": None,
        "model": "",
    }
    templates = {t["name"]: t for t in document["spec"]["templates"]}
    worker = templates["worker"]["container"]
    assert worker["image"] == "python:3.11" and worker["command"] == ["sh", "-c"]
    script = worker["args"][0]
    assert exporting.WITH_RUN_ID in script  # the run's taskfile, as on GitHub
    assert script.splitlines()[-1] == (
        'coder worker --remote "$CODER_REPO" --step "$CODER_STEP" --taskfile "$CODER_RUN_TASKFILE" '
        '--base "$CODER_BASE" --run "$CODER_RUN"'
    )
    env = {e["name"]: e["value"] for e in worker["env"]}
    assert env["CODER_RUN"] == "{{workflow.name}}"
    assert env["OLLAMA_HOST"] == "{{workflow.parameters.ollama-host}}"
    assert env["CODER_STEP"] == "{{inputs.parameters.step}}"
    land = templates["coordinator"]["container"]["args"][0]
    assert exporting.WITH_RUN_ID in land
    assert land.startswith("set -eu\n") and land.endswith(
        '\ncoder push -t "$CODER_RUN" --remote origin'
    )


def test_argo_without_remote_asks_for_it_at_submit_and_takes_the_image(six: Path) -> None:
    document = yaml.safe_load(argo(six, "tasks/six.yaml", "--image", "ghcr.io/team/coder:1"))
    [repo] = [p for p in document["spec"]["arguments"]["parameters"] if p["name"] == "repo"]
    assert repo == {"name": "repo"}
    assert {t["container"]["image"] for t in document["spec"]["templates"] if "container" in t} == {
        "ghcr.io/team/coder:1"
    }


def test_step_ids_that_are_no_job_names_are_mapped_and_stay_unique(make_repo) -> None:
    repo = make_repo({"tasks/odd.yaml": ODD})
    dag = dag_of(ODD)
    workflow = github(repo, "tasks/odd.yaml")
    jsonschema.Draft7Validator(github_schema()).validate(workflow)
    names = {job: spec["name"].removeprefix("step ") for job, spec in workflow["jobs"].items()}
    names.pop("coordinator")
    assert names == {
        "build-3": "Build",  # `build` and `build-2` are steps' own ids: they keep them
        "build": "build",
        "fix_login": "fix_login",
        "fix-login": "fix-login",
        "coordinator-2": "coordinator",
        "worker": "worker",
        "build-2": "build-2",
    }
    job_of = {sid: job for job, sid in names.items()}
    assert github_edges(workflow) == {
        job_of[sid]: [job_of[d] for d in deps] for sid, deps in dag.items()
    }
    assert len({job.lower() for job in workflow["jobs"]}) == len(workflow["jobs"])

    text = argo(repo, "tasks/odd.yaml")
    edges, _ = argo_edges(text)
    tasks = yaml.safe_load(text)["spec"]["templates"][-1]["dag"]["tasks"]
    step_of = {
        t["name"]: t["arguments"]["parameters"][0]["value"] for t in tasks if "arguments" in t
    }
    assert all(ARGO_TASK.fullmatch(name) for name in step_of)
    assert sorted(step_of.values()) == sorted(dag)  # one task per step, names unique
    assert step_of["fix-login-2"] == "fix_login" and step_of["worker-2"] == "worker"
    task_of = {sid: name for name, sid in step_of.items()}
    assert edges == {task_of[sid]: [task_of[d] for d in deps] for sid, deps in dag.items()}


def test_job_names_keep_good_ids_and_number_the_rest() -> None:
    names = exporting.job_names(["A_b", "a_b", "a-b", "a-b-2"], "-", reserved=["a-b-3"])
    assert names == {"A_b": "a-b-4", "a_b": "a-b-5", "a-b": "a-b", "a-b-2": "a-b-2"}
    assert all(GITHUB_JOB.fullmatch(n) for n in exporting.job_names(["X.y", "Z"], "-_").values())


@pytest.mark.parametrize("target", ["github", "argo"])
def test_a_bad_taskfile_is_exit_2_and_nothing_is_written(make_repo, target: str) -> None:
    bad = SIX.replace("depends_on: [e]", "depends_on: [nope]")
    repo = make_repo({"tasks/bad.yaml": bad})
    code, out, err = export(repo, target, "tasks/bad.yaml", "-o", "wf.yaml")
    assert code == 2 and out == ""
    assert "tasks/bad.yaml:" in err and "nope" in err and "Traceback" not in err
    assert not (repo / "wf.yaml").exists()


def test_output_is_written_once_and_never_clobbered(six: Path) -> None:
    out = six / ".github" / "workflows" / "six.yaml"
    out.parent.mkdir(parents=True)
    code, stdout, err = export(six, "github", "-f", "tasks/six.yaml", "-o", str(out))
    assert code == 0 and stdout == "" and "written" in err
    first = out.read_text()
    assert yaml.safe_load(first) == github(six)
    # the same export again: nothing to do, exit 0
    code, _, err = export(six, "github", "-f", "tasks/six.yaml", "-o", str(out))
    assert code == 0 and "already up to date" in err and out.read_text() == first
    # another file there (an edit, another taskfile's export): kept, exit 2
    out.write_text("# mine\n")
    code, _, err = export(six, "github", "tasks/six.yaml", "-o", str(out), "--runs-on", "big")
    assert code == 2 and "differs" in err and "--force" in err
    assert out.read_text() == "# mine\n"
    code, _, _ = export(six, "argo", "tasks/six.yaml", "-o", str(out))
    assert code == 2 and out.read_text() == "# mine\n"
    code, stdout, _ = export(
        six, "github", "tasks/six.yaml", "-o", str(out), "--runs-on", "big", "--force", "--json"
    )
    assert code == 0 and json.loads(stdout) == {
        "target": "github",
        "file": str(out),
        "written": True,
        "steps": 6,
    }
    assert yaml.safe_load(out.read_text())["jobs"]["a"]["runs-on"] == "big"


def test_usage_errors(six: Path, tmp_path: Path) -> None:
    for args, message in [
        (["github"], "pass the taskfile once"),
        (["github", "tasks/six.yaml", "-f", "tasks/six.yaml"], "pass the taskfile once"),
        (["github", "tasks/six.yaml", "--image", "x"], "--image is Argo's"),
        (["argo", "tasks/six.yaml", "--runs-on", "x"], "--runs-on is GitHub's"),
        (["gitlab", "tasks/six.yaml"], "'gitlab' is not one of 'github', 'argo'"),
        (["github", "tasks/six.yaml", "--install", " "], "--install is empty"),
        (["github", "tasks/six.yaml", "--remote", "https://h/r.git"], "name it (origin"),
        (["argo", "tasks/six.yaml", "--remote", "origin"], "an Argo container clones a URL"),
    ]:
        code, _, err = export(six, *args)
        assert code == 2 and message in err, (args, err)
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "six.yaml").write_text(SIX)
    code, _, err = export(six, "github", str(outside / "six.yaml"))
    assert code == 2 and "is not in a git repository" in err
    (six / "tasks" / "link.yaml").symlink_to(outside / "six.yaml")
    code, _, err = export(six, "github", "tasks/link.yaml")
    assert code == 2 and "is outside the repository" in err


def test_argo_without_hera_names_the_extra(six: Path) -> None:
    """In a process where hera cannot be imported: exit 3, the extra named, no traceback;
    `github` works there all the same (hera is imported only for Argo)."""
    program = (
        "import sys; sys.modules['hera'] = None; sys.argv[0] = 'coder'; "
        "from coder.cli import main; main()"
    )
    run = [sys.executable, "-c", program, "export"]
    found = subprocess.run(
        [*run, "argo", "tasks/six.yaml"], cwd=six, capture_output=True, text=True
    )
    assert found.returncode == 3, found.stderr
    assert "pip install 'coder[argo]'" in found.stderr and "Traceback" not in found.stderr
    found = subprocess.run(
        [*run, "github", "tasks/six.yaml"], cwd=six, capture_output=True, text=True
    )
    assert found.returncode == 0, found.stderr  # an import of hera there would have failed
    assert yaml.safe_load(found.stdout)["jobs"]["coordinator"]
