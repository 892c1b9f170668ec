"""The judge of a step tried several ways (coder.run.judge): the evidence, in its order."""

from __future__ import annotations

from coder.run.asked_judge import parse
from coder.run.judge import Evidence, judge, rank


def ev(
    number: int, passed: bool = True, failing: int | None = None, lines: int = 10, tokens: int = 100
) -> Evidence:
    return Evidence(number, passed, failing, lines, tokens)


def numbers(candidates: list[Evidence]) -> list[int]:
    return [e.number for e in rank(candidates)]


def test_passing_comes_before_everything_else() -> None:
    # a failed candidate with no failing test, a tiny diff and few tokens still ranks last
    assert numbers([ev(1, passed=False, lines=1, tokens=1), ev(2, lines=90, tokens=900)]) == [2, 1]


def test_then_fewer_failing_tests_then_the_smaller_diff_then_fewer_tokens() -> None:
    assert numbers([ev(1, failing=3, lines=1), ev(2, failing=1, lines=50)]) == [2, 1]
    assert numbers([ev(1, lines=20, tokens=1), ev(2, lines=5, tokens=999)]) == [2, 1]
    assert numbers([ev(1, tokens=300), ev(2, tokens=200)]) == [2, 1]
    # no test run counts as none failing
    assert numbers([ev(1, failing=1), ev(2, failing=None)]) == [2, 1]


def test_ties_go_to_the_lower_number_whatever_the_order_given() -> None:
    same = [ev(3), ev(1), ev(2)]
    assert numbers(same) == [1, 2, 3]
    verdict = judge(same)
    assert verdict.winner == ev(1)
    assert verdict.why == "tied with candidate 2: the lower number"


def test_the_verdict_says_what_decided() -> None:
    verdict = judge([ev(1, lines=2), ev(2, lines=1), ev(3, passed=False, lines=0)])
    assert verdict.winner is not None and verdict.winner.number == 2
    assert verdict.why == "the smaller diff (1 line against 2 for candidate 1)"
    verdict = judge([ev(1, tokens=300), ev(2, tokens=250)])
    assert verdict.why == "fewer tokens (250 tokens against 300 for candidate 1)"
    verdict = judge([ev(1, failing=2), ev(2, failing=1)])
    assert verdict.why == "fewer failing tests (1 failing test against 2 for candidate 1)"
    only = judge([ev(1, passed=False), ev(2)])
    assert only.winner == ev(2) and only.why == "the only one that passed its checks"
    assert judge([ev(1)]).why == ""


def test_none_passing_has_no_winner() -> None:
    verdict = judge([ev(1, passed=False), ev(2, passed=False)])
    assert verdict.winner is None
    assert verdict.why == "none of 2 candidates passed"


def test_a_model_judges_reply_names_one_of_the_candidates_shown_or_none() -> None:
    shown = {2: "+a", 3: "+b"}
    assert parse("Candidate 3: it handles\n the empty case.", shown) == (
        3,
        "it handles the empty case.",
    )
    assert parse("I pick candidate #2", shown) == (2, "no reason given")
    assert parse("candidate 4: best", shown) == (
        None,
        "the model's reply named no candidate among 2, 3: 'candidate 4: best'",
    )
    assert parse("", shown)[0] is None
