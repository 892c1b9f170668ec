"""Naming runs: a taskfile without an `id` names its run after the file; `-t` takes the start
of an id; `--last` is the newest run; a command about a run names the only one by itself."""

from __future__ import annotations

import json
import re
from pathlib import Path

from tests.conftest import coder, git

TASK = """title: {title}
graph:
  - {{id: a, kind: shell, cmd: "echo {title} > {title}.txt"}}
"""


def add_task(repo: Path, name: str, title: str | None = None) -> Path:
    path = repo / "tasks" / name
    path.parent.mkdir(exist_ok=True)
    path.write_text(TASK.format(title=title or Path(name).stem.replace(" ", "-")))
    return path


def start(repo: Path, path: Path) -> None:
    code, out, err = coder(repo, "run", "--autonomous", "-f", str(path))
    assert code == 0, out + err


def branches(repo: Path) -> list[str]:
    return git(repo, "branch", "--format=%(refname:short)").split()


def test_a_taskfile_without_an_id_names_its_run_after_the_file(make_repo) -> None:
    repo = make_repo()
    start(repo, add_task(repo, "fix-login.yaml"))
    assert "agent/fix-login-fix-login" in branches(repo)
    code, out, _ = coder(repo, "show", "-t", "fix-login", "--json")
    assert code == 0 and json.loads(out)["task_id"] == "fix-login"
    code, out, _ = coder(repo, "show", "-f", "tasks/fix-login.yaml")
    assert "  id      fix-login (the file's name)" in out
    # a second run of it is refused, saying how to run it again; nothing new is made
    before = git(repo, "for-each-ref")
    code, _, err = coder(repo, "run", "--autonomous", "-t", "fix-login")
    assert code == 2 and "a run of task fix-login already exists" in err
    assert "`coder clean -t fix-login` removes the run so this taskfile can run again" in err
    assert git(repo, "for-each-ref") == before


def test_a_file_name_that_is_no_id_gets_a_generated_one(make_repo) -> None:
    repo = make_repo()
    start(repo, add_task(repo, "my task.yaml", title="spaced"))
    (branch,) = [b for b in branches(repo) if b.startswith("agent/")]
    assert re.fullmatch(r"agent/T-\d{8}-\d{6}-[0-9a-f]{4}-spaced", branch), branch


def test_t_takes_the_start_of_one_id_and_names_several(make_repo) -> None:
    repo = make_repo()
    for name in ("alpha-one", "alpha-two", "beta"):
        start(repo, add_task(repo, f"{name}.yaml"))
    code, out, err = coder(repo, "diff", "-t", "be")
    assert code == 0 and "+beta" in out and "Run beta" in err
    code, out, err = coder(repo, "diff", "-t", "alpha")
    assert code == 2 and out == ""
    assert "'alpha' is the start of 2 run ids: alpha-one, alpha-two" in err
    code, out, _ = coder(repo, "diff", "-t", "alpha-one")  # a whole id is taken as it is
    assert code == 0 and "+alpha-one" in out


def test_last_is_the_newest_run_and_one_run_needs_no_name(make_repo) -> None:
    repo = make_repo()
    start(repo, add_task(repo, "zeta.yaml"))
    code, out, err = coder(repo, "show", "--last", "--json")
    assert code == 0 and json.loads(out)["task_id"] == "zeta"
    code, out, err = coder(repo, "diff")  # the only run
    assert code == 0 and "+zeta" in out and "Run zeta" in err
    start(repo, add_task(repo, "alpha.yaml"))  # newer, though first by name
    code, out, _ = coder(repo, "show", "--last", "--json")
    assert json.loads(out)["task_id"] == "alpha"
    code, out, err = coder(repo, "diff")
    assert code == 2 and "this project has 2 runs" in err and "newest first: alpha, zeta" in err
    code, _, err = coder(repo, "diff", "-t", "zeta", "--last")
    assert code == 2 and "not both" in err


def test_clean_and_revert_never_pick_a_run_by_themselves(make_repo) -> None:
    repo = make_repo()
    start(repo, add_task(repo, "only.yaml"))
    before = git(repo, "for-each-ref"), sorted(p.name for p in (repo / ".coder").rglob("*"))
    for args in (["clean", "--delete-branch"], ["revert", "--to-step", "a"]):
        code, _, err = coder(repo, *args)
        assert code == 2 and "say which with -t ID" in err, args
    assert (git(repo, "for-each-ref"), sorted(p.name for p in (repo / ".coder").rglob("*"))) == (
        before
    )
    code, _, _ = coder(repo, "clean", "--last", "--delete-branch")
    assert code == 0 and "agent/only-only" not in branches(repo)


def test_status_lists_runs_newest_first_under_a_header(make_repo) -> None:
    repo = make_repo()
    long_name = "a-rather-long-task-name-that-is-wider-than-before"
    start(repo, add_task(repo, f"{long_name}.yaml", title="long"))
    start(repo, add_task(repo, "b.yaml"))
    code, out, _ = coder(repo, "status")
    header, first, second = out.splitlines()
    assert header.split() == ["ID", "STATUS", "STEPS", "UPDATED", "(UTC)", "TITLE"]
    assert first.split()[:3] == ["b", "success", "1/1"] and second.startswith(long_name + "  ")
    # every column starts where its header does
    for column in ("STATUS", "STEPS", "TITLE"):
        at = header.index(column)
        assert first[at - 2 : at] == "  " and first[at] != " " and second[at] != " "


def test_a_run_says_which_uncommitted_edits_it_leaves_out(make_repo) -> None:
    repo = make_repo({"README.md": "# sample\n", "app.py": "x = 1\n"})
    (repo / "app.py").write_text("x = 2\n")
    (repo / "notes.txt").write_text("new\n")
    code, out, err = coder(repo, "run", "--autonomous", "-f", str(add_task(repo, "edits.yaml")))
    assert code == 0, out + err
    assert "2 uncommitted changes in your checkout are not part of it: app.py, notes.txt (" in err
    # left out indeed: the run's branch has the committed app.py, and the checkout is untouched
    assert git(repo, "show", "agent/edits-edits:app.py") == "x = 1\n"
    assert (repo / "app.py").read_text() == "x = 2\n"
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "edits")
    code, out, err = coder(repo, "run", "--autonomous", "-f", str(add_task(repo, "two.yaml")))
    assert code == 0 and "uncommitted" not in err


def test_coders_own_uncommitted_inputs_are_not_named_at_every_start(make_repo) -> None:
    """After `coder init` and a few taskfiles, none committed (as the README's first five
    minutes go), a run does not warn about them: coder reads them from the disk."""
    repo = make_repo()
    assert coder(repo, "init", "--no-test-probe")[0] == 0
    add_task(repo, "other.yaml")
    code, out, err = coder(repo, "run", "--autonomous", "-f", str(add_task(repo, "first.yaml")))
    assert code == 0 and "uncommitted" not in err, err
    (repo / "README.md").write_text("# changed\n")
    code, out, err = coder(repo, "run", "--autonomous", "-f", str(add_task(repo, "second.yaml")))
    assert (
        code == 0 and "1 uncommitted change in your checkout is not part of it: README.md (" in err
    )


def test_clean_all_and_merged_remove_coders_runs_and_nothing_else(make_repo) -> None:
    """Judged by git: worktrees, branches; a branch coder did not make stays, and so does a
    run with uncommitted changes (refused, named, exit 3) while the others go."""
    import shutil

    repo = make_repo()
    for name in ("one", "two", "three"):
        start(repo, add_task(repo, f"{name}.yaml"))
    git(repo, "add", "tasks")
    git(repo, "commit", "-qm", "tasks")
    code, out, err = coder(repo, "merge", "-t", "one")
    assert code == 0, out + err
    git(repo, "branch", "agent/mine")  # the user's own, under the same prefix
    code, out, _ = coder(repo, "clean", "--merged")
    assert code == 0 and out == "Removed run one and branch agent/one-one.\n"
    assert "agent/one-one" not in branches(repo) and "agent/two-two" in branches(repo)
    (repo / ".coder" / "worktrees" / "three" / "dirty.txt").write_text("mine\n")
    shutil.rmtree(repo / ".coder" / "tasks")  # runs whose files are gone: found by branch
    shutil.rmtree(repo / ".coder" / "state")
    code, out, err = coder(repo, "clean", "--all", "--delete-branch")
    assert code == 3 and "1 run(s) not cleaned (three); three: the worktree " in err
    assert "Removed run two and branch agent/two-two." in out
    assert sorted(branches(repo)) == ["agent/mine", "agent/three-three", "main"]
    listed = git(repo, "worktree", "list", "--porcelain")
    assert "/.coder/worktrees/two" not in listed and "/.coder/worktrees/three" in listed
    code, out, _ = coder(repo, "clean", "--all", "--delete-branch", "--force")
    assert code == 0 and sorted(branches(repo)) == ["agent/mine", "main"]
    assert git(repo, "worktree", "list", "--porcelain").count("worktree ") == 1
    code, _, err = coder(repo, "clean", "--all", "-t", "two")
    assert code == 2 and "pass one of -t ID, --last, --all or --merged" in err


def test_run_t_takes_the_start_of_one_taskfile_id(make_repo) -> None:
    repo = make_repo()
    add_task(repo, "fix-login.yaml")
    add_task(repo, "fix-logout.yaml")
    code, _, err = coder(repo, "run", "--autonomous", "-t", "fix-logi")
    assert code == 0 and "Taskfile " in err and "agent/fix-login-fix-login" in branches(repo)
    code, _, err = coder(repo, "run", "--autonomous", "-t", "fix")  # two ids start so
    assert code == 2 and "no taskfile in" in err and "fix-login, fix-logout" in err
    assert "agent/fix-logout-fix-logout" not in branches(repo)


# --- coder's own order, not the clock (issue 34) ---------------------------------------------


def set_clock_back(repo: Path, task_id: str, hours: float) -> None:
    """Rewrite run `task_id`'s own times as a clock `hours` behind would have written them:
    its manifest's and its checkpoint's (snapshot and journal)."""
    from datetime import datetime, timedelta

    fmt = "%Y-%m-%dT%H:%M:%S.%fZ"

    def back(value: str) -> str:
        return (datetime.strptime(value, fmt) - timedelta(hours=hours)).strftime(fmt)

    coder_dir = repo / ".coder"
    manifest = coder_dir / "tasks" / f"{task_id}.json"
    data = json.loads(manifest.read_text())
    manifest.write_text(json.dumps({**data, "created_at": back(data["created_at"])}))
    snapshot = coder_dir / "state" / f"{task_id}.json"
    data = json.loads(snapshot.read_text())
    times = {k: back(data[k]) for k in ("updated_at",)}
    snapshot.write_text(json.dumps({**data, **times}))
    journal = coder_dir / "state" / f"{task_id}.journal"
    if journal.exists():
        lines = [json.loads(line) for line in journal.read_text().splitlines() if line]
        journal.write_text("".join(json.dumps({**e, "at": back(e["at"])}) + "\n" for e in lines))


def forget_the_count(repo: Path, task_id: str) -> None:
    """Run `task_id` as a coder from before the count wrote it: no `seq` anywhere."""
    for folder in ("tasks", "state"):
        path = repo / ".coder" / folder / f"{task_id}.json"
        data = json.loads(path.read_text())
        data.pop("seq", None)
        path.write_text(json.dumps(data))


def status_ids(repo: Path) -> list[str]:
    code, out, err = coder(repo, "status")
    assert code == 0, out + err
    return [line.split()[0] for line in out.splitlines()[1:]]


def test_last_is_the_run_made_last_even_with_the_clock_set_back(make_repo) -> None:
    """Before: with the clock 2 h behind when `beta` was made, `merge --last` merged `alpha`,
    the older run, and status listed alpha first."""
    repo = make_repo()
    start(repo, add_task(repo, "alpha.yaml"))
    start(repo, add_task(repo, "beta.yaml"))
    set_clock_back(repo, "beta", 2)
    code, out, _ = coder(repo, "show", "--last", "--json")
    assert code == 0 and json.loads(out)["task_id"] == "beta"
    assert status_ids(repo) == ["beta", "alpha"]
    code, out, err = coder(repo, "diff")
    assert code == 2 and "newest first: beta, alpha" in err
    code, out, err = coder(repo, "merge", "--last")
    assert code == 0, out + err
    assert git(repo, "ls-tree", "--name-only", "main").split() == ["README.md", "beta.txt"]


def test_runs_from_before_the_count_come_before_every_counted_run(make_repo) -> None:
    """Old manifests and checkpoints (no `seq`) keep working: ordered by their time among
    themselves, older than any run made since, even with `.coder/sequence` gone."""
    repo = make_repo()
    for name in ("alpha", "beta"):
        start(repo, add_task(repo, f"{name}.yaml"))
        forget_the_count(repo, name)
    code, out, _ = coder(repo, "show", "--last", "--json")
    assert json.loads(out)["task_id"] == "beta"
    (repo / ".coder" / "sequence").unlink()
    set_clock_back(repo, "alpha", -2)  # alpha seems the newest old run now
    start(repo, add_task(repo, "gamma.yaml"))
    code, out, _ = coder(repo, "show", "--last", "--json")
    assert json.loads(out)["task_id"] == "gamma"
    assert status_ids(repo) == ["gamma", "alpha", "beta"]
    start(repo, add_task(repo, "delta.yaml"))
    assert status_ids(repo)[:2] == ["delta", "gamma"]
    assert (repo / ".coder" / "sequence").read_text() == "2\n"


def test_runs_made_at_once_get_numbers_of_their_own(tmp_path: Path) -> None:
    from coder.run.manifest import next_seq
    from tests.helpers import at_once

    coder_dir = tmp_path / ".coder"
    assert sorted(at_once(lambda _: next_seq(coder_dir), range(16))) == list(range(1, 17))
    (coder_dir / "sequence").write_text("not a number")
    assert next_seq(coder_dir) == 1  # no run to count from: it starts again


def test_fork_ids_and_whose_fork_they_name() -> None:
    from coder.run.manifest import fork_id, named_as_fork_of

    taken = {"rv-fork-1"}
    assert fork_id("rv", lambda i: i not in taken) == "rv-fork-2"
    long = "x" * 60
    cut = fork_id(long, lambda _: True)
    assert len(cut) == 64 and cut == "x" * 57 + "-fork-1"
    assert named_as_fork_of(cut, long) and named_as_fork_of(f"{cut[:57]}-fork-1", long)
    assert named_as_fork_of("rv-fork-2-fork-1", "rv")
    assert named_as_fork_of("rv-fork-2-fork-1", "rv-fork-2")
    assert not named_as_fork_of("rv-fork-1", "rvx")  # not cut short: the id is rv's
    assert not named_as_fork_of("rv-fork-0", "rv") and not named_as_fork_of("rv", "rv")
