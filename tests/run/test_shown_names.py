"""File names and text a run's commands and taskfile chose are shown, never obeyed: a name with
a terminal escape (`\\x1b[2J` clears the screen, `\\x1b]0;...\\x07` sets the window title) or a
newline reaches no output of `report`, `diff`, `show`, `status` or `logs` raw, and a name with
`|` and a newline cannot forge a row of the report's Markdown tables."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from coder.display import escaped, quoted_name
from tests.conftest import coder, git
from tests.helpers import taskfile

CLEAR = "evil\x1b[2J.txt"
TITLE = "osc\x1b]0;pwned\x07.txt"
FORGED = "a|b\n| forged.txt | A | 9 | 9 |\nc.txt"
NAMES = (CLEAR, TITLE, FORGED)
RAW = ("\x1b", "\x07", "\n| forged.txt")  # never in an output: the escapes, the forged line


@pytest.fixture
def hostile_run(make_repo) -> Path:
    repo = make_repo({"README.md": "# r\n"})
    path = taskfile(
        repo,
        r"""
        id: names
        title: "names \e]0;title\a"
        graph:
          - id: s1
            kind: shell
            goal: "make odd names \e[2J"
            cmd: >-
              printf 1 > "$(printf 'evil\033[2J.txt')";
              printf 2 > "$(printf 'osc\033]0;pwned\007.txt')";
              printf 3 > "$(printf 'a|b\n| forged.txt | A | 9 | 9 |\nc.txt')";
              printf 'out \033[2J\n'
        """,
    )
    code, out, err = coder(repo, "run", "--autonomous", "-f", str(path))
    assert code == 0, out + err
    assert not any(raw in out + err for raw in RAW[:2])
    branch = json.loads(coder(repo, "show", "-t", "names", "--json")[1])["branch"]
    committed = git(repo, "diff", "--name-only", "-z", "main", branch)
    assert sorted(committed.strip("\0").split("\0")) == sorted(NAMES)
    return repo


def test_names_and_output_are_escaped_everywhere(hostile_run: Path) -> None:
    repo = hostile_run
    outputs = {}
    for args in (
        ("report", "-t", "names"),
        ("report", "-t", "names", "--format", "json"),
        ("diff", "-t", "names"),
        ("diff", "-t", "names", "--stat"),
        ("diff", "-t", "names", "--step", "s1"),
        ("show", "-t", "names"),
        ("show", "-t", "names", "--json"),
        ("show", "-t", "names", "--graph"),
        ("show", "-t", "names", "--format", "mermaid"),
        ("show", "-t", "names", "--format", "dot"),
        ("status",),
        ("status", "--json"),
        ("logs", "-t", "names"),
        ("logs", "-t", "names", "--json"),
    ):
        code, out, err = coder(repo, *args)
        assert code == 0, (args, out, err)
        outputs[" ".join(args)] = out + err
    for name, text in outputs.items():
        for raw in RAW:
            assert raw not in text, (name, raw, text[:3000])
    # the names are there, escaped as git quotes an unusual name
    stat = outputs["diff -t names --stat"]
    assert quoted_name(CLEAR) in stat and '"evil\\033[2J.txt"' in stat
    assert len(stat.splitlines()) == len(NAMES) + 1
    assert stat.splitlines()[-1] == " 3 files changed, 3 insertions(+)"
    patch = outputs["diff -t names"]
    assert 'diff --git "a/a|b\\n| forged.txt | A | 9 | 9 |\\nc.txt"' in patch
    assert "out" not in patch  # the command's output is in its log, not the diff
    assert json.loads(outputs["show -t names --json"])["title"] == "names \x1b]0;title\x07"


def test_the_report_tables_keep_their_rows(hostile_run: Path) -> None:
    code, report, err = coder(hostile_run, "report", "-t", "names")
    assert code == 0, err
    changes = report.split("## Changes\n\n", 1)[1].split("\n\n", 1)[0].splitlines()
    assert changes[:2] == ["| file | | + | − |", "|---|---|---:|---:|"]
    rows = changes[2:]
    assert len(rows) == len(NAMES)
    for row in rows:  # four cells each: the name's own `|` escaped
        assert len(re.split(r"(?<!\\)\|", row.strip().strip("|"))) == 4, row
    assert '`"a\\|b\\n\\| forged.txt \\| A \\| 9 \\| 9 \\|\\nc.txt"`' in report
    assert "\x1b" not in report and "# names \\033]0;title\\a" in report
    log = (hostile_run / ".coder" / "artifacts" / "names" / "s1-attempt1.log").read_text()
    assert "\x1b[2J" in log  # what coder keeps is the command's own output; shown, it is escaped


def test_escaped_and_quoted_name() -> None:
    """As git writes an unusual name: C escapes, octal for the other controls."""
    assert escaped("a\x1b[2Jb\r\n\t\x07\x9b\u202e") == "a\\033[2Jb\\r\\n\\t\\a\\233\\u202e"
    assert escaped("line 1\n\tline 2\x1b[0m\r\n", lines=True) == "line 1\n\tline 2\\033[0m\\r\n"
    assert escaped("plain text, ünïcode") == "plain text, ünïcode"
    assert quoted_name("src/app.py") == "src/app.py"
    assert quoted_name("a b.txt") == "a b.txt"
    assert quoted_name("new\nline") == '"new\\nline"'
    assert quoted_name('say "hi"\\') == '"say \\"hi\\"\\\\"'
    assert quoted_name("\u202etxt.exe") == '"\\u202etxt.exe"'
