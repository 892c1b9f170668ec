"""A run as `coder run` ends and `coder show -t` shows it: its steps as a table and its
model usage as one line.

Apart from run_cmd.py so that `coder show -t` (bench/startup.py) loads neither the run engine's
command line nor what it imports.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from coder.cli.common import fitted
from coder.display import escaped
from coder.models.usage import cache_share

if TYPE_CHECKING:
    from coder.models.usage import UsageRecord
    from coder.run.records import RunState
    from coder.taskfile import Task


def run_usage(state: RunState) -> UsageRecord:
    """The run's model usage summed over its steps, with `cache_share`: the share of prompt
    tokens the server reported serving from its cache (null when it reported none)."""
    total = state.usage()
    return {**total.as_dict(), "cache_share": cache_share(total)}


def usage_line(state: RunState) -> str:
    """The run's model usage: calls, tokens, generation speed, load time, and the server's
    cache reuse where it reports it ("" without calls)."""
    total = run_usage(state)
    if not total["calls"]:
        return ""
    share = total["cache_share"]
    return (
        f"{total['calls']} calls, {total['prompt_tokens']} prompt + "
        f"{total['eval_tokens']} generated tokens, {total['tokens_per_s']:.1f} tokens/s, "
        f"{total['load_s']:.1f}s loading"
        + (
            f", {share:.0%} of prompt tokens from the server's cache"
            f" ({total['cached_tokens']} tokens)"
            if share is not None
            else ""
        )
    )


def summary_table(task: Task, state: RunState) -> str:
    rows = [("step", "kind", "status", "tries", "time", "tokens", "commit", "note")]
    for step in task.steps:
        r = state.steps[step.id]
        note = r.error or r.summary or ""
        rows.append(
            (
                step.id,
                step.kind,
                r.status,
                str(r.attempts),
                f"{r.duration_s:.1f}s" if r.duration_s is not None else "-",
                str(r.tokens) if r.usage else "-",
                (r.commit or "-")[:8],
                escaped(note.splitlines()[0][:60]) if note else "",
            )
        )
    return fitted(rows)
