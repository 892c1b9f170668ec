"""Runs: a taskfile executed on its branch, and what a user does with a run afterwards.

    runs.py        start, resume (reconciled with git), stop; the manifest and preflight
    executor.py    the walk and the one step pipeline (start, act, verify, commit, record)
    schedule.py    which steps may start: in-degree counters over the DAG
    steps/         what each step kind does in a working directory; checks.py: verify
    state.py       typed checkpoints: a snapshot and a journal of step transitions
    lock.py        one runner per task; events.py the JSONL event log
    success.py     the task's success criteria (also `merge --if-green`)
    merge.py       landing a run on its base; revert.py rolling a run back; history.py reading
                   runs for status, show, diff and logs

May import: agent, tools, models, git, policy and the base modules. Never plan, mcp or CLI.
"""
