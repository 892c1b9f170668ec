"""`coder run ... 2>&1 | head -2`: the reader goes after two lines, and the run goes on to its
end, checkpointed as usual (RELIABILITY.md row 35); output to the closed pipe is dropped."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.conftest import git
from tests.helpers import ROOT, state_of, step_commits, taskfile

TASK = """
    id: piped
    title: Piped
    graph:
      - {id: s1, kind: shell, cmd: "sleep 0.3; echo 1 > a.txt"}
      - {id: s2, kind: shell, cmd: "sleep 0.3; echo 2 > b.txt"}
      - {id: s3, kind: shell, cmd: "sleep 0.3; echo 3 > c.txt"}
"""


def test_a_run_whose_output_pipe_closes_goes_on_to_its_end(make_repo) -> None:
    repo = make_repo()
    path = taskfile(repo, TASK)
    proc = subprocess.Popen(
        [sys.executable, "-m", "coder", "run", "--autonomous", "-f", str(path)],
        cwd=repo,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert proc.stdout is not None
    first = proc.stdout.readline()  # `head -1`: one line, then the pipe is closed
    proc.stdout.close()
    assert b"run started" in first
    assert proc.wait(timeout=60) == 0
    state = state_of(repo, "piped")
    assert state["status"] == "success"
    assert [s["status"] for s in state["steps"].values()] == ["success"] * 3
    assert [c[0] for c in step_commits(repo, "agent/piped-piped")] == ["s1", "s2", "s3"]
    assert git(repo, "show", "agent/piped-piped:c.txt") == "3\n"
