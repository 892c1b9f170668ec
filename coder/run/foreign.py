"""Work on a run's branch that coder did not make: resume, merge and revert each refuse to go
on while there is some, so nobody's commits are discarded, landed unchecked or reverted away.
"""

from __future__ import annotations

from coder.errors import EnvironmentProblem
from coder.git import commits
from coder.git.repository import Repo

SHOWN = 5  # commits named in the refusal


def refuse_foreign_commits(
    repo: Repo, *, branch: str, base_commit: str, task_id: str, refusing: str, hint: str
) -> None:
    """EnvironmentProblem (`refusing`, then `hint`) when `branch` has a commit without
    `Coder-Task: task_id` since `base_commit`, or no longer contains it
    (`coder.git.commits.foreign_commits`)."""
    foreign = commits.foreign_commits(repo, branch=branch, base_commit=base_commit, task_id=task_id)
    if foreign:
        raise EnvironmentProblem(
            f"branch {branch} has commits coder did not make "
            f"({', '.join(c[:8] for c in foreign[:SHOWN])}) or no longer contains the run's "
            f"base; {refusing}",
            hint=hint,
        )
