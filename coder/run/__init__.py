"""The run engine: a taskfile executed on its branch, step by step, recoverable after a crash.
What a user does with a run afterwards (merge, revert, show, report) is in coder.services.

    start.py       `coder run`: a new run (manifest first, then branch and worktree)
    resume.py      `coder resume`: reconciled with git, then driven on
    stop.py        `coder stop`: ask the runner, wait, kill one that does not stop
    drive.py       a started or resumed run driven to its end (RunOptions, RunResult)
    settings.py    a run's settings, resolved once from its taskfile, config and options
    executor.py    the walk and the one step pipeline (start, act, verify, commit, record)
    places.py      where a step works (its run's worktree, a scratch one) and how it lands
    commitmsg.py   what a step commit says; filesgone.py: the run's files deleted under it
    candidates.py  best of N: a step tried several ways at once, the best one landing
    judge.py       which candidate wins: the evidence, in a fixed order
    asked_judge.py `judge: model`: the step's model chooses among those that passed
    context.py     RunContext: what one run carries through the executor, its steps, its questions
    schedule.py    which steps may start: in-degree counters over the DAG
    steps/         what each step kind does in a working directory; verify.py: the checks
    records.py     a run's checkpoint as typed records (RunState, StepRecord): progress only
    state.py       the checkpoint on disk: a snapshot and a journal; version 1 files upgraded
    manifest.py    what a run is, written before anything else (and rebuilt from trailers)
    opened.py      a run opened through one door: manifest, lock, checkpoint, repository
    preflight.py   the commands a task's steps would run, checked before anything is created
    approvals.py   per-step, per-edit or none: the mode, and each per-edit answer logged
    amend.py       resuming with an edited taskfile: what changed, and taking it
    notes.py       the user's guidance notes for a step's next attempts
    secrets.py     every value a run knows to be secret, registered with its redactor
    foreign.py     commits on a run's branch that coder did not make, refused
    uncommitted.py the checkout's uncommitted edits a run leaves out, named
    naming.py      which run a command means: an id, a prefix of one, `--last`, the only one
    lock.py        one runner per task; eventlog.py the JSONL event log
    success.py     the task's success criteria (also `merge --if-green`)

May import: agent, tools, models, git, policy and the base modules. Never services, plan, mcp
or CLI.
"""
