"""coder.files.ahead: the files a step writes are made ahead while its command runs, and taken
by a rename that replaces (never follows) what is at the name; none is left behind by a coder
that exits, and what a killed coder left is swept by the next, never a live one's. Judged by
inode numbers, the files on disk and real subprocesses (one SIGKILLed)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

from coder.files import ahead, durable, owner
from tests.conftest import git
from tests.helpers import coder_cli, fingerprint, taskfile


def spares(directory: Path) -> list[str]:
    return sorted(n for n in os.listdir(directory) if n.startswith(ahead.PREFIX))


def test_a_directory_written_again_takes_a_file_made_ahead(tmp_path: Path) -> None:
    out = tmp_path / ".coder" / "artifacts" / "t"
    durable.write_private(out / "s1.log", "one\n")  # the first write: a file of its own
    assert spares(out) == []
    ahead.make_wanted(lambda: True)  # nothing asked for yet
    assert spares(out) == []
    durable.write_private(out / "s2.log", "two\n")  # asks for one more
    ahead.make_wanted(lambda: True)
    (made,) = spares(out)
    inode = os.stat(out / made).st_ino
    durable.write_private(out / "s3.log", "three\n")
    assert (out / "s3.log").read_text() == "three\n" and os.stat(out / "s3.log").st_ino == inode
    assert (out / "s3.log").stat().st_mode & 0o777 == 0o600 and spares(out) == []


def test_what_is_at_the_name_is_replaced_not_followed(tmp_path: Path) -> None:
    out = tmp_path / ".coder" / "artifacts" / "t"
    outside = tmp_path / "outside.txt"
    outside.write_text("not coder's\n")
    durable.write_private(out / "a.log", "a\n")
    durable.write_private(out / "b.log", "b\n")
    ahead.make_wanted(lambda: True)
    (out / "c.log").symlink_to(outside)  # planted where coder writes next
    durable.write_private(out / "c.log", "c\n")
    assert outside.read_text() == "not coder's\n"
    assert not (out / "c.log").is_symlink() and (out / "c.log").read_text() == "c\n"


def test_nothing_is_made_once_the_command_ended_and_it_waits_for_the_next(tmp_path: Path) -> None:
    out = tmp_path / ".coder" / "logs"
    for name in ("a", "b"):
        durable.write_private(out / name, name)
    ahead.make_wanted(lambda: False)
    assert spares(out) == []
    ahead.make_wanted(lambda: True)
    assert len(spares(out)) == 1


def test_a_link_in_the_way_under_coder_dir_is_never_followed(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    target.mkdir()
    (target / "keep.txt").write_text("x\n")
    before = fingerprint(target)
    out = tmp_path / ".coder" / "artifacts" / "t"
    durable.write_private(out / "a.log", "a\n")
    durable.write_private(out / "b.log", "b\n")  # asks for a file ahead in out
    for name in os.listdir(out):
        os.unlink(out / name)
    out.rmdir()
    out.symlink_to(target)  # the directory swapped for a link before the file is made
    ahead.make_wanted(lambda: True)
    assert fingerprint(target) == before


_MAKER = textwrap.dedent(
    """
    import os, sys, time
    from pathlib import Path
    from coder.files import ahead, durable
    out = Path(sys.argv[1])
    for name in ("a", "b", "c"):
        durable.write_private(out / name, name)
    ahead.make_wanted(lambda: True)
    print("made", flush=True)
    if sys.argv[2] == "wait":
        time.sleep(60)
    """
)


def _maker(out: Path, how: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", _MAKER, str(out), how], stdout=subprocess.PIPE, text=True
    )


def test_none_is_left_at_exit_and_a_killed_coders_are_swept_by_the_next(tmp_path: Path) -> None:
    out = tmp_path / ".coder" / "artifacts" / "t"
    exited = _maker(out, "exit")
    assert exited.communicate(timeout=60)[0] == "made\n"
    assert spares(out) == []  # removed at exit

    killed = _maker(out, "wait")
    assert killed.stdout is not None and killed.stdout.readline() == "made\n"
    killed.send_signal(signal.SIGKILL)
    killed.communicate()
    left = spares(out)
    assert len(left) == 2 and all(str(killed.pid) in name for name in left)

    live = _maker(out, "wait")  # a live coder's files made ahead are never swept
    assert live.stdout is not None and live.stdout.readline() == "made\n"
    try:
        theirs = [n for n in spares(out) if str(live.pid) in n]
        durable.write_private(out / "d", "d")
        durable.write_private(out / "e", "e")
        ahead.make_wanted(lambda: True)  # this process's first make there sweeps
        now = spares(out)
        assert not set(left) & set(now) and set(theirs) <= set(now)
        assert any(owner.tag() in n for n in now)
    finally:
        live.kill()
        live.communicate()


def test_a_run_leaves_no_file_made_ahead_and_its_artifacts_whole(repo: Path) -> None:
    steps = "".join(
        f"  - id: s{i}\n    kind: shell\n    goal: write {i}\n    cmd: echo {i} > f{i}.txt\n"
        for i in range(1, 5)
    )
    tf = taskfile(repo, f"id: ahead\ntitle: Files made ahead\ngraph:\n{steps}")
    done = coder_cli(repo, "run", "--autonomous", "-f", str(tf))
    assert done.returncode == 0, done.stdout + done.stderr
    artifacts = repo / ".coder" / "artifacts" / "ahead"
    for i in range(1, 5):
        assert (artifacts / f"s{i}-attempt1.log").read_text().startswith(f"$ echo {i} > f{i}.txt")
        assert f"+{i}" in (artifacts / f"s{i}.diff").read_text()
    assert spares(artifacts) == [] and spares(repo / ".git" / "objects" / "pack") == []
    loose = list((repo / ".git" / "objects").glob("??/*"))
    made = git(repo, "log", "--format=%H", "main..agent/ahead-files-made-ahead").split()
    assert len(made) == 4 and not any(p.parent.name + p.name in made for p in loose)
    git(repo, "fsck", "--strict")
