"""The judge of a step tried several ways at once: the evidence, in a fixed order.

A pure function of what each candidate left (coder.run.candidates gathers it): first the one
whose checks and tests passed; then fewer failing tests; then the smaller diff; then fewer
tokens; a tie goes to the lower candidate number, so the same evidence always picks the same
winner. No model is asked: what the step's own checks and the tests say is the verdict.
How a round's verdicts are shown (`summary`, `shown`) is here too: `coder show` reads a run's
records without loading git.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from coder.run.records import CandidateRecord


@dataclass(frozen=True)
class Evidence:
    """What one candidate left, as the judge weighs it."""

    number: int  # 1..N
    passed: bool  # its checks (claim against the diff, syntax, asserts, lint) and tests
    failing_tests: int | None  # None: no test ran
    diff_lines: int  # lines its commit adds and removes
    tokens: int  # model tokens it spent


# What each place of the order is called when it decides (`why`).
_CRITERIA = ("passed its checks", "fewer failing tests", "the smaller diff", "fewer tokens")
_UNITS = ("", "failing test", "line", "token")


def _key(e: Evidence) -> tuple[int, int, int, int, int]:
    return (not e.passed, e.failing_tests or 0, e.diff_lines, e.tokens, e.number)


def rank(candidates: Sequence[Evidence]) -> list[Evidence]:
    """The candidates, best first."""
    return sorted(candidates, key=_key)


@dataclass(frozen=True)
class Verdict:
    winner: Evidence | None  # None: no candidate passed
    why: str  # what set the winner above the others, or why none won


def judge(candidates: Sequence[Evidence]) -> Verdict:
    """The winner among `candidates` (one that passed), and what decided it."""
    ranked = rank(candidates)
    passed = [e for e in ranked if e.passed]
    if not passed:
        return Verdict(None, f"none of {len(ranked)} candidates passed")
    best = passed[0]
    if len(passed) == 1:
        return Verdict(best, "the only one that passed its checks" * (len(ranked) > 1))
    runner_up = passed[1]
    mine, theirs = _key(best), _key(runner_up)
    place = next(i for i in range(len(mine)) if mine[i] != theirs[i])
    if place == len(_CRITERIA):
        return Verdict(best, f"tied with candidate {runner_up.number}: the lower number")
    unit = _UNITS[place]
    return Verdict(
        best,
        f"{_CRITERIA[place]} ({_count(mine[place], unit)} against {theirs[place]} for "
        f"candidate {runner_up.number})",
    )


def _count(n: int, unit: str) -> str:
    return f"{n} {unit}" + "s" * (n != 1)


def summary(records: Sequence[CandidateRecord]) -> str:
    """How a round went, in a line: "2 of 4 candidates passed; candidate 3 won: <why>"."""
    passed = sum(r.get("verdict") != "failed" for r in records)
    won = next((r for r in records if r.get("verdict") == "won"), None)
    line = f"{passed} of {len(records)} candidates passed"
    if won is None:
        return line
    why = won.get("why")
    return line + f"; candidate {won['number']} won" + (f": {why}" if why else "")


def shown(record: CandidateRecord) -> str:
    """One candidate, as `coder show` and `coder report` list it."""
    facts = [f"seed {record.get('seed')}"]
    if record.get("verdict") != "failed":
        facts += [f"{record.get('diff_lines', 0)} lines changed"]
    facts += [f"{record.get('tokens', 0):,} tokens"]
    if record.get("branch"):
        facts.append(f"kept as {record.get('branch')}")
    line = f"candidate {record.get('number')}: {record.get('verdict')} ({', '.join(facts)})"
    error = record.get("error") if record.get("verdict") == "failed" else None
    return line + (f": {' '.join(str(error).split())[:200]}" if error else "")
