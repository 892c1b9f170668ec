"""Resume and an edited taskfile: never silently. Without a choice resume refuses, naming what
changed and both ways on, changing nothing (at a terminal it asks); --ignore-edits keeps the
run's own copy and says so; --taskfile runs the new version for the steps not yet done,
provided the done steps are unchanged (else resume refuses naming the step, changing
nothing)."""

from __future__ import annotations

import json
from pathlib import Path

from coder.errors import EXIT_FAILED, EXIT_USAGE
from coder.redact import Redactor
from coder.run import amend
from coder.run.manifest import read_manifest
from coder.run.records import RunState
from coder.run.state import StateStore
from tests.conftest import coder
from tests.helpers import state_of, step_commits, taskfile

TASK = """
    id: ed
    title: fix a step and go on
    graph:
      - {id: s1, kind: shell, cmd: "echo one > one.txt"}
      - {id: s2, kind: shell, cmd: "false"}
      - {id: s3, kind: shell, cmd: "echo three > three.txt"}
"""
BRANCH = "agent/ed-fix-a-step-and-go-on"


def failed_run(make_repo) -> tuple[Path, Path]:
    repo = make_repo()
    path = taskfile(repo, TASK)
    assert coder(repo, "run", "--autonomous", "-f", str(path))[0] == EXIT_FAILED
    return repo, path


def files(repo: Path) -> dict[str, bytes]:
    coder_dir = repo / ".coder"
    return {
        p.name: p.read_bytes()
        for p in [coder_dir / "tasks" / "ed.json", *coder_dir.glob("state/*")]
    }


def test_resume_refuses_an_edited_taskfile_until_told_which_version(make_repo) -> None:
    """The reproduction: fixing s2's cmd and resuming reran the old snapshot (103 s, exit 1),
    with a warning that did not say plainly what to do."""
    repo, path = failed_run(make_repo)
    path.write_text(path.read_text().replace('cmd: "false"', 'cmd: "echo two > two.txt"'))
    before = files(repo)
    code, out, err = coder(repo, "resume", "-t", "ed")
    assert code == EXIT_USAGE, out + err
    assert "the taskfile" in err and "changed since the run started (step s2 changed)" in err
    assert (
        "hint: take the new version for the steps not yet done: `coder resume -t ed "
        "--taskfile`; or go on with the run's own copy: `coder resume -t ed --ignore-edits`"
    ) in err
    assert files(repo) == before  # nothing ran, nothing changed

    code, out, err = coder(repo, "resume", "-t", "ed", "--ignore-edits")
    assert code == EXIT_FAILED, out + err  # the old s2 fails again, as asked
    assert "resuming with the run's own copy of the task" in err

    code, out, err = coder(repo, "resume", "-t", "ed", "--taskfile")
    assert code == 0, out + err
    assert "taking the new version for the steps not yet done" in err
    assert [c[0] for c in step_commits(repo, BRANCH)] == ["s1", "s2", "s3"]
    state = state_of(repo, "ed")
    assert state["steps"]["s1"]["attempts"] == 1  # done: never run again
    assert "its definition changed in task.yaml" in state["steps"]["s2"]["reasons"][-1]
    manifest = json.loads((repo / ".coder" / "tasks" / "ed.json").read_text())
    assert manifest["task"]["graph"][1]["cmd"] == "echo two > two.txt"
    assert "task" not in state  # the manifest's alone


def test_a_changed_done_step_is_refused_naming_it(make_repo) -> None:
    repo, path = failed_run(make_repo)
    before = files(repo)
    path.write_text(
        path.read_text()
        .replace('cmd: "false"', 'cmd: "true"')
        .replace('"echo one > one.txt"', '"echo uno > one.txt"')
    )
    code, out, err = coder(repo, "resume", "-t", "ed", "-f", str(path))
    assert code == EXIT_USAGE, out + err
    assert "step s1 of run ed is done (its commit " in err
    assert "the new version can only change steps not yet done" in err
    # s1 is the first step: there is nothing to roll back to before it
    assert "hint: undo the change to s1, or start again with `coder clean -t ed`" in err
    assert files(repo) == before


def test_a_changed_later_done_step_can_be_rolled_back_before(make_repo) -> None:
    repo = make_repo()
    path = taskfile(
        repo,
        TASK.replace(
            "      - {id: s1,",
            '      - {id: s0, kind: shell, cmd: "echo zero > zero.txt"}\n      - {id: s1,',
        ),
    )
    assert coder(repo, "run", "--autonomous", "-f", str(path))[0] == EXIT_FAILED
    path.write_text(path.read_text().replace('"echo one > one.txt"', '"echo uno > one.txt"'))
    code, out, err = coder(repo, "resume", "-t", "ed", "--taskfile")
    assert code == EXIT_USAGE, out + err
    assert (
        "hint: undo the change to s1, roll the run back before it with `coder revert -t ed "
        "--to-step STEP`, or start again with `coder clean -t ed`"
    ) in err


def test_another_file_adds_and_removes_steps_not_yet_done(make_repo, tmp_path: Path) -> None:
    repo, _ = failed_run(make_repo)
    other = tmp_path / "v2.yaml"
    other.write_text(
        "id: ed\ntitle: fix a step and go on\ngraph:\n"
        '  - {id: s1, kind: shell, cmd: "echo one > one.txt"}\n'
        '  - {id: s2b, kind: shell, cmd: "echo two > two.txt"}\n'
        '  - {id: s3, kind: shell, cmd: "echo three > three.txt"}\n'
    )
    code, out, err = coder(repo, "resume", "-t", "ed", "-f", str(other))
    assert code == 0, out + err
    assert "step s2 removed" in err and "step s2b added" in err
    assert [c[0] for c in step_commits(repo, BRANCH)] == ["s1", "s2b", "s3"]
    assert list(state_of(repo, "ed")["steps"]) == ["s1", "s2b", "s3"]


def test_a_run_keeps_its_branch(make_repo) -> None:
    repo, path = failed_run(make_repo)
    path.write_text(path.read_text().replace("id: ed\n", "id: ed\nbranch: agent/elsewhere\n"))
    code, out, err = coder(repo, "resume", "-t", "ed", "--taskfile")
    assert code == EXIT_USAGE, out + err
    assert "sets branch 'agent/elsewhere', but run ed has branch" in err


def test_a_crash_between_the_manifest_and_the_checkpoint_is_mended(make_repo) -> None:
    """Taking a new version writes the manifest, then the checkpoint: killed in between, the
    next resume finds a checkpoint without the new steps and aligns it with the task."""
    repo, path = failed_run(make_repo)
    path.write_text(path.read_text().replace('cmd: "false"', 'cmd: "echo two > two.txt"'))
    path.write_text(path.read_text() + '  - {id: s4, kind: shell, cmd: "echo 4 > four.txt"}\n')
    store = StateStore(repo / ".coder")
    state = store.load("ed")
    manifest_file = repo / ".coder" / "tasks" / "ed.json"
    manifest = read_manifest(repo / ".coder", "ed")
    current = manifest.task
    edit = amend.compare(manifest, current, path)
    assert edit is not None
    not_saved = RunState.from_dict(state.to_dict())
    amend.take(edit, not_saved, manifest, manifest_file, Redactor())
    assert "s4" not in store.load("ed").steps

    code, out, err = coder(repo, "resume", "-t", "ed")
    assert code == 0, out + err
    assert [c[0] for c in step_commits(repo, BRANCH)] == ["s1", "s2", "s3", "s4"]


def test_at_a_terminal_resume_shows_what_changed_and_asks(make_repo) -> None:
    from tests.helpers import Terminal

    repo, path = failed_run(make_repo)
    path.write_text(path.read_text().replace('cmd: "false"', 'cmd: "echo two > two.txt"'))
    term = Terminal(["resume", "-t", "ed"], repo, env={"TERM": "dumb"})
    term.see("step s2 changed")
    term.expect(r"\[t\]ake the new version for the steps not yet done  \[k\]eep the run's copy")
    term.send("t")
    assert term.finish() == 0, term.output
    assert [c[0] for c in step_commits(repo, BRANCH)] == ["s1", "s2", "s3"]
