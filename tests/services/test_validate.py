"""`coder validate` applies `coder run`'s own checks (the policy on every command, with the
effective config): a taskfile that validates can start."""

from __future__ import annotations

import json
from pathlib import Path

from coder import config
from tests.conftest import coder
from tests.helpers import taskfile

REFUSED = """
    title: t
    graph:
      - kind: shell
        cmd: curl -s http://example.com
      - kind: shell
        cmd: frobnicate --all
"""


def test_validate_refuses_what_run_would_refuse_with_positions(repo: Path) -> None:
    path = taskfile(repo, REFUSED)
    code, out, _ = coder(repo, "validate", "-f", str(path))
    assert code == 2
    assert out.splitlines() == [
        f"{path}:4:10: graph[0].cmd (step s1): command refused: `curl` is a network program and "
        "the network is off (set allow_network: true and add it to allowed_commands in "
        "coder.config.json to allow it)",
        f"{path}:6:10: graph[1].cmd (step s2): command refused: `frobnicate` is not in "
        "allowed_commands (add it to allowed_commands in coder.config.json)",
    ]
    code, out, _ = coder(repo, "validate", "-f", str(path), "--json")
    assert code == 2 and [p["path"] for p in json.loads(out)["problems"]] == [
        "$.graph[0].cmd",
        "$.graph[1].cmd",
    ]
    # and run refuses the same taskfile the same way
    code, _, err = coder(repo, "run", "--autonomous", "-f", str(path))
    assert code == 2 and "step s1: command refused: `curl`" in err


def test_validate_uses_the_effective_config(repo: Path) -> None:
    path = taskfile(repo, "title: t\ngraph:\n  - {kind: shell, cmd: 'frobnicate > out.txt'}\n")
    assert coder(repo, "validate", "-f", str(path))[0] == 2
    user = config.user_config_path()  # the user's own config is trusted; a repository's is not
    user.parent.mkdir(parents=True, exist_ok=True)
    user.write_text('{"allowed_commands": ["frobnicate"]}')
    code, out, _ = coder(repo, "validate", "-f", str(path))
    assert code == 0, out
    assert out == f"{path}: valid (1 step in 1 level)\n"


def test_a_test_step_without_a_test_command_is_reported_at_the_step(repo: Path) -> None:
    path = taskfile(repo, "title: t\ngraph:\n  - kind: test\n")
    code, out, _ = coder(repo, "validate", "-f", str(path))
    assert code == 2
    assert out.startswith(f"{path}:3:5: graph[0] (step s1): no test command could be found in ")


def test_outside_a_repository_the_file_alone_is_checked(tmp_path: Path) -> None:
    path = tmp_path / "task.yaml"
    path.write_text("title: t\ngraph:\n  - kind: test\n")
    code, out, _ = coder(tmp_path, "validate", "-f", str(path))
    assert code == 0, out


BASH_ENV_STEP = """
    id: envx
    title: t
    graph:
      - kind: shell
        cmd: echo hi
        env:
          LANG: C.UTF-8
          PYTHONPATH: src
          BASH_ENV: ./evil.sh
      - kind: shell
        cmd: echo hi
        env: {LD_PRELOAD: ./x.so, GIT_DIR: ../../.., NODE_OPTIONS: --require ./x.js}
"""


def test_a_step_env_that_runs_code_is_refused_at_its_line(make_repo) -> None:
    """`env: {BASH_ENV: ./evil.sh}` made bash run evil.sh before `echo hi`, a program the
    allowlist refuses included; validate and run refuse it, naming the variable."""
    repo = make_repo({"evil.sh": "whoami > pwned\n"})
    path = taskfile(repo, BASH_ENV_STEP)
    code, out, _ = coder(repo, "validate", "-f", str(path))
    assert code == 2
    assert out.splitlines() == [
        f"{path}:9:7: graph[0].env.BASH_ENV (step s1): BASH_ENV cannot be set in a step's env: "
        "it makes the shell, the loader, git or a runtime run code that the allowlist never "
        "sees (remove BASH_ENV from the step's env; run what it would load as a command of its "
        "own)",
        *(
            f"{path}:12:{col}: graph[1].env.{name} (step s2): {name} cannot be set in a step's "
            "env: it makes the shell, the loader, git or a runtime run code that the allowlist "
            f"never sees (remove {name} from the step's env; run what it would load as a "
            "command of its own)"
            for col, name in ((11, "LD_PRELOAD"), (31, "GIT_DIR"), (50, "NODE_OPTIONS"))
        ),
    ]
    code, _, err = coder(repo, "run", "--autonomous", "-f", str(path))
    assert code == 2 and "step s1: BASH_ENV cannot be set in a step's env" in err
    assert "(and 3 more refusals)" in err
    assert not (repo / ".coder" / "tasks").exists() and not (repo / "pwned").exists()


def test_a_step_env_that_runs_code_is_refused_outside_a_repository(tmp_path: Path) -> None:
    path = tmp_path / "task.yaml"
    path.write_text("title: t\ngraph:\n  - {kind: shell, cmd: echo hi, env: {PS4: '$(x)'}}\n")
    code, out, _ = coder(tmp_path, "validate", "-f", str(path))
    assert code == 2
    assert out.startswith(f"{path}:3:39: graph[0].env.PS4 (step s1): PS4 cannot be set in")
