"""The judge of a step tried several ways at once: the evidence, in a fixed order.

A pure function of what each candidate left (coder.run.candidates gathers it): first the one
whose checks and tests passed; then fewer failing tests; then the smaller diff; then fewer
tokens; a tie goes to the lower candidate number, so the same evidence always picks the same
winner. No model is asked: what the step's own checks and the tests say is the verdict.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


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
