"""`coder report`: the demo run as Markdown for a pull request (every section present, every
figure equal to `coder show --json`'s and git's) and as JSON; redaction; `coder merge
--report` putting the summary in the squash commit's body."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from coder.services.report import StepReport
from tests.conftest import coder, git
from tests.helpers import check_mermaid, taskfile

SECTIONS = ["## Task", "## The DAG", "## Steps", "## Changes", "## Merge or revert"]


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`coder demo --keep DIR`: a real run (recorded model, real tools, tests and git), merged."""
    where = tmp_path_factory.mktemp("demo")
    code, out, err = coder(where, "demo", "--keep", str(where / "calc"))
    assert code == 0, out + err
    return where / "calc"


def show_json(repo: Path, task_id: str) -> dict[str, Any]:
    code, out, err = coder(repo, "show", "-t", task_id, "--json")
    assert code == 0, err
    data: dict[str, Any] = json.loads(out)
    return data


def numstat(repo: Path, *rev: str) -> list[tuple[str, int, int]]:
    """(path, added, removed) per file, from the git CLI."""
    out = git(repo, "diff", "--numstat", *rev)
    return sorted(
        (p, int(a), int(r)) for a, r, p in (line.split("\t") for line in out.splitlines())
    )


def table_rows(markdown: str, header: str) -> list[list[str]]:
    """The cells of the Markdown table that starts with `header`."""
    lines = markdown.splitlines()
    start = lines.index(header)
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip("|").split(" | ")])
    return rows


def test_report_of_the_demo_has_every_section_and_shows_figures(demo: Path) -> None:
    code, md, err = coder(demo, "report", "-t", "demo")
    assert code == 0, err
    state = show_json(demo, "demo")

    assert md.startswith(f"# {state['title']}\n")
    assert "Run `demo` · ✅ **success**" in md
    positions = [md.index(section) for section in SECTIONS]
    assert positions == sorted(positions), "sections out of order"
    for sid in state["steps"]:
        kind = next(s["kind"] for s in state["task"]["graph"] if s["id"] == sid)
        assert f"\n### {sid} · {kind}\n" in md

    # the DAG: a mermaid block that parses, with every step and its status
    block = re.search(r"```mermaid\n(.*?)```", md, re.S)
    assert block is not None
    labels = check_mermaid(block.group(1))
    assert sorted(labels) == sorted(f"step_{sid}" for sid in state["steps"])
    assert "class step_s1,step_s2,step_s3,step_s4 success" in block.group(1)

    # the steps table: every figure is show --json's
    rows = table_rows(
        md,
        "| step | kind | outcome | commit | files | tests (before → after) | fix cycles "
        "| tokens | time | cache reuse |",
    )
    assert [r[0].split("]")[0].lstrip("[") for r in rows] == list(state["steps"])
    for row in rows:
        sid = row[0].split("]")[0].lstrip("[")
        st = state["steps"][sid]
        usage = st["usage"]
        assert row[2].endswith(st["status"])
        assert row[3] == (f"`{st['commit'][:8]}`" if st["commit"] else "—")
        assert row[7] == f"{usage['prompt_tokens'] + usage['eval_tokens']:,}"
        assert row[8] == f"{st['duration_s']:.1f} s"
        assert row[9] == "not reported"  # Ollama and the replay report no cached tokens
        if st["commit"]:  # files: what git says the step's commit changed
            files = numstat(demo, f"{st['commit']}^", st["commit"])
            added, removed = sum(f[1] for f in files), sum(f[2] for f in files)
            assert row[4] == f"{len(files)} (+{added} −{removed})"
        section = md[md.index(f"### {sid} ·") :].split("\n### ")[0]
        assert f"({st['attempts']} attempt{'s' * (st['attempts'] != 1)})" in section
        assert f"{usage['prompt_tokens']:,} prompt + {usage['eval_tokens']:,} generated" in section
        if st["commit"]:
            assert f"- **Commit:** `{st['commit']}`" in section

    # the test step: red before its fix cycle, green after, as the log and the state say
    s3 = next(r for r in rows if r[0].startswith("[s3]"))
    tests = state["steps"]["s3"]["tests"]
    assert s3[5] == f"2 passed, 1 failed → {tests['passed']} passed (exit 0)" and s3[6] == "1"
    assert "- **Fix cycle 1:** started from red tests (2 passed, 1 failed)" in md

    # the run's totals and the whole diff, against show --json and git
    usage = [s["usage"] for s in state["steps"].values()]
    tokens = sum(u["prompt_tokens"] + u["eval_tokens"] for u in usage)
    calls = sum(u["calls"] for u in usage)
    assert (
        f"| model | qwen2.5-coder:7b: {tokens:,} tokens in {calls} calls, cache reuse not reported |"
        in md
    )
    files = numstat(demo, state["base_commit"], state["branch"])
    changes = table_rows(md, "| file | | + | − |")  # the first such table is s2's
    assert len(changes) == 2
    whole = md[md.index("## Changes") :]
    for path, added, removed in files:
        assert f"| `{path}` | M | {added} | {removed} |" in whole
    assert f"{len(files)} files changed, +{sum(f[1] for f in files)} −0" in whole
    merge = state["merge"]
    assert f"as `{merge['commit'][:8]}` (squash, tag `coder/demo`)" in md
    assert "`git revert --no-edit coder/demo`" in whole


def test_report_as_json_equals_show(demo: Path, tmp_path: Path) -> None:
    out = tmp_path / "report.json"
    code, _, err = coder(demo, "report", "-t", "demo", "--format", "json", "-o", str(out))
    assert code == 0 and f"to {out}" in err
    report = json.loads(out.read_text())
    state = show_json(demo, "demo")
    assert report["status"] == state["status"] and report["branch"] == state["branch"]
    for step in report["steps"]:
        st = state["steps"][step["id"]]
        assert step["usage"] == st["usage"]
        assert (step["status"], step["attempts"], step["commit"], step["duration_s"]) == (
            st["status"],
            st["attempts"],
            st["commit"],
            st["duration_s"],
        )
        assert step["tokens"] == st["usage"]["prompt_tokens"] + st["usage"]["eval_tokens"]
        assert step["cache_share"] is None
    assert report["totals"]["commits"] == sum(1 for s in state["steps"].values() if s["commit"])
    assert report["totals"]["fix_cycles"] == 1
    assert [(f["path"], f["added"], f["removed"]) for f in report["files"]] == numstat(
        demo, state["base_commit"], state["branch"]
    )


def test_report_of_a_failed_run_says_how_to_go_on_and_is_redacted(
    repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DEPLOY_TOKEN", "tok-9f8e7d6c5b4a")
    path = taskfile(
        repo,
        """
        id: leaky
        title: Leaky task
        spec: |
          Use the key AKIAIOSFODNN7EXAMPLE and the token tok-9f8e7d6c5b4a to deploy.
        graph:
          - {id: ok, kind: shell, cmd: "echo ok > ok.txt"}
          - {id: bad, kind: shell, cmd: "false", goal: "deploy with tok-9f8e7d6c5b4a"}
        """,
    )
    assert coder(repo, "run", "--autonomous", "-f", str(path))[0] == 1
    for fmt in ("md", "json"):
        code, text, err = coder(repo, "report", "-t", "leaky", "--format", fmt)
        assert code == 0, err
        assert "AKIAIOSFODNN7EXAMPLE" not in text and "tok-9f8e7d6c5b4a" not in text
        assert "[REDACTED:" in text
    code, md, _ = coder(repo, "report", "-t", "leaky")
    assert "Run `leaky` · ❌ **failed**" in md
    assert "<details open><summary>Spec</summary>" in md
    assert "- Continue the run where it stopped: `coder resume -t leaky`" in md
    assert "`coder revert -t leaky --to-step ok`" in md
    assert "| [bad](#bad--shell) | shell | ❌ failed | — | — |" in md


def test_report_refuses_an_unknown_run_and_an_unwritable_file(repo: Path) -> None:
    code, _, err = coder(repo, "report", "-t", "nope")
    assert code == 2 and "nope" in err
    path = taskfile(repo, "id: one\ntitle: One\ngraph:\n  - {kind: shell, cmd: echo}\n")
    assert coder(repo, "run", "--autonomous", "-f", str(path))[0] == 0
    code, _, err = coder(repo, "report", "-t", "one", "-o", str(repo / "no" / "such" / "r.md"))
    assert code == 2 and "cannot write" in err


def test_cache_reuse_is_the_servers_figure_or_absent() -> None:
    def step(usage: dict[str, Any]) -> StepReport:
        return StepReport(
            "s", "edit", "g", "success", 1, None, "", [], None, None, [], usage, 1.0, []
        )

    assert step({"prompt_tokens": 1000, "eval_tokens": 10}).cache_share is None
    reported = {"prompt_tokens": 1000, "cached_tokens": 750, "cache_reports": 2}
    assert step(reported).cache_share == 0.75


def test_merge_report_puts_the_summary_in_the_squash_body(repo: Path) -> None:
    path = taskfile(
        repo,
        """
        id: two
        title: Two files
        graph:
          - {id: a, kind: shell, cmd: "echo x > a.txt && echo y >> a.txt"}
          - {id: b, kind: shell, cmd: "echo b > b.txt"}
        """,
    )
    assert coder(repo, "run", "--autonomous", "-f", str(path))[0] == 0
    code, out, err = coder(repo, "merge", "-t", "two", "--mode", "ff-only", "--report")
    assert code == 2 and "ff-only makes none" in err
    code, out, err = coder(repo, "merge", "-t", "two", "--report")
    assert code == 0, out + err
    body = git(repo, "log", "-1", "--format=%B", "main")
    a = git(repo, "log", "-1", "--format=%h", "--abbrev=8", "agent/two-two-files~1").strip()
    assert "Run two: success; 2 commits, 2 files +3 -0," in body
    assert f"- a: run `echo x > a.txt && echo y >> a.txt`\n  success, {a}, 1 file +2 -0\n" in body
    assert body.rstrip().endswith("Coder-Task: two\nCoder-Merge: squash")


def test_cache_reuse_is_what_the_server_reported(make_repo, isolated_home: Path) -> None:
    """Against an OpenAI-compatible server that reports its prefix cache (the fake, through
    the real `openai` SDK), the report's cache reuse is the server's figure, as show's."""
    from tests.fake_openai import MODEL, FakeOpenAI
    from tests.helpers import call, done

    repo = make_repo()
    with FakeOpenAI() as server:
        config = isolated_home / ".config" / "coder" / "config.json"
        config.parent.mkdir(parents=True, exist_ok=True)
        config.write_text(
            json.dumps({"provider": "openai", "base_url": server.url, "model": MODEL})
        )
        server.enqueue(call("fs_write", path="y.txt", content="y\n"), done("wrote y", "y.txt"))
        path = taskfile(repo, "id: cached\ntitle: t\ngraph:\n  - {kind: edit, goal: write y}\n")
        code, out, err = coder(repo, "run", "--autonomous", "-f", str(path))
        assert code == 0, out + err
        served = sum(server.cache.cached)  # the warm prefix's request included
    usage = show_json(repo, "cached")["steps"]["s1"]["usage"]
    assert usage["cache_reports"] == 2 and 0 < usage["cached_tokens"] <= served
    share = usage["cached_tokens"] / usage["prompt_tokens"]
    code, md, _ = coder(repo, "report", "-t", "cached")
    [row] = table_rows(
        md,
        "| step | kind | outcome | commit | files | tests (before → after) | fix cycles "
        "| tokens | time | cache reuse |",
    )
    assert row[9] == f"{share:.0%}"
    assert f"cache reuse {share:.0%} |" in md
    report = json.loads(coder(repo, "report", "-t", "cached", "--format", "json")[1])
    assert report["steps"][0]["cache_share"] == pytest.approx(share)
    assert report["totals"]["cache_share"] == pytest.approx(share)


def test_the_models_that_answered_are_named_never_folded_into_the_runs() -> None:
    """A step's own model and a fallback that took over (its third attempt) are listed
    beside the run's model; a shell step and attempts not made add none."""
    from coder.services.report import models_used
    from coder.taskfile import from_dict

    task = from_dict(
        {
            "id": "t",
            "title": "t",
            "model": "main",
            "graph": [
                {"id": "a", "kind": "edit", "goal": "g", "fallback_model": "big", "retries": 3},
                {"id": "b", "kind": "edit", "goal": "g", "model": "small"},
                {"id": "c", "kind": "shell", "cmd": "true"},
                {"id": "d", "kind": "edit", "goal": "g", "fallback_model": "unused"},
            ],
        }
    )
    assert models_used(task, {"a": 3, "b": 1, "c": 1, "d": 1}) == ["main", "big", "small"]
    assert models_used(task, {"a": 2}) == ["main"]  # the fallback never took over
    from coder.services.report import RunReport, markdown

    report = RunReport(
        task_id="t", title="t", spec=None, taskfile=None, model="main", status="success",
        error=None, branch="agent/t", base="main", base_commit="0" * 40, tip=None, merge=None,
        steps=[], files=[], mermaid="", models=["main", "big"],
    )  # fmt: skip
    assert "| models | main, big (together): 0 tokens in 0 calls," in markdown(report)
    single = markdown(replace(report, models=["main"]))
    assert "| model | main: 0 tokens in 0 calls," in single


def test_a_suites_own_report_is_shown_beside_the_exit_status_never_instead(make_repo) -> None:
    """A hostile suite rewrites the JUnit report coder asked pytest for (it claims 55,000
    passed) and exits 1: the step fails by the exit status, and every place that shows the
    counts shows the status with them."""
    conftest = (
        "import os\n"
        "def pytest_unconfigure(config):\n"
        "    path = os.environ.get('CODER_TEST_RESULTS')\n"
        "    if path:\n"
        "        open(path, 'w').write('<testsuite>' + '<testcase/>' * 55000 + '</testsuite>')\n"
    )
    repo = make_repo({"conftest.py": conftest, "test_x.py": "def test_x():\n    assert 0\n"})
    path = taskfile(
        repo, "id: liar\ntitle: t\ngraph:\n  - {id: t1, kind: test, framework: pytest}\n"
    )
    code, out, err = coder(repo, "run", "--autonomous", "-f", str(path))
    assert code == 1, out + err
    step = show_json(repo, "liar")["steps"]["t1"]
    assert step["status"] == "failed" and step["tests"]["exit_code"] == 1
    assert step["error"].startswith("tests failed: 55000 passed (`"), step["error"]
    assert step["error"].endswith("exited with 1)")
    code, report, err = coder(repo, "report", "-t", "liar")
    assert code == 0, err
    assert "55000 passed (exit 1)" in report


def test_a_run_without_model_steps_names_no_model(make_repo) -> None:
    repo = make_repo()
    path = taskfile(repo, "id: sh\ntitle: t\ngraph:\n  - {kind: shell, cmd: 'echo x > x.txt'}\n")
    assert coder(repo, "run", "--autonomous", "-f", str(path))[0] == 0
    code, report, err = coder(repo, "report", "-t", "sh")
    assert code == 0, err
    assert "| model | none: no step of the run uses one |" in report
    assert json.loads(coder(repo, "report", "-t", "sh", "--format", "json")[1])["models"] == []
