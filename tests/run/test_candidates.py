"""Best of N (coder.run.candidates): a step tried several ways at once, against real git, the
real CLI and the fake Ollama server, whose scripted model solves the step only for some seeds
(`solves`, by the request's `options.seed`). What landed is read with the git CLI.

- N=4: each candidate asks with its own seed (the config's seed + K - 1); only the candidates
  that solved keep a branch; the best one lands as the step's one commit, with the trailers of
  how it won; the step's record lists every candidate and its verdict; every candidate's tokens
  count; `coder show` and `coder report` say it; `coder clean` removes the kept branches;
- none solving: the step fails, nothing lands, the run's branch is where it was;
- `coder run --candidates N` sets it for every edit step, and `resume` keeps it;
- a `kill -9` or a Ctrl-C mid-round, then `coder resume`: only the winner's commit is on the
  branch, the step done once;
- a later round (a resume's) keeps the branches of an earlier one; with approvals the
  candidates run one at a time; `--record` then `--replay` lands the same one; `--dry-run`
  shows them; `judge: model` has the model choose (a secret in a candidate's diff never reaches it);
  `coder compare --step` shows them side by side.
"""

from __future__ import annotations

import json
import re
import signal
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from coder.errors import EXIT_INTERRUPTED
from tests.conftest import coder, git, sample_files
from tests.fake_ollama import FakeOllama, Reply, seed_of, solves
from tests.helpers import Terminal, call, done, state_of, taskfile, wait_for
from tests.run.test_signals import interrupt

TASK_ID = "best"
BRANCH = "agent/best"
ONE_IN = 3  # the scripted model solves one seed in three


def task(repo: Path, candidates: int | None = 4) -> Path:
    field = f"\n            candidates: {candidates}" if candidates else ""
    return taskfile(
        repo,
        f"""
        id: {TASK_ID}
        branch: {BRANCH}
        title: Best of N
        graph:
          - id: s1
            kind: edit
            goal: Write the answer to answer.txt
            assert: [{{type: text_in_file, path: answer.txt, contains: right}}]{field}
        """,
    )


def answer(body: dict[str, Any]) -> Reply:
    """The scripted model: writes the right answer for a seed it solves (a longer one for an
    even seed, so diffs differ), a wrong one otherwise; then claims it is done."""
    if any(m["role"] == "assistant" for m in body["messages"]):
        return done("wrote the answer", "answer.txt")
    seed = seed_of(body)
    right = "right\n" + "because\n" * (seed is not None and seed % 2 == 0)
    return call("fs_write", path="answer.txt", content=right if solves(seed, ONE_IN) else "wrong\n")


def base_where(pattern: list[bool]) -> int:
    """A config seed whose candidates 1..N solve the step as `pattern` says."""
    return next(
        b for b in range(10_000) if [solves(b + k, ONE_IN) for k in range(len(pattern))] == pattern
    )


def configure(home: Path, seed: int) -> None:
    path = home / ".config" / "coder" / "config.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"seed": seed}))


def step_messages(repo: Path) -> list[str]:
    """The messages of the run's commits after main, oldest first (git CLI)."""
    log = git(repo, "log", "--reverse", "--format=%B%x00", f"main..{BRANCH}")
    return [m.strip() for m in log.split("\0") if m.strip()]


def candidate_branches(repo: Path) -> list[str]:
    return git(repo, "branch", "--list", f"{BRANCH}--*", "--format=%(refname:short)").split()


@pytest.fixture
def seeded(fake: FakeOllama, isolated_home: Path) -> FakeOllama:
    fake.answer = answer
    return fake


def test_the_best_candidate_lands_as_the_steps_one_commit_and_the_others_are_kept(
    seeded: FakeOllama, sample: Path, isolated_home: Path
) -> None:
    base = base_where([False, True, True, False])
    configure(isolated_home, base)
    code, out, err = coder(sample, "run", "--autonomous", "-f", str(task(sample)))
    assert code == 0, out + err

    asked = {seed_of(b) for b in seeded.chat_bodies() if b.get("messages")}
    assert {base, base + 1, base + 2, base + 3} <= asked

    # one commit for the step, the winner's, with the answer and how it won
    messages = step_messages(sample)
    assert len(messages) == 1, messages
    assert git(sample, "show", f"{BRANCH}:answer.txt").startswith("right")
    winner = 2 if (base + 1) % 2 else 3  # the smaller diff: the odd seed's one-line answer
    other = 5 - winner
    assert f"Coder-Candidate: {winner} of 4 (seed {base + winner - 1})" in messages[0]
    assert "Coder-Judged: 2 of 4 passed; the smaller diff (1 line against 2" in messages[0]
    assert f"for candidate {other})" in messages[0]

    # the candidates that passed are kept as branches; the failed ones left no commit
    assert candidate_branches(sample) == [f"{BRANCH}--s1--a1-c2", f"{BRANCH}--s1--a1-c3"]
    kept = git(sample, "show", f"{BRANCH}--s1--a1-c{other}:answer.txt")
    assert kept.startswith("right")
    assert git(sample, "rev-parse", f"{BRANCH}--s1--a1-c{winner}^{{tree}}") == git(
        sample, "rev-parse", f"{BRANCH}^{{tree}}"
    )

    record = state_of(sample, TASK_ID)["steps"]["s1"]
    verdicts = [(c["number"], c["verdict"]) for c in record["candidates"]]
    assert verdicts == [(1, "failed"), (2, "won" if winner == 2 else "passed"),
                        (3, "won" if winner == 3 else "passed"), (4, "failed")]  # fmt: skip
    assert record["attempts"] == 1
    # every candidate's tokens count toward the step's
    assert record["usage"]["prompt_tokens"] + record["usage"]["eval_tokens"] == sum(
        c["tokens"] for c in record["candidates"]
    )

    code, shown, err = coder(sample, "show", "-t", TASK_ID)
    assert code == 0, shown + err
    assert f"candidate {winner}: won" in shown and "candidate 1: failed" in shown
    code, report, err = coder(sample, "report", "-t", TASK_ID)
    assert code == 0, report + err
    assert "2 of 4 candidates passed" in report and "the smaller diff" in report

    code, out, err = coder(sample, "clean", "-t", TASK_ID, "--delete-branch")
    assert code == 0, out + err
    assert candidate_branches(sample) == []


def test_no_candidate_passing_fails_the_step_and_lands_nothing(
    seeded: FakeOllama, sample: Path, isolated_home: Path
) -> None:
    configure(isolated_home, base_where([False, False]))
    code, out, err = coder(sample, "run", "--autonomous", "-f", str(task(sample, 2)))
    assert code == 1, out + err
    assert step_messages(sample) == []
    assert candidate_branches(sample) == []
    record = state_of(sample, TASK_ID)["steps"]["s1"]
    assert record["status"] == "failed"
    assert record["error"].startswith("none of 2 candidates passed (candidate 1: ")
    assert not (sample / ".coder" / "worktrees" / f"{TASK_ID}--s1--c1").exists()


def test_run_candidates_sets_every_edit_step_and_resume_keeps_it(
    seeded: FakeOllama, sample: Path, isolated_home: Path
) -> None:
    # the first round (seeds b, b+1) solves nothing; resumed, the config's seed moved on: the
    # second round (b+2, b+3) has its winner, so resume ran two candidates again
    base = base_where([False, False, False, True])
    configure(isolated_home, base)
    path = task(sample, None)
    code, out, err = coder(sample, "run", "--autonomous", "--candidates", "2", "-f", str(path))
    assert code == 1, out + err
    configure(isolated_home, base + 2)
    code, out, err = coder(sample, "resume", "-t", TASK_ID)
    assert code == 0, out + err
    record = state_of(sample, TASK_ID)["steps"]["s1"]
    assert [c["verdict"] for c in record["candidates"]] == ["failed", "won"]
    assert f"Coder-Candidate: 2 of 2 (seed {base + 3})" in step_messages(sample)[0]


def test_candidates_are_refused_on_a_step_that_takes_none_and_out_of_range(
    sample: Path,
) -> None:
    bad = taskfile(
        sample,
        """
        title: t
        graph:
          - {id: a, kind: shell, cmd: "true", candidates: 2}
          - {id: b, kind: edit, goal: x, candidates: 9}
          - {id: c, kind: shell, cmd: "true", judge: model}
          - {id: d, kind: edit, goal: x, judge: best}
        """,
    )
    code, out, err = coder(sample, "validate", "-f", str(bad))
    assert code == 2
    assert "step 'a': `candidates` is only used by edit, doc and custom steps" in out + err
    assert "graph[1].candidates (step b): 9 is greater than the maximum of 8" in out + err
    assert "step 'c': `judge` is only used by edit, doc and custom steps" in out + err
    assert "graph[3].judge (step d): 'best' is not one of evidence, model" in out + err
    code, out, err = coder(sample, "run", "--autonomous", "--candidates", "9", "-f", str(bad))
    assert code == 2, out + err
    assert "--candidates" in out + err


@pytest.mark.parametrize("point", ["after_checks", "after_commit"])
def test_a_kill_mid_round_then_resume_lands_the_winner_once(
    seeded: FakeOllama, sample: Path, isolated_home: Path, point: str
) -> None:
    """SIGKILL as the first candidate passed its checks (the others still going, nothing
    landed), or right after the winner landed (before the checkpoint says so); `coder resume`
    then leaves the winner's one commit on the branch and the step done once."""
    from tests.run.test_crash import coder as killed_coder
    from tests.run.test_crash import out

    configure(isolated_home, base_where([False, True, True, False]))
    path = task(sample)
    ran = killed_coder(sample, "run", "--autonomous", "-f", str(path), crash=f"{point}@s1")
    assert ran.returncode == -9, out(ran)
    landed_before = step_messages(sample)
    assert len(landed_before) == (point == "after_commit")

    resumed = killed_coder(sample, "resume", "-t", TASK_ID)
    assert resumed.returncode == 0, out(resumed)
    messages = step_messages(sample)
    assert len(messages) == 1 and "Coder-Candidate: " in messages[0], messages
    assert messages == landed_before or not landed_before  # a landed winner is kept as it was
    assert git(sample, "show", f"{BRANCH}:answer.txt").startswith("right")
    record = state_of(sample, TASK_ID)["steps"]["s1"]
    assert record["status"] == "success"
    assert record["attempts"] == (2 if point == "after_checks" else 1)
    # no candidate's worktree is left; the run's worktree holds the branch's tree, clean
    worktrees = sample / ".coder" / "worktrees"
    assert sorted(p.name for p in worktrees.iterdir()) == [TASK_ID]
    assert git(worktrees / TASK_ID, "status", "--porcelain") == ""


def chatty(body: dict[str, Any]) -> Reply:
    """A scripted model that solves the step for a seed it solves, and for the others looks
    for one file after another (each turn a longer prompt: the tokens pile up)."""
    if not solves(seed_of(body), ONE_IN):
        turn = sum(m["role"] == "assistant" for m in body["messages"])
        return call("fs_read", path=f"notes{turn}.txt")
    return answer(body)


def test_each_candidate_is_held_to_the_steps_budget_and_the_run_counts_them_all(
    fake: FakeOllama, sample: Path, isolated_home: Path
) -> None:
    """policies.max_tokens stops the chatty candidates alone (the step passes with the one that
    solved it); the run's budget counts all four: it is spent before s2, which stays pending."""
    fake.answer = chatty
    configure(isolated_home, base_where([False, True, False, False]))
    path = taskfile(
        sample,
        f"""
        id: {TASK_ID}
        branch: {BRANCH}
        title: Best of N, on a budget
        policies: {{max_tokens: 12000, run_max_tokens: 20000}}
        graph:
          - id: s1
            kind: edit
            goal: Write the answer to answer.txt
            assert: [{{type: text_in_file, path: answer.txt, contains: right}}]
            candidates: 4
          - {{id: s2, kind: edit, goal: Write more}}
        """,
    )
    code, out, err = coder(sample, "run", "--autonomous", "-f", str(path))
    assert code == 1, out + err
    state = state_of(sample, TASK_ID)
    s1 = state["steps"]["s1"]
    assert s1["status"] == "success"
    verdicts = [(c["verdict"], "token budget" in (c["error"] or "")) for c in s1["candidates"]]
    assert verdicts == [("failed", True), ("won", False), ("failed", True), ("failed", True)]
    one = next(c["tokens"] for c in s1["candidates"] if c["verdict"] == "won")
    assert one < 20000 < s1["usage"]["prompt_tokens"] + s1["usage"]["eval_tokens"]
    assert state["steps"]["s2"]["status"] == "pending"
    assert "run token budget exhausted" in state["error"]
    assert len(step_messages(sample)) == 1


def test_a_later_round_keeps_the_branches_of_an_earlier_one(
    seeded: FakeOllama, sample: Path, isolated_home: Path
) -> None:
    """s1's candidates pass beside a failing step of its level: s1 is not landed and runs
    again on resume, a second round; the first round's kept branches are still there."""
    configure(isolated_home, base_where([True, True]))
    path = taskfile(
        sample,
        f"""
        id: {TASK_ID}
        branch: {BRANCH}
        title: Best of N beside a failure
        graph:
          - {{id: bad, kind: shell, cmd: "false"}}
          - id: s1
            kind: edit
            goal: Write the answer to answer.txt
            assert: [{{type: text_in_file, path: answer.txt, contains: right}}]
            candidates: 2
            depends_on: []
        """,
    )
    code, out, err = coder(sample, "run", "--autonomous", "--max-parallel", "2", "-f", str(path))
    assert code == 1, out + err
    first = {b: git(sample, "rev-parse", b) for b in candidate_branches(sample)}
    assert sorted(first) == [f"{BRANCH}--s1--a1-c1", f"{BRANCH}--s1--a1-c2"]
    code, out, err = coder(sample, "resume", "-t", TASK_ID, "--max-parallel", "2")
    assert code == 1, out + err
    assert state_of(sample, TASK_ID)["steps"]["s1"]["attempts"] == 2
    after = {b: git(sample, "rev-parse", b) for b in candidate_branches(sample)}
    assert sorted(after) == [*sorted(first), f"{BRANCH}--s1--a2-c1", f"{BRANCH}--s1--a2-c2"]
    assert {b: after[b] for b in first} == first  # nothing of the first round lost


def test_record_then_replay_gives_each_candidate_its_own_replies(
    seeded: FakeOllama, sample: Path, make_repo: Any, isolated_home: Path, tmp_path: Path
) -> None:
    """Recorded with four candidates at once, replayed without a model: every candidate
    gets the replies it was given, so the same ones pass and the same one lands."""
    configure(isolated_home, base_where([False, True, True, False]))
    recording = tmp_path / "best.json"
    path = task(sample)
    code, out, err = coder(
        sample, "run", "--autonomous", "-f", str(path), "--record", str(recording)
    )
    assert code == 0, out + err
    asked = len(seeded.requests)
    copy = make_repo(sample_files(), name="copy")
    code, out, err = coder(copy, "run", "--autonomous", "-f", str(path), "--replay", str(recording))
    assert code == 0, out + err
    assert len(seeded.requests) == asked  # no model was asked

    def round_of(repo: Path) -> list[tuple[str, int]]:
        record = state_of(repo, TASK_ID)["steps"]["s1"]
        return [(c["verdict"], c["diff_lines"]) for c in record["candidates"]]

    assert round_of(copy) == round_of(sample)
    assert step_messages(copy) == step_messages(sample)
    assert git(copy, "rev-parse", f"{BRANCH}^{{tree}}") == git(
        sample, "rev-parse", f"{BRANCH}^{{tree}}"
    )


def test_dry_run_shows_a_steps_candidates(sample: Path) -> None:
    code, out, err = coder(sample, "run", "--dry-run", "-f", str(task(sample, 3)))
    assert code == 0, out + err
    assert "[best of 3 candidates]" in out
    code, out, err = coder(
        sample, "run", "--dry-run", "--json", "--candidates", "5", "-f", str(task(sample, None))
    )
    assert code == 0, out + err
    assert json.loads(out)["steps"][0]["candidates"] == 5


def test_with_per_edit_approvals_the_candidates_run_one_at_a_time(
    seeded: FakeOllama, sample: Path, isolated_home: Path
) -> None:
    """Through a real terminal: one question at a time, candidate 1's conversation done
    before candidate 2's starts (the seeds of the model's requests, in order)."""
    base = base_where([True, True])
    configure(isolated_home, base)
    term = Terminal(
        ["run", "--approvals", "per-edit", "-f", str(task(sample, 2))],
        sample,
        env={"TERM": "dumb", "COLUMNS": "200", "OLLAMA_HOST": seeded.url},
    )
    asked = "s1: fs_write wants to change answer.txt"
    term.see(asked)
    assert term.read(1.0).count(asked) == 0  # the other candidate waits, not asks
    term.send("y")
    term.expect(f"(?s){re.escape(asked)}.*{re.escape(asked)}")
    term.send("y")
    assert term.finish() == 0, term.output
    seeds = [seed_of(b) for b in seeded.chat_bodies() if b.get("messages")]
    assert seeds == sorted(seeds) and {base, base + 1} <= set(seeds)  # not interleaved
    assert len(step_messages(sample)) == 1


def judged_by(choice: str) -> Any:
    """The scripted model, answering the judge's request with `choice`."""

    def reply(body: dict[str, Any]) -> Reply:
        if body["messages"][0]["content"].startswith("You judge code changes"):
            return Reply(content=choice)
        return answer(body)

    return reply


@pytest.mark.parametrize("names", ["larger", "none"])
def test_judge_model_chooses_among_those_that_passed_or_falls_back_to_the_evidence(
    fake: FakeOllama, sample: Path, isolated_home: Path, names: str
) -> None:
    """Candidates 2 and 3 pass, one with a one-line answer, one with two. `judge: model`: the
    model is shown both diffs and its choice (the larger, which the evidence would not pick)
    lands, its reason in the record and the trailer; a reply naming no candidate that passed
    leaves the evidence's pick, and says so."""
    base = base_where([False, True, True, False])
    configure(isolated_home, base)
    small = 2 if (base + 1) % 2 else 3
    large = 5 - small
    fake.answer = judged_by(
        f"Candidate {large}: it says why." if names == "larger" else "candidate 4: the failed one"
    )
    path = taskfile(
        sample,
        f"""
        id: {TASK_ID}
        branch: {BRANCH}
        title: Best of N, judged by the model
        graph:
          - id: s1
            kind: edit
            goal: Write the answer to answer.txt
            assert: [{{type: text_in_file, path: answer.txt, contains: right}}]
            candidates: 4
            judge: model
        """,
    )
    code, out, err = coder(sample, "run", "--autonomous", "-f", str(path))
    assert code == 0, out + err

    bodies = [b["messages"] for b in fake.chat_bodies() if b.get("messages")]
    (asked,) = [m for m in bodies if m[0]["content"].startswith("You judge code changes")]
    shown = asked[1]["content"]
    assert "Goal: Write the answer to answer.txt" in shown
    assert f"### candidate {small}" in shown and f"### candidate {large}" in shown
    assert "### candidate 1" not in shown and "+because" in shown  # only those that passed

    (message,) = step_messages(sample)
    record = state_of(sample, TASK_ID)["steps"]["s1"]
    won = next(c for c in record["candidates"] if c["verdict"] == "won")
    if names == "larger":
        assert won["number"] == large and won["why"] == "the model chose it: it says why."
        assert git(sample, "show", f"{BRANCH}:answer.txt") == "right\nbecause\n"
        assert "Coder-Judged: 2 of 4 passed; the model chose it: it says why." in message
    else:
        assert won["number"] == small
        assert won["why"].startswith(
            f"the model's reply named no candidate among {min(small, large)}, {max(small, large)}"
        )
        assert "; by the evidence: the smaller diff" in won["why"]
        assert git(sample, "show", f"{BRANCH}:answer.txt") == "right\n"
    assert f"Coder-Candidate: {won['number']} of 4" in message
    # the judge's tokens are the step's too
    spent = record["usage"]["prompt_tokens"] + record["usage"]["eval_tokens"]
    assert spent > sum(c["tokens"] for c in record["candidates"])


def test_compare_shows_a_steps_candidates_side_by_side(
    seeded: FakeOllama, sample: Path, isolated_home: Path
) -> None:
    base = base_where([False, True, True, False])
    configure(isolated_home, base)
    path = taskfile(
        sample,
        f"""
        id: {TASK_ID}
        branch: {BRANCH}
        title: Best of N, compared
        graph:
          - id: s1
            kind: edit
            goal: Write the answer to answer.txt
            assert: [{{type: text_in_file, path: answer.txt, contains: right}}]
            candidates: 4
          - {{id: s2, kind: shell, cmd: "echo more >> answer.txt"}}
        """,
    )
    code, out, err = coder(sample, "run", "--autonomous", "-f", str(path))
    assert code == 0, out + err
    small = 2 if (base + 1) % 2 else 3
    large = 5 - small

    code, shown, err = coder(sample, "compare", "-t", TASK_ID, "--step", "s1")
    assert code == 0, shown + err
    lines = shown.splitlines()
    assert lines[0].startswith(f"{TASK_ID} step s1: 2 of 4 candidates passed; candidate {small}")
    row = next(line.split() for line in lines if line.startswith(f"{small} "))
    assert row[:2] == [str(small), "won"] and row[3] == "1" and row[-1].endswith(f"-c{small}")
    row = next(line.split() for line in lines if line.startswith("1 "))
    assert row[:2] == ["1", "failed"] and row[-1] == "-"
    # each kept candidate's change from the round's start, not the later step's
    assert f"candidate {large} (passed):" in shown and "answer.txt | 2 ++" in shown
    assert "answer.txt | 1 +" in shown

    code, patch, err = coder(sample, "compare", "-t", TASK_ID, "--step", "s1", "--diff")
    assert code == 0, patch + err
    assert "+because" in patch and "+more" not in patch

    code, out, err = coder(sample, "compare", "-t", TASK_ID, "--step", "s1", "--json")
    assert code == 0, out + err
    data = json.loads(out)
    assert [c["verdict"] for c in data["candidates"]][0] == "failed"
    assert data["candidates"][large - 1]["branch"] == f"{BRANCH}--s1--a1-c{large}"

    for args, said in [
        (["--step", "s2"], "step 's2' of run best was not tried several ways"),
        (["--step", "s9"], "run best has no step 's9' (its steps: s1, s2)"),
        (["-t", TASK_ID, "--step", "s1"], "compare --step needs one run, got 2"),
    ]:
        code, out, err = coder(sample, "compare", "-t", TASK_ID, *args)
        assert code == 2 and said in err and "Traceback" not in err, out + err


def test_ctrl_c_mid_round_lands_nothing_and_resume_finishes_the_step(
    fake: FakeOllama, sample: Path, isolated_home: Path, tmp_path: Path
) -> None:
    """SIGINT to a real `coder run` while a candidate waits on the model (the others on it or
    on the server's one slot): exit 130, no
    commit on the run's branch, no candidate's worktree left; `coder resume` runs a round
    again and lands its winner, the step's one commit."""
    from tests.run.test_crash import coder as cli
    from tests.run.test_crash import out, spawn

    go = tmp_path / "go"

    def slow(body: dict[str, Any]) -> Reply:
        reply = answer(body)
        late = any(m["role"] == "assistant" for m in body["messages"]) and not go.exists()
        return replace(reply, delay_s=60) if late else reply

    def waiting() -> int:
        bodies = [b["messages"] for b in fake.chat_bodies() if b.get("messages")]
        return sum(any(m["role"] == "assistant" for m in ms) for ms in bodies)

    fake.answer = slow
    configure(isolated_home, base_where([False, True, True, False]))
    runner = spawn(sample, "run", "--autonomous", "-f", str(task(sample)))
    try:
        wait_for(lambda: waiting() >= 1, what="a candidate's second request")
    finally:
        _, err = interrupt(runner, signal.SIGINT)
    assert runner.returncode == EXIT_INTERRUPTED, err
    assert step_messages(sample) == [] and candidate_branches(sample) == []
    worktrees = sample / ".coder" / "worktrees"
    assert sorted(p.name for p in worktrees.iterdir()) == [TASK_ID]
    assert git(worktrees / TASK_ID, "status", "--porcelain") == ""
    assert state_of(sample, TASK_ID)["steps"]["s1"]["status"] != "success"

    go.touch()
    resumed = cli(sample, "resume", "-t", TASK_ID)
    assert resumed.returncode == 0, out(resumed)
    (message,) = step_messages(sample)
    assert "Coder-Candidate: " in message
    record = state_of(sample, TASK_ID)["steps"]["s1"]
    assert record["status"] == "success" and record["attempts"] == 2


def test_a_secret_in_a_candidates_diff_never_reaches_the_judge_model(
    fake: FakeOllama, make_repo: Any, isolated_home: Path
) -> None:
    """Candidates write the checkout's `.env` value and an AWS-shaped key into their answer:
    the judge is shown both diffs, each redacted (the values never in any request body)."""
    env_value, aws = "canary-judge-Qx71pL0z", "AKIA" + "Z7Q3XK2MNB5TY4WD"
    repo = make_repo({**sample_files(), ".gitignore": ".env\n"})
    (repo / ".env").write_text(f"API_PASSWORD={env_value}\n")
    base = base_where([True, True])
    configure(isolated_home, base)

    def reply(body: dict[str, Any]) -> Reply:
        if body["messages"][0]["content"].startswith("You judge code changes"):
            return Reply(content="Candidate 1: fine.")
        if any(m["role"] == "assistant" for m in body["messages"]):
            return done("wrote the answer", "answer.txt")
        content = f"right\npassword {env_value}\n" + f"key {aws}\n" * (seed_of(body) == base)
        return call("fs_write", path="answer.txt", content=content)

    fake.answer = reply
    path = taskfile(
        repo,
        f"""
        id: {TASK_ID}
        branch: {BRANCH}
        title: Best of N, judged with secrets in the diffs
        graph:
          - id: s1
            kind: edit
            goal: Write the answer to answer.txt
            assert: [{{type: text_in_file, path: answer.txt, contains: right}}]
            candidates: 2
            judge: model
        """,
    )
    code, out, err = coder(repo, "run", "--autonomous", "-f", str(path))
    assert code == 0, out + err
    bodies = [b["messages"] for b in fake.chat_bodies() if b.get("messages")]
    (asked,) = [m for m in bodies if m[0]["content"].startswith("You judge code changes")]
    shown = asked[1]["content"]
    assert "### candidate 1" in shown and "### candidate 2" in shown  # both diffs were shown
    assert "+right" in shown and "[REDACTED" in shown
    everything = json.dumps(fake.chat_bodies())
    assert env_value not in everything and aws not in everything
    assert env_value not in out + err and aws not in out + err


def test_candidates_spread_over_the_endpoints(sample: Path, isolated_home: Path) -> None:
    """Two model servers (`base_url` a list): each candidate keeps to one endpoint for its
    whole conversation, and the two candidates are on different ones (each server was also
    primed with the shared prefix: that request has the system message only)."""
    base = base_where([True, True])
    with FakeOllama() as one, FakeOllama() as two:
        one.answer = two.answer = answer
        path = isolated_home / ".config" / "coder" / "config.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"seed": base, "base_url": [one.url, two.url]}))
        code, out, err = coder(sample, "run", "--autonomous", "-f", str(task(sample, 2)))
        assert code == 0, out + err
        seeds = [
            {seed_of(b) for b in server.chat_bodies() if len(b.get("messages") or ()) > 1}
            for server in (one, two)
        ]
    assert sorted(seeds, key=lambda s: min(s, default=-1)) == [
        {base},
        {base + 1},
    ]  # one candidate each, whole
    assert len(step_messages(sample)) == 1
