"""Secrets everywhere text leaves: a run that meets an AWS key id and a GitHub token written in
its taskfile, a passed-through variable and a `.env` value (in file contents, in file names
made by a step, in the taskfile's `cmd`, `goal` and `title`) leaves none of them in any request
the model server received, any file under `.coder/` (state, manifest, logs, artifacts, cache),
any commit message, or what `report`, `diff`, `show`, `status` and `logs` print. The command
still runs with the real values, also when resumed."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from tests.conftest import coder, git
from tests.helpers import call, done, state_of, taskfile

AWS = "AKIAQX7RZ3KD2PL5MWN8"
GITHUB = "ghp_" + "R8d2Kq7LmZ0xWv3Ny5Tb9Hc1Jf6Gs4Pa2Qe8"
PASSED = "canary-pass-Yw72mmQ1"
ENV = "canary-env-Zq81xkP0"
SECRETS = (AWS, GITHUB, PASSED, ENV)


@pytest.fixture
def planted(make_repo, isolated_home: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    repo = make_repo(
        {
            ".gitignore": ".env\n",
            "README.md": "# r\n",
            # a tracked file holding the passed-through value in a definition's first line
            "deploy.py": f'def deploy_handle(handle="{PASSED}"):\n    return handle\n',
            f"docs/{PASSED}.md": "# how the deploy handle is kept\n",  # a name in the repo map
        }
    )
    (repo / ".env").write_text(f"DATABASE_URL=postgres://u@h/db\nAPI_PASSWORD={ENV}\n")
    config = isolated_home / ".config" / "coder" / "config.json"
    config.parent.mkdir(parents=True)
    # the commands read the checkout's .env, which the user lets them see
    settings = {"env_passthrough": ["DEPLOY_HANDLE"], "visible_paths": [str(repo / ".env")]}
    config.write_text(json.dumps(settings))
    monkeypatch.setenv("DEPLOY_HANDLE", PASSED)  # a name that does not look secret
    return repo


def _leaks(text: str) -> list[str]:
    return [s for s in SECRETS if s in text]


def _outputs(repo: Path, task_id: str, path: Path) -> dict[str, str]:
    """What every command that looks at a run or its taskfile prints."""
    commands = {
        "show -f": ("show", "-f", str(path)),
        "show -f --json": ("show", "-f", str(path), "--json"),
        "show -f --graph": ("show", "-f", str(path), "--graph"),
        "show -f dot": ("show", "-f", str(path), "--format", "dot"),
        "run --dry-run": ("run", "--dry-run", "-f", str(path)),
        "run --dry-run --json": ("run", "--dry-run", "-f", str(path), "--json"),
        "report": ("report", "-t", task_id),
        "report json": ("report", "-t", task_id, "--format", "json"),
        "diff": ("diff", "-t", task_id),
        "diff --stat": ("diff", "-t", task_id, "--stat"),
        "show": ("show", "-t", task_id),
        "show --json": ("show", "-t", task_id, "--json"),
        "show --graph": ("show", "-t", task_id, "--graph"),
        "show mermaid": ("show", "-t", task_id, "--format", "mermaid"),
        "show dot": ("show", "-t", task_id, "--format", "dot"),
        "status": ("status",),
        "status --json": ("status", "--json"),
        "logs": ("logs", "-t", task_id),
        "logs --json": ("logs", "-t", task_id, "--json"),
    }
    found = {}
    for name, args in commands.items():
        code, out, err = coder(repo, *args)
        assert code == (2 if "dry-run" in name else 0), (name, out, err)  # the run exists
        found[name] = out + err
    return found


def test_no_secret_leaves_a_run_anywhere(planted: Path, fake) -> None:
    repo = planted
    fake.enqueue(
        call("shell_run", cmd="ls; echo $DEPLOY_HANDLE"),
        call("fs_read", path=f"{PASSED}.txt"),
        done("looked at the deploy handle configuration"),
    )
    path = taskfile(
        repo,
        f"""
        id: leaky
        title: rotate {AWS}
        graph:
          - id: s1
            kind: shell
            cmd: >-
              echo "Authorization: Bearer {GITHUB}" > /dev/null; echo {ENV} > /dev/null;
              printf 'deploy handle configuration\\n' > "$DEPLOY_HANDLE.txt";
              printf 'deploy handle configuration\\n'
              > "$(sed -n 's/^API_PASSWORD=//p' ../../../.env).txt";
              printf 'deploy handle configuration\\n' > {AWS}.txt;
              python -c "import hashlib as h,sys; print(h.sha256(sys.argv[1].encode()).hexdigest())"
              {GITHUB} > digest.txt
          - id: s2
            kind: custom
            goal: look at the deploy handle configuration (key {AWS}, handle {PASSED})
            depends_on: [s1]
        """,
    )
    code, out, err = coder(repo, "run", "--autonomous", "-f", str(path))
    assert code == 0, out + err
    assert not _leaks(out + err)
    worktree = repo / ".coder" / "worktrees" / "leaky"
    # the command ran with the real values: the files it named after them, the token's digest
    for secret in (PASSED, ENV, AWS):
        assert (worktree / f"{secret}.txt").is_file(), secret
    digest = (worktree / "digest.txt").read_text().strip()
    assert digest == hashlib.sha256(GITHUB.encode()).hexdigest()

    # every request the model server received (warm-up, warm prefix, every turn)
    bodies = json.dumps(fake.chat_bodies())
    assert "[REDACTED" in bodies
    for secret in SECRETS:
        where = bodies.find(secret)
        assert where < 0, (secret, bodies[max(0, where - 300) : where + 50])
    # the first message of s2 names the files it likely works on, their names redacted
    first = [
        m["content"]
        for b in fake.chat_bodies()
        for m in b.get("messages", [])
        if m["role"] == "user" and m["content"].startswith("Step s2")
    ]
    assert first and "Likely relevant code" in first[0], first
    assert "[REDACTED" in first[0]

    # every file coder keeps: state, manifest, logs, artifacts, the context cache
    cache = repo / ".coder" / "cache"
    assert any(p.is_file() for p in cache.rglob("*")), "the context cache was not written"
    for file in (repo / ".coder").rglob("*"):
        if file.is_file() and "worktrees" not in file.parts:
            data = file.read_bytes()
            for secret in SECRETS:
                assert secret.encode() not in data, (secret, file)

    # commit messages, through the git CLI
    messages = git(repo, "log", "--all", "--format=%B")
    assert "Step s1" in messages and not _leaks(messages), messages

    for name, text in _outputs(repo, "leaky", path).items():
        assert not _leaks(text), (name, _leaks(text), text[:2000])
    report = coder(repo, "report", "-t", "leaky")[1]
    assert report.count("[REDACTED") >= 3  # the three file names (and the title)


def test_a_literal_secret_in_a_cmd_is_stored_redacted_and_resume_runs_the_real_one(
    planted: Path,
) -> None:
    repo = planted
    path = taskfile(
        repo,
        f"""
        id: again
        title: t
        graph:
          - id: s1
            kind: shell
            cmd: >-
              test -f "$(git rev-parse --git-dir)/go" &&
              test "$(printf %s {GITHUB} | wc -c)" = {len(GITHUB)} &&
              echo "Authorization: Bearer {GITHUB}" > /dev/null
        """,
    )
    assert coder(repo, "run", "--autonomous", "-f", str(path))[0] == 1
    manifest = (repo / ".coder" / "tasks" / "again.json").read_text()
    assert GITHUB not in manifest and "[REDACTED:github_token]" in manifest
    assert GITHUB not in json.dumps(state_of(repo, "again"))
    show = coder(repo, "show", "-t", "again", "--json")[1]
    assert GITHUB not in show and "[REDACTED:github_token]" in show
    (repo / ".git" / "worktrees" / "again" / "go").write_text("")
    code, out, err = coder(repo, "resume", "-t", "again")
    assert code == 0, out + err  # the command got the real token back from the taskfile
    assert state_of(repo, "again")["status"] == "success"
    assert not _leaks(git(repo, "log", "--all", "--format=%B"))


def test_resume_refuses_when_the_taskfile_lost_a_redacted_value(planted: Path) -> None:
    repo = planted
    text = f"""
        id: lost
        title: t
        graph:
          - id: s1
            kind: shell
            cmd: test -f "$(git rev-parse --git-dir)/go" && echo {GITHUB} > /dev/null
        """
    path = taskfile(repo, text)
    assert coder(repo, "run", "--autonomous", "-f", str(path))[0] == 1
    (repo / ".git" / "worktrees" / "lost" / "go").write_text("")
    path.write_text(path.read_text().replace("echo", "printf"))  # not the command that ran
    code, out, err = coder(repo, "resume", "-t", "lost")
    assert code == 2, out + err
    assert "step s1: its " in err and "holds a secret" in err and str(path) in err
    path.unlink()
    code, out, err = coder(repo, "resume", "-t", "lost")
    assert code == 2 and "holds a secret" in err, out + err
    assert not _leaks(out + err)
    taskfile(repo, text.replace(GITHUB, "ghp_" + "0" * 36))  # a token rotated meanwhile
    code, out, err = coder(repo, "resume", "-t", "lost")
    assert code == 0, out + err  # the taskfile's value stands where the run kept a marker


def test_what_names_the_run_is_never_redacted(tmp_path: Path) -> None:
    """Ids, branch, models and dependencies stay as written (they name files, refs and
    edges), whatever the redactor knows; the free text around them is redacted."""
    from coder import taskfile as taskfile_mod
    from coder.redact import Redactor
    from coder.run.secrets import restore, stored_task

    path = tmp_path / "t.yaml"
    path.write_text(
        "id: build7x\ntitle: build7x with " + AWS + "\nbranch: agent/build7x\n"
        "graph:\n  - {id: build7x, kind: shell, cmd: echo build7x " + GITHUB + "}\n"
        "  - {id: s2, kind: shell, cmd: 'true', depends_on: [build7x], env: {MODE: build7x}}\n"
    )
    task = taskfile_mod.load(path)
    stored = stored_task(task.to_dict(), Redactor(["build7x"]))
    assert (stored["id"], stored["branch"]) == ("build7x", "agent/build7x")
    assert [s["id"] for s in stored["graph"]] == ["build7x", "s2"]
    assert stored["graph"][1]["depends_on"] == ["build7x"]
    assert stored["title"] == "[REDACTED:known_secret] with [REDACTED:aws_access_key_id]"
    assert stored["graph"][0]["cmd"] == "echo [REDACTED:known_secret] [REDACTED:github_token]"
    assert stored["graph"][1]["env"] == {"MODE": "[REDACTED:known_secret]"}
    assert taskfile_mod.from_dict(restore(stored, str(path))) == task
