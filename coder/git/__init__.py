"""Everything coder does with git, through pygit2: the only package that imports it (the
other layers hold a `repository.Repo` handle and get plain values back).

    repository.py  opening a repository or a worktree, its roots, who commits, info/exclude
    branches.py    branches and refs: reading them, compare-and-swap moves
    worktrees.py   coder's worktrees (and scratch worktrees): create, re-create, remove, prune
    submodules.py  submodules checked out in a worktree from the user's copies, and checked
    workdir.py     a worktree's files against HEAD: what changed, the git tools' status,
                   diff, log and patches
    restore.py     a worktree put back to a commit, confined (discard, revert's reset)
    commits.py     step commits with trailers, landing scratch commits, a run's history
    diffs.py       patches, stats, changed files and lines between commits
    trees.py       files and trees at a commit, read-only (repo map, instructions, planner)
    staging.py     a step's changes found and staged in one scan (libgit2 or the git program)
    objects.py     what a commit brings held in a kept pack until a ref reaches it (git gc)
    recovery.py    a run whose newest commits lost objects moved back to its last complete one
    land.py        landing on a base branch: merge trees, compare-and-swap ref moves, updating
                   the user's checkout, recovery of an interrupted revert
    filters.py     git's worktree filters (eol, ident, drivers) for the checkout land.py writes
    snapshot.py    the user's checkout as a commit, leaving it untouched (--include-uncommitted)
    forks.py       a fork's history: the parent run's commits copied under the fork's id
    remotes.py     remotes: push with compare-and-swap (the git program, git's credentials),
                   a remote branch's commit, the review page's URL of a remote
    guard.py       the git guard: what a command changed in `.git` is put back, and named
    indexfile.py   an index file's entries as git status sees them, read without libgit2
    picks.py       commits stacked in memory for a step run elsewhere (coder.fleet)

May import: the base modules (errors, ...) and policy's confinement. Never the run, model or
CLI layers.
"""
