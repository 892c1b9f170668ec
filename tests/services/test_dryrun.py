"""`coder run --dry-run` (the plan, each command with the policy's decision, the model and its
context window; nothing written) and `coder run -t ID` (a taskfile in tasks/ by its id)."""

from __future__ import annotations

import json
from pathlib import Path

from tests.conftest import coder, git
from tests.helpers import snapshot, taskfile

MIXED = """
    id: mixed
    title: Mixed steps
    graph:
      - {id: look, kind: analyze, goal: Read the code}
      - {id: make, kind: shell, cmd: "mkdir -p out && echo hi > out/hi.txt"}
      - {id: fetch, kind: shell, cmd: "curl -s https://example.com -o page.html"}
      - {id: check, kind: test, cmd: "python -m pytest -q"}
"""
SHELL_ONLY = """
    id: plain
    title: Shell only
    graph:
      - {id: a, kind: shell, cmd: "echo a > a.txt", depends_on: []}
      - {id: b, kind: shell, cmd: "echo b > b.txt", depends_on: []}
      - {id: c, kind: shell, cmd: "cat a.txt b.txt > c.txt", depends_on: [a, b]}
"""


def everything_git_knows(repo: Path) -> dict[str, str]:
    return {
        "refs": git(repo, "for-each-ref"),
        "worktrees": git(repo, "worktree", "list", "--porcelain"),
        "status": git(repo, "status", "--porcelain", "--ignored"),
        "exclude": (repo / ".git" / "info" / "exclude").read_text(),
        "config": (repo / ".git" / "config").read_text(),
    }


def test_dry_run_judges_every_command_and_changes_nothing(make_repo) -> None:
    repo = make_repo({"README.md": "# x\n", "coder.config.json": '{"num_ctx": 16384}\n'})
    path = taskfile(repo, MIXED)
    before, git_before = snapshot(repo), everything_git_knows(repo)

    code, out, err = coder(repo, "run", "--dry-run", "-f", str(path))

    assert code == 2, out + err  # curl: the network is off, so the run would be refused
    assert "Dry run of mixed: Mixed steps" in out
    assert "branch    agent/mixed-mixed-steps (from main)" in out
    assert "model     qwen2.5-coder:7b at http://127.0.0.1:11434" in out
    assert "context   16384 tokens (num_ctx from project file" in out
    assert "network   off for commands" in out
    lines = out.splitlines()
    assert "  make   allowed  mkdir -p out && echo hi > out/hi.txt" in lines
    assert "  check  allowed  python -m pytest -q" in lines
    at = lines.index("  fetch  REFUSED  curl -s https://example.com -o page.html")
    assert lines[at + 1].startswith(
        "                  command refused: `curl` is a network program"
    )
    assert "The run would be refused. Nothing was changed:" in out
    assert any(line.startswith("  step fetch: command refused: `curl` is a net") for line in lines)
    # a real run refuses the same command with the same words (one policy check)
    code, run_out, run_err = coder(repo, "run", "--autonomous", "-f", str(path))
    assert code == 2 and "step fetch: command refused: `curl` is a network program" in run_err
    # nothing written: no .coder/, no branch, no worktree, the checkout as it was
    assert not (repo / ".coder").exists()
    assert snapshot(repo) == before and everything_git_knows(repo) == git_before


def test_dry_run_of_a_runnable_taskfile_exits_0_and_prints_json(repo: Path) -> None:
    path = taskfile(repo, SHELL_ONLY)
    code, out, err = coder(repo, "run", "--dry-run", "-f", str(path))
    assert code == 0, out + err
    assert "model     none (no step asks a model)" in out
    assert "level 1  (may run in parallel)\n  a  shell    run `echo a > a.txt`\n" in out
    assert "  c  shell    run `cat a.txt b.txt > c.txt`  <- a, b" in out
    assert out.rstrip().endswith("The run would start. Nothing was changed.")

    code, out, err = coder(repo, "run", "--dry-run", "-f", str(path), "--json")
    assert code == 0, err
    plan = json.loads(out)
    assert plan["would_start"] is True and plan["problems"] == []
    assert plan["levels"] == [["a", "b"], ["c"]]
    assert plan["commands"][2] == {
        "step": "c",
        "cmd": "cat a.txt b.txt > c.txt",
        "decision": "allowed",
        "reason": None,
    }
    assert plan["model"] is None and plan["network"] is False and plan["sandbox"] is True
    code, out, _ = coder(repo, "run", "--dry-run", "--no-sandbox", "-f", str(path))
    assert code == 0 and "sandbox   off: commands run unconfined" in out
    assert not (repo / ".coder").exists()
    assert git(repo, "branch", "--list", "agent/*") == ""


def test_dry_run_says_when_the_run_exists_and_how_the_model_answers(repo: Path) -> None:
    path = taskfile(repo, SHELL_ONLY)
    assert coder(repo, "run", "--autonomous", "-f", str(path))[0] == 0
    code, out, _ = coder(repo, "run", "--dry-run", "-f", str(path))
    assert code == 2
    assert "a run of task plain already exists (coder resume -t plain)" in out
    assert "branch agent/plain-shell-only already exists" in out

    analyze = taskfile(repo, "title: Look\ngraph:\n  - {kind: analyze, goal: Read}\n", "look.yaml")
    code, out, _ = coder(
        repo, "run", "--dry-run", "-f", str(analyze), "--replay", "rec.json", "--model", "m:1b"
    )
    assert code == 0, out
    assert "model     m:1b replayed from rec.json" in out
    assert "context   the model's own, capped at 32768 tokens (max_num_ctx)" in out


def test_dry_run_names_the_server_of_an_openai_or_a_named_model(
    repo: Path, isolated_home: Path
) -> None:
    config = isolated_home / ".config" / "coder" / "config.json"
    config.parent.mkdir(parents=True, exist_ok=True)
    big = {"provider": "openai", "base_url": "http://127.0.0.1:8000/v1", "model": "qwen-32b"}
    config.write_text(
        json.dumps(
            {
                "provider": "openai",
                "base_url": ["http://127.0.0.1:8080/v1", "http://127.0.0.1:8081/v1"],
                "model": "qwen-7b",
                "models": {"big": big},
            }
        )
    )
    analyze = "title: Look\ngraph:\n  - {kind: analyze, goal: Read}\n"
    code, out, _ = coder(repo, "run", "--dry-run", "-f", str(taskfile(repo, analyze)))
    assert code == 0, out
    assert "model     qwen-7b at http://127.0.0.1:8080/v1, http://127.0.0.1:8081/v1" in out
    assert "context   the server's (`coder doctor` reads it)" in out
    on_big = taskfile(repo, "model: big\n" + analyze, "big.yaml")
    code, out, _ = coder(repo, "run", "--dry-run", "-f", str(on_big), "--json")
    model = json.loads(out)["model"]
    assert (model["name"], model["provider"], model["host"]) == (
        "qwen-32b",
        "openai",
        "http://127.0.0.1:8000/v1",
    )


def test_run_by_task_id_from_tasks_dir(make_repo) -> None:
    repo = make_repo(
        {
            "README.md": "# x\n",
            "tasks/first.yaml": "id: one\ntitle: First\ngraph:\n  - {kind: shell, cmd: echo 1 > one.txt}\n",
            "tasks/second.yml": "title: Second\ngraph:\n  - {kind: shell, cmd: echo 2 > two.txt}\n",
            # `coder plan` leaves failed drafts beside the taskfiles: never a match
            "tasks/one.draft.yaml": "id: one\ntitle: Draft\ngraph: []\n",
            "tasks/broken.yaml": "id: [unclosed\n",
        }
    )
    code, out, err = coder(repo, "run", "--autonomous", "-t", "one")
    assert code == 0, out + err
    assert "Taskfile " in err and "tasks/first.yaml" in err
    assert git(repo, "show", "agent/one-first:one.txt") == "1\n"
    # a taskfile without an id is found by its name
    code, out, err = coder(repo, "run", "--dry-run", "-t", "second")
    assert code == 0 and "Dry run of second: Second" in out  # named after its file

    code, out, err = coder(repo, "run", "--autonomous", "-t", "nope")
    assert code == 2
    assert "no taskfile in" in err and "has the id 'nope' (ids there: one, second)" in err

    code, _, err = coder(repo, "run", "--autonomous", "-t", "one", "-f", "tasks/first.yaml")
    assert code == 2 and "exactly one of -f FILE or -t ID" in err


def test_run_by_task_id_refuses_two_files_with_that_id(make_repo) -> None:
    body = "id: twin\ntitle: T\ngraph:\n  - {kind: shell, cmd: echo}\n"
    repo = make_repo({"tasks/a.yaml": body, "tasks/b.yaml": body})
    code, _, err = coder(repo, "run", "--autonomous", "-t", "twin")
    assert code == 2
    assert "several taskfiles in tasks/ have the id 'twin': tasks/a.yaml, tasks/b.yaml" in err
    assert git(repo, "branch", "--list", "agent/*") == ""


def test_dry_run_shows_a_steps_own_model_and_fallback(repo: Path) -> None:
    path = taskfile(
        repo,
        """
        title: Models
        model: m:7b
        fallback_model: m:14b
        graph:
          - {id: s1, kind: analyze, goal: Read}
          - {id: s2, kind: edit, goal: Change, model: "m:1b", depends_on: [s1]}
          - {id: s3, kind: doc, goal: Write, fallback_model: big, depends_on: [s2]}
          - {id: s4, kind: shell, cmd: "true", depends_on: [s3]}
        """,
    )
    code, out, _ = coder(repo, "run", "--dry-run", "-f", str(path))
    assert code == 0, out
    assert "fallback  m:14b (from a step's third attempt)" in out
    lines = {line.split()[0]: line for line in out.splitlines() if line.startswith("  s")}
    assert lines["s1"].endswith("analyze  Read")  # the task's models: nothing to add
    assert lines["s2"].endswith("Change  <- s1  [model m:1b]")
    assert lines["s3"].endswith("Write  <- s2  [fallback_model big]")
    code, out, _ = coder(repo, "run", "--dry-run", "-f", str(path), "--json")
    steps = {s["id"]: s for s in json.loads(out)["steps"]}
    assert [(steps[s]["model"], steps[s]["fallback_model"]) for s in steps] == [
        ("m:7b", "m:14b"),
        ("m:1b", "m:14b"),
        ("m:7b", "big"),
        (None, None),
    ]
