"""Linter detection, output parsing and the new findings of a change (coder.checks.lintreport)."""

from __future__ import annotations

from pathlib import Path

import pytest

from coder.checks.lintreport import (
    LINTERS,
    Finding,
    Linter,
    detect,
    linters_for,
    new_findings,
    parse_output,
    unread_failure,
)


@pytest.mark.parametrize(
    ("files", "expected"),
    [
        ({"pyproject.toml": "[tool.ruff]\nline-length = 100\n"}, ["ruff"]),
        ({"ruff.toml": ""}, ["ruff"]),
        ({"setup.cfg": "[flake8]\nmax-line-length = 100\n"}, ["flake8"]),
        ({".flake8": ""}, ["flake8"]),
        ({"eslint.config.mjs": "export default [];\n"}, ["eslint"]),
        ({"package.json": '{"eslintConfig": {}}'}, ["eslint"]),
        ({".golangci.yml": "linters: {}\n"}, ["golangci-lint"]),
        ({"Cargo.toml": "[package]\nname='x'\n[lints.clippy]\nall='warn'\n"}, ["clippy"]),
        ({"Cargo.toml": "[package]\nname='x'\n"}, []),  # a crate without clippy config
        ({"pyproject.toml": "[project]\nname='x'\n"}, []),  # no linter named
        ({"pyproject.toml": "[tool.ruff]\n", "eslint.config.js": ""}, ["ruff", "eslint"]),
    ],
)
def test_detected_from_the_files_that_name_them(
    tmp_path: Path, files: dict[str, str], expected: list[str]
) -> None:
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    assert [linter.name for linter in detect(tmp_path)] == expected


def test_the_linter_for_a_file(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text("[tool.ruff]\n")
    (tmp_path / "eslint.config.js").write_text("")
    assert [linter.name for linter in linters_for(tmp_path, "src/a.py")] == ["ruff"]
    assert [linter.name for linter in linters_for(tmp_path, "web/app.tsx")] == ["eslint"]
    assert linters_for(tmp_path, "README.md") == []
    configured = linters_for(tmp_path, "README.md", "mdlint {file}")
    assert configured[0].command_for("docs/my file.md") == "mdlint 'docs/my file.md'"
    assert LINTERS["golangci-lint"].command_for("pkg/x/a.go") == "golangci-lint run ./pkg/x"
    assert LINTERS["golangci-lint"].command_for("main.go") == "golangci-lint run ."


@pytest.mark.parametrize(
    ("linter", "output", "expected"),
    [
        (
            "ruff",
            "src/a.py:1:8: F401 [*] `os` imported but unused\nsrc/b.py:1:1: E999 x\n"
            "src/a.py:3:12: F821 Undefined name `y`\nFound 2 errors.\n",
            [("F401", 1, 8, "`os` imported but unused"), ("F821", 3, 12, "Undefined name `y`")],
        ),
        (
            "flake8",
            "./src/a.py:2:1: E302 expected 2 blank lines, found 1\n",
            [("E302", 2, 1, "expected 2 blank lines, found 1")],
        ),
        (
            "clippy",
            "src/a.py:4:9: warning: unused variable: `x`\nerror: could not compile\n",
            [("", 4, 9, "warning: unused variable: `x`")],
        ),
        (
            "golangci-lint",
            "src/a.py:12:2: ineffectual assignment to err (ineffassign)\n\terr = f()\n\t^\n",
            [("", 12, 2, "ineffectual assignment to err (ineffassign)")],
        ),
        (
            "eslint",
            'noise\n[{"filePath": "/w/src/a.py", "messages": [{"ruleId": "no-unused-vars", '
            '"message": "\'x\' is unused.", "line": 5, "column": 7}]}]',
            [("no-unused-vars", 5, 7, "'x' is unused.")],
        ),
    ],
)
def test_parse_output(linter: str, output: str, expected: list[tuple[str, int, int, str]]) -> None:
    found = parse_output(output, LINTERS[linter], "src/a.py")
    assert [(f.code, f.line, f.column, f.message) for f in found] == expected


RUFF_FULL = """\
F401 [*] `os` imported but unused
 --> src/a.py:1:8
  |
1 | import os
  |        ^^
help: Remove unused import: `os`

E711 Comparison to `None` should be `cond is None`
 --> src/a.py:6:17
  |
6 |     return x == None
  |                 ^^^^

Found 2 errors.
"""
RUFF_GROUPED = "src/a.py:\n  1:8 F401 [*] `os` imported but unused\n\nFound 1 error.\n"
PYLINT_FORMAT = "src/a.py:1: [F401] `os` imported but unused\n"
ESLINT_STYLISH = """
/w/src/a.py
   5:7  error  'x' is assigned a value but never used  no-unused-vars
  9:1  warning  Unexpected console statement  no-console

2 problems (1 error, 1 warning)
"""
RUSTC = "warning: unused variable: `x`\n --> src/a.py:2:9\n  |\n2 |     let x = 1;\n"


@pytest.mark.parametrize(
    ("output", "expected"),
    [
        (
            RUFF_FULL,
            [
                ("F401", 1, 8, "`os` imported but unused"),
                ("E711", 6, 17, "Comparison to `None` should be `cond is None`"),
            ],
        ),
        (RUFF_GROUPED, [("F401", 1, 8, "`os` imported but unused")]),
        (PYLINT_FORMAT, [("F401", 1, 1, "`os` imported but unused")]),
        (
            ESLINT_STYLISH,
            [
                ("no-unused-vars", 5, 7, "'x' is assigned a value but never used"),
                ("no-console", 9, 1, "Unexpected console statement"),
            ],
        ),
        (RUSTC, [("", 2, 9, "warning: unused variable: `x`")]),
    ],
)
def test_every_output_format_of_the_known_linters_is_read(
    output: str, expected: list[tuple[str, int, int, str]]
) -> None:
    """Whatever linter prints it (a user's `cmd: ruff check {file}` gets ruff's default,
    multi-line format, not the concise one coder asks for)."""
    found = parse_output(output, Linter("any", "x {file}", ()), "src/a.py")
    assert [(f.code, f.line, f.column, f.message) for f in found] == expected


def test_a_non_zero_exit_without_a_finding_coder_can_read_decides() -> None:
    linter = Linter("mylint", "mylint {file}", ())
    unread = unread_failure(linter, "a.py", 1, "a.py -- 1 problem (unused import os)\n")
    assert unread == (
        "mylint exited with 1 on a.py, and its output names no finding coder can read, so the "
        "exit status decides: a.py -- 1 problem (unused import os)"
    )
    assert unread_failure(linter, "a.py", 0, "whatever\n") is None
    # findings it can read decide (those about other files or lines do not count)
    assert unread_failure(linter, "a.py", 1, "b.py:3:1: E1 x\n") is None


def test_only_new_findings_count_and_moved_ones_do_not() -> None:
    before_text = "import os\n\nx = undefined\n"
    after_text = "import os\nimport sys\n\nx = undefined\ny = other\n"
    before = [
        Finding("a.py", 1, 8, "F401", "`os` unused"),
        Finding("a.py", 3, 5, "F821", "Undefined name `undefined`"),
    ]
    after = [
        Finding("a.py", 1, 8, "F401", "`os` unused"),
        Finding("a.py", 2, 8, "F401", "`sys` unused"),
        Finding("a.py", 4, 5, "F821", "Undefined name `undefined`"),  # moved one line down
        Finding("a.py", 5, 5, "F821", "Undefined name `other`"),
    ]
    fresh = new_findings(before, before_text, after, after_text)
    assert [str(f) for f in fresh] == [
        "a.py:2:8: F401 `sys` unused",
        "a.py:5:5: F821 Undefined name `other`",
    ]
    twice = [after[0], Finding("a.py", 1, 8, "F401", "`os` unused")]
    assert len(new_findings(before, before_text, twice, before_text)) == 1  # counted, not set


def test_a_custom_linter_applies_to_every_file() -> None:
    assert Linter("custom", "x {file}", ()).applies_to("anything.txt")
