"""Test-only crash hook: `CODER_CRASH_AT=point[@step][#n]` makes coder SIGKILL itself there.

The crash tests use it to prove "crash anywhere, lose nothing": they enumerate every point,
kill a real `coder run`, then `coder resume` and compare with an uninterrupted run. Unset (as
for every user), `crashpoint()` is a dictionary lookup and nothing else.

    CODER_CRASH_AT=after_commit@s2       the first time step s2 reaches after_commit
    CODER_CRASH_AT=checkpoint#3          the third checkpoint write
"""

from __future__ import annotations

import os
import threading

POINTS = (
    "after_worktree",  # worktree and branch created, before the first checkpoint
    "before_step",  # step checkpointed as running, nothing done yet
    "during_command",  # while the step's command runs (after CODER_CRASH_DELAY seconds)
    "after_checks",  # command and asserts done, before the commit
    "after_commit",  # commit on the branch, before the checkpoint that records it
    "checkpoint",  # inside a snapshot write: temp file written, before the rename
    "journal",  # inside a journal append: half the line written (a torn tail)
    "compaction",  # snapshot replaced, before the journal it now contains is emptied
    "before_finish",  # every step done, before the final status
)

# `coder merge`'s points, enumerated by tests/test_merge.py (POINTS above are `run`'s and
# `resume`'s, enumerated by tests/test_crash.py).
MERGE_POINTS = (
    "merge_verify",  # --if-green: check worktree created, before the tests run
    "merge_before_ref",  # merge commit written (on no branch), before the base ref moves
    "merge_after_ref",  # base branch and tag moved, before the checkout update and state
    "merge_file_write",  # a file of the checkout half written to its temp name, not renamed
    "merge_after_checkout",  # user's checkout updated, before the state records the merge
)

# `coder revert`'s points, enumerated by tests/test_revert.py.
REVERT_POINTS = (
    "revert_before_ref",  # revert commits written (on no branch), before the branch moves
    "revert_after_ref",  # branch moved, before the worktree's files follow
    "revert_after_worktree",  # files updated, before the state marks the later steps pending
)

# `coder worker`'s points (coder.fleet.worker), enumerated by tests/fleet/test_worker.py. A
# worker a coordinator starts (coder.fleet.jobs) takes `CODER_WORKER_CRASH_AT` as its
# CODER_CRASH_AT, and never the coordinator's own.
WORKER_POINTS = (
    "before_step",  # the worker's one-step run started its step, nothing done yet
    "after_checks",  # the step's work checked, before its commit
    "worker_before_push",  # the step committed in the worker's clone, before the push
)

_counts: dict[str, int] = {}
_lock = threading.Lock()


def _target() -> tuple[str, str | None, int] | None:
    spec = os.environ.get("CODER_CRASH_AT")
    if not spec:
        return None
    spec, _, nth = spec.partition("#")
    point, _, step = spec.partition("@")
    return point, step or None, int(nth or 1)


def crashpoint(point: str, step: str | None = None) -> None:
    target = _target()
    if target is None or target[0] != point or (target[1] is not None and target[1] != step):
        return
    with _lock:
        _counts[point] = _counts.get(point, 0) + 1
        hit = _counts[point] == target[2]
    if hit:
        import signal  # here: only a test's crash needs it, and `coder status` imports this

        os.kill(os.getpid(), signal.SIGKILL)


def armed(point: str) -> bool:
    """Whether a crash at `point` is requested (to prepare a torn write for it)."""
    target = _target()
    return target is not None and target[0] == point


def crash_during(point: str, step: str | None = None) -> threading.Timer | None:
    """Arm a crash that fires while something (a command) is running."""
    target = _target()
    if target is None or target[0] != point or (target[1] is not None and target[1] != step):
        return None
    timer = threading.Timer(
        float(os.environ.get("CODER_CRASH_DELAY", "0.3")), crashpoint, args=(point, step)
    )
    timer.daemon = True
    timer.start()
    return timer
