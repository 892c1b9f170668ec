"""The canary: secrets a run knows of (a `.env` value, a passed-through variable, a step's
`env:` value) appear nowhere under `.coder/` after a run whose commands print all three, and
what is there is readable by its owner only."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

from tests.conftest import coder
from tests.helpers import call, done, state_of, taskfile

ENV_SECRET = "canary-env-Zq81xkP0"
PASSED_SECRET = "canary-pass-Yw72mmQ1"
STEP_SECRET = "canary-step-Xv63nnR2"
CANARIES = (ENV_SECRET, PASSED_SECRET, STEP_SECRET)


@pytest.fixture
def canary_repo(make_repo, isolated_home: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    repo = make_repo({".gitignore": ".env\n", "README.md": "# r\n"})
    (repo / ".env").write_text(f"DATABASE_URL=postgres://u@h/db\nAPI_PASSWORD={ENV_SECRET}\n")
    config = isolated_home / ".config" / "coder" / "config.json"
    config.parent.mkdir(parents=True)
    # the commands read the checkout's .env, which the user lets them see
    settings = {"env_passthrough": ["DEPLOY_HANDLE"], "visible_paths": [str(repo / ".env")]}
    config.write_text(json.dumps(settings))
    monkeypatch.setenv("DEPLOY_HANDLE", PASSED_SECRET)  # a name that does not look secret
    return repo


def test_no_secret_reaches_anything_under_coder(canary_repo: Path, fake) -> None:
    repo = canary_repo
    fake.enqueue(
        call("shell_run", cmd="cut -d= -f2 ../../../.env; echo $DEPLOY_HANDLE"),
        done("printed them"),
    )
    path = taskfile(
        repo,
        f"""
        id: canary
        title: print every secret
        graph:
          - id: s1
            kind: shell
            cmd: >-
              cut -d= -f2 ../../../.env; echo "$DEPLOY_HANDLE"; echo "$API_TOKEN";
              test ${{#API_TOKEN}} = {len(STEP_SECRET)} && echo the-command-saw-it
            env: {{API_TOKEN: {STEP_SECRET}}}
          - {{id: s2, kind: custom, goal: print them again}}
        """,
    )
    code, out, err = coder(repo, "run", "--autonomous", "-f", str(path))
    assert code == 0, out + err
    log = (repo / ".coder" / "artifacts" / "canary" / "s1-attempt1.log").read_text()
    assert "the-command-saw-it" in log and log.count("[REDACTED") >= 3
    transcript = json.dumps(fake.chat_bodies())
    assert "[REDACTED" in transcript
    coder_dir = repo / ".coder"
    for file in coder_dir.rglob("*"):
        if file.is_file() and "worktrees" not in file.parts:
            data = file.read_bytes()
            for canary in CANARIES:
                assert canary.encode() not in data, (canary, file)
    for canary in CANARIES:
        where = transcript.find(canary)
        assert where < 0, transcript[max(0, where - 400) : where + 50]
        assert canary not in out + err
    assert stat.S_IMODE(coder_dir.stat().st_mode) == 0o700
    for sub in ("artifacts", "logs", "state", "tasks"):
        assert stat.S_IMODE((coder_dir / sub).stat().st_mode) == 0o700
    for file in (coder_dir / "artifacts").rglob("*"):
        if file.is_file():
            assert stat.S_IMODE(file.stat().st_mode) == 0o600, file
    assert stat.S_IMODE((coder_dir / "logs" / "canary.jsonl").stat().st_mode) == 0o600


def test_resume_reads_secret_env_values_back_from_the_taskfile(canary_repo: Path) -> None:
    repo = canary_repo
    path = taskfile(
        repo,
        f"""
        id: again
        title: t
        graph:
          - id: s1
            kind: shell
            cmd: test -f "$(git rev-parse --git-dir)/go" && test ${{#API_TOKEN}} = {len(STEP_SECRET)}
            env: {{API_TOKEN: {STEP_SECRET}, MODE: plain}}
        """,
    )
    assert coder(repo, "run", "--autonomous", "-f", str(path))[0] == 1
    manifest = json.loads((repo / ".coder" / "tasks" / "again.json").read_text())
    assert manifest["task"]["graph"][0]["env"] == {
        "API_TOKEN": "[REDACTED:step_env]",
        "MODE": "plain",
    }
    assert STEP_SECRET not in json.dumps(state_of(repo, "again"))
    (repo / ".git" / "worktrees" / "again" / "go").write_text("")
    code, out, err = coder(repo, "resume", "-t", "again")
    assert code == 0, out + err  # the command got the real value back from the taskfile
    assert state_of(repo, "again")["status"] == "success"
