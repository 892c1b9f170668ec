"""The services a user calls on a run, one module per command (the CLI parses and renders;
these do the work, over the run engine in `coder.run`).

    merge.py     `coder merge` (and `run --merge-on-success`): landing a run on its base
    indexlock.py the checkout's index.lock during a merge: whose it is, and the refusal
    revert.py    `coder revert`: the branch back to a step, later steps pending again
    fork.py      `coder fork`: a new run from a step of another, that run untouched
    compare.py   `coder compare`: two runs, or a step's candidates, side by side
    push.py      `coder push` and `merge --push`: a run's branch to a remote, compare-and-swap
    history.py   `coder show`, `diff`, `logs`: reading a run back (no libgit2 but for `diff`)
    listing.py   `coder status`: the runs of a repository, one row each
    clean.py     `coder clean`: removing a run, or every (merged) run
    report.py    `coder report`: a run as Markdown (or JSON) for a reviewer
    validate.py  `coder validate` (and MCP's `task_validate`): a taskfile, and preflight
    dryrun.py    `coder run --dry-run`: what a run would do, with nothing done
    doctor.py    `coder doctor`: is this machine ready for a run
    demo.py      `coder demo`: the whole journey on a sample project, offline
    initialize.py `coder init`: a repository prepared for coder; the example taskfiles
    testprobe.py the test command run once (`init`, `doctor`): does it find tests
    export.py    `coder export`: a taskfile's DAG as a GitHub Actions workflow, a job per step
    argo.py      `coder export argo`: the same as an Argo Workflow (hera, an optional extra)

May import: run and everything below it. Never plan, mcp or CLI.
"""
