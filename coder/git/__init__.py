"""Everything coder does with git, through pygit2.

    ops.py    open the repository, worktrees and branches, step commits with trailers,
              history and diffs of a run
    land.py   landing on a base branch: merge trees, compare-and-swap ref moves, updating the
              user's checkout, recovery of an interrupted revert
    filters.py  git's worktree filters (eol, ident, drivers) for the checkout land.py writes
    guard.py  the git guard: what a command changed in `.git` is put back, and named

May import: the base modules (errors, ...). Never the run, model or CLI layers.
"""
