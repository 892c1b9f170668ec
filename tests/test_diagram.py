"""The DAG as a picture (`coder show --graph`, `--format mermaid|dot`) on a diamond DAG and a
3-level DAG: the terminal boxes by level, and exports that parse.

The Mermaid fixtures in fixtures/diagram/ are known-good: each was parsed by Mermaid 11's own
parser (fixtures/diagram/check_mermaid.mjs) when it was written, and the DOT fixtures by
Graphviz. The renderer must reproduce them byte for byte, and everything it prints for a real
run must pass `check_mermaid` (tests/helpers.py), a grammar check of the Mermaid subset it writes.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from coder.taskfile import diagram
from coder.taskfile.diagram import Node
from tests.conftest import coder, git
from tests.helpers import ROOT, check_mermaid, taskfile

FIXTURES = ROOT / "fixtures" / "diagram"

DIAMOND_NODES = [
    Node("a", "analyze", "Read the code", (), "success", 1, None),
    Node("b", "edit", "Add the parser", ("a",), "success", 2, "1111111122222222"),
    Node("c", "edit", "Add the printer", ("a",), "failed", 3, None),
    Node("d", "test", "Run the tests", ("b", "c"), "skipped", 0, None),
]
THREE_LEVEL_NODES = [
    Node("s1", "shell", "run `mkdir out`"),
    Node("s2", "shell", 'Write "docs" <b>bold</b> & #1', ("s1",)),
    Node("s3", "test", "run the tests", ("s2",)),
]
# ids that are Mermaid keywords or clash once sanitized, and every character a label must escape
HOSTILE_NODES = [
    Node("end", "shell", "end"),
    Node("a-b", "edit", 'quote " hash # lt < gt > amp & tick ` semi ;', ("end",), "running", 1),
    Node("a_b", "doc", "x", ("end", "a-b"), "pending", 0),
    Node("graph", "custom", "subgraph", ("a_b",), "interrupted", 1),
]
CASES = {"diamond": DIAMOND_NODES, "three-levels": THREE_LEVEL_NODES, "hostile": HOSTILE_NODES}

DIAMOND = """
    id: diamond
    title: A diamond
    graph:
      - {id: a, kind: shell, cmd: "echo a > a.txt", depends_on: []}
      - {id: b, kind: shell, cmd: "echo b > b.txt", depends_on: [a]}
      - {id: c, kind: shell, cmd: "false", depends_on: [a]}
      - {id: d, kind: shell, cmd: "echo d > d.txt", depends_on: [b, c]}
"""
THREE_LEVELS = """
    id: three
    title: Three levels
    graph:
      - {id: s1, kind: shell, cmd: "echo 1 > one.txt"}
      - {id: s2, kind: shell, cmd: "echo 2 > two.txt"}
      - {id: s3, kind: shell, cmd: "echo 3 > three.txt"}
"""


def test_the_grammar_check_rejects_what_mermaid_rejects() -> None:
    for bad in (
        'flowchart TD\n    a["x" y"]\n',  # a quote inside a label (Mermaid: parse error)
        'flowchart TD\n    end["x"]\n',  # a keyword as id (Mermaid: parse error)
        'flowchart TD\n    a["x"]\n    a --> b\n',  # an edge to an undeclared node
        'flowchart TD\n    a["a <b> c"]\n',  # raw HTML in a label
        'flowchart TD\n    a["x"]\n    class a done\n',  # a class never defined
        'graph LR\n    a["x"]\n',
    ):
        with pytest.raises(AssertionError):
            check_mermaid(bad)
    assert check_mermaid('flowchart TD\n    a["x #quot;y#quot;<br/>z"]\n') == {
        "a": "x #quot;y#quot;<br/>z"
    }


# --- the renderers against the known-good fixtures ------------------------------------------


@pytest.mark.parametrize("name", sorted(CASES))
def test_exports_equal_the_known_good_fixtures(name: str) -> None:
    nodes = CASES[name]
    mermaid = diagram.mermaid(nodes)
    assert mermaid == (FIXTURES / f"{name}.mmd").read_text(encoding="utf-8")
    assert set(check_mermaid(mermaid)) == set(diagram.node_ids(nodes).values())
    dot = diagram.dot(nodes, title=f'The "{name}" DAG')
    assert dot == (FIXTURES / f"{name}.dot").read_text(encoding="utf-8")


def test_mermaid_ids_are_safe_and_labels_escaped() -> None:
    ids = diagram.node_ids(HOSTILE_NODES)
    assert ids == {"end": "step_end", "a-b": "step_a_b", "a_b": "step_a_b_3", "graph": "step_graph"}
    labels = check_mermaid(diagram.mermaid(HOSTILE_NODES))
    assert labels["step_a_b"].endswith(
        "quote #quot; hash #35; lt #lt; gt #gt; amp #amp; tick #96; semi ;"
    )


@pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz `dot` is not installed")
@pytest.mark.parametrize("name", sorted(CASES))
def test_graphviz_reads_the_dot_export(name: str, tmp_path: Path) -> None:
    out = subprocess.run(
        ["dot", "-Tplain"],
        input=diagram.dot(CASES[name], title=name),
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    drawn = {line.split()[1] for line in out.splitlines() if line.startswith("node ")}
    assert drawn == set(diagram.node_ids(CASES[name]).values())
    edges = sum(1 for line in out.splitlines() if line.startswith("edge "))
    assert edges == sum(len(n.depends_on) for n in CASES[name])


def test_terminal_boxes_by_level_side_by_side_within_the_width() -> None:
    picture = diagram.text(DIAMOND_NODES, width=100)
    lines = picture.splitlines()
    level_rows = [i for i, line in enumerate(lines) if line.startswith("level ")]
    assert [lines[i].split()[:2] for i in level_rows] == [
        ["level", "1"],
        ["level", "2"],
        ["level", "3"],
    ]
    # b and c share level 2's row of boxes; d names both steps it needs
    second = lines[level_rows[1] : level_rows[2]]
    assert any("b · edit" in line and "c · edit" in line for line in second)
    assert any(
        "✔ success · 2 tries · 11111111" in line and "✘ failed · 3 tries" in line for line in second
    )
    assert any("d · test" in line and "← b, c" in line for line in lines[level_rows[2] :])
    assert lines[-1] == "✔ success  ✘ failed  ↷ skipped"
    # too narrow for two boxes: level 2 wraps onto two rows of one box
    narrow = diagram.text(DIAMOND_NODES, width=40).splitlines()
    assert not any("b · edit" in line and "c · edit" in line for line in narrow)
    assert all(len(line) <= 40 for line in narrow)
    # every box is closed and all boxes have the same width
    tops = [line.count("╭") for line in lines]
    assert tops.count(2) == 1 and sum(tops) == 4
    assert len({len(line) for line in lines if line.strip().startswith(("╭", "│", "╰"))}) <= 2


# --- the CLI on real taskfiles and real runs -------------------------------------------------


def test_show_graph_of_taskfiles(repo: Path) -> None:
    code, out, err = coder(repo, "show", "-f", str(taskfile(repo, DIAMOND)), "--graph")
    assert code == 0, err
    assert out.startswith("A diamond\n")
    assert "level 3" in out and "← b, c" in out and "✔" not in out  # not run: no statuses
    code, out, err = coder(repo, "show", "-f", str(taskfile(repo, THREE_LEVELS)), "--graph")
    assert code == 0, err
    assert [line.split()[1] for line in out.splitlines() if line.startswith("level")] == [
        "1",
        "2",
        "3",
    ]
    assert "s3 · test" not in out and "s3 · shell" in out and "← s2" in out
    code, out, err = coder(
        repo, "show", "-f", str(taskfile(repo, THREE_LEVELS)), "--format", "mermaid"
    )
    assert code == 0, err
    nodes = check_mermaid(out)
    assert list(nodes) == ["step_s1", "step_s2", "step_s3"]
    assert "step_s1 --> step_s2\n" in out and "step_s2 --> step_s3\n" in out and "class " not in out


def test_show_graph_of_a_run_shows_statuses_attempts_and_commits(repo: Path) -> None:
    code, out, err = coder(repo, "run", "--autonomous", "-f", str(taskfile(repo, DIAMOND)))
    assert code == 1, out + err  # c fails: the run stops there, d never runs
    commit_b = git(
        repo,
        "log",
        "--format=%H %(trailers:key=Coder-Step,valueonly,separator=)",
        "agent/diamond-a-diamond",
    ).split("\n")
    commit_b = next(line.split()[0] for line in commit_b if line.endswith(" b"))

    code, out, err = coder(repo, "show", "-t", "diamond", "--graph")
    assert code == 0, err
    assert "run diamond: failed on agent/diamond-a-diamond" in out
    assert f"✔ success · 1 try · {commit_b[:8]}" in out
    assert "✘ failed · 1 try" in out and "◌ pending" in out

    code, out, err = coder(repo, "show", "-t", "diamond", "--format", "mermaid")
    assert code == 0, err
    labels = check_mermaid(out)
    assert commit_b[:8] in labels["step_b"]
    assert "    class step_a,step_b success\n" in out
    assert "    class step_c failed\n" in out and "    class step_d pending\n" in out
    assert [line.strip() for line in out.splitlines() if "-->" in line] == [
        "step_a --> step_b",
        "step_a --> step_c",
        "step_b --> step_d",
        "step_c --> step_d",
    ]

    code, out, err = coder(repo, "show", "-t", "diamond", "--format", "dot")
    assert code == 0, err
    assert out.startswith("digraph coder {\n") and 'label="A diamond";' in out
    assert "step_b -> step_d;" in out and 'fillcolor="#ffebe9"' in out


def test_colours_on_a_terminal_and_none_in_a_pipe(
    repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from coder.cli import main

    coder(repo, "run", "--autonomous", "-f", str(taskfile(repo, DIAMOND)))
    monkeypatch.chdir(repo)
    coloured = CliRunner().invoke(main, ["show", "-t", "diamond", "--graph"], color=True).stdout
    assert "\x1b[32m╭" in coloured and "\x1b[31m│ c · shell" in coloured
    code, plain, _ = coder(repo, "show", "-t", "diamond", "--graph")
    assert "\x1b[" not in plain


def test_json_and_graph_are_alternatives(repo: Path) -> None:
    code, out, err = coder(repo, "show", "-f", str(taskfile(repo, DIAMOND)), "--graph", "--json")
    assert code == 2 and "alternatives" in err


def test_a_run_of_a_file_without_depends_on_is_drawn_as_its_sequence(repo: Path) -> None:
    """The run keeps an implicit sequence implicit (no depends_on written into its resolved
    task, so a skip does not spread); the picture still shows the order."""
    path = taskfile(
        repo,
        """
        id: seq
        title: t
        graph:
          - {id: a, kind: shell, cmd: "true"}
          - {id: b, kind: shell, cmd: "true"}
        """,
    )
    assert coder(repo, "run", "--autonomous", "-f", str(path))[0] == 0
    code, out, err = coder(repo, "show", "-t", "seq", "--format", "mermaid")
    assert code == 0, err
    assert [line.strip() for line in out.splitlines() if "-->" in line] == ["step_a --> step_b"]
