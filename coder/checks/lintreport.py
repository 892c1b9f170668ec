"""Which linter checks a file, and what its output says.

Like `testreport.py` for tests: `linters_for` picks the command (the configured `lint_command`,
else the linters the project's files name: `[tool.ruff]`, `.flake8`, an ESLint config,
`.golangci.yml`, a clippy config), `parse_output` reads the findings, and two rules tell the
findings a change introduced:

* `new_findings` (one edit: the file linted before and after): a finding's identity is its
  rule, its message and the text of its line, never its line number, so findings that only
  moved with the edit are not new;
* a whole run, against its base: the findings on the lines the run added or changed
  (`coder.git.diffs.added_lines`), which needs no second lint of the base.

Running the command is the caller's job, through the sandbox like every command.
"""

from __future__ import annotations

import json
import re
import shlex
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from coder.errors import InvalidInput
from coder.files.safeio import read_regular

PYTHON = (".py", ".pyi")
JAVASCRIPT = (".js", ".jsx", ".mjs", ".cjs", ".ts", ".tsx", ".mts", ".cts")


@dataclass(frozen=True)
class Linter:
    name: str
    command: str  # {file} is the repo-relative file, {dir} its directory (both quoted)
    suffixes: tuple[str, ...]  # the files it checks; () means every file
    output: str = "lines"  # "lines" (path:line[:col]: message) or "eslint-json"

    def applies_to(self, path: str) -> bool:
        return not self.suffixes or PurePosixPath(path).suffix.lower() in self.suffixes

    def command_for(self, path: str) -> str:
        folder = PurePosixPath(path).parent.as_posix()
        return self.command.replace("{file}", shlex.quote(path)).replace(
            "{dir}", shlex.quote("./" + folder if folder != "." else ".")
        )


LINTERS: dict[str, Linter] = {
    "ruff": Linter("ruff", "ruff check --no-cache --quiet --output-format=concise {file}", PYTHON),
    "flake8": Linter("flake8", "python -m flake8 {file}", PYTHON),
    "eslint": Linter(
        "eslint", "npx --no-install eslint --format json {file}", JAVASCRIPT, "eslint-json"
    ),
    "golangci-lint": Linter("golangci-lint", "golangci-lint run {dir}", (".go",)),
    "clippy": Linter("clippy", "cargo clippy --quiet --message-format=short", (".rs",)),
}


@dataclass(frozen=True)
class Finding:
    path: str
    line: int
    column: int
    code: str  # the rule (F401, no-unused-vars, ...); "" when the linter does not say
    message: str

    def __str__(self) -> str:
        code = f"{self.code} " if self.code else ""
        return f"{self.path}:{self.line}:{self.column}: {code}{self.message}"


def linters_for(root: Path, path: str, configured: str | None = None) -> list[Linter]:
    """The linters that check `path` in the project at `root`."""
    if configured:
        return [Linter("lint_command", configured, ())]
    return [linter for linter in detect(root) if linter.applies_to(path)]


def lint_commands(root: Path, configured: str | None = None) -> list[Linter]:
    """Every linter of the project at `root`; InvalidInput when there is none."""
    linters = [Linter("lint_command", configured, ())] if configured else detect(root)
    if not linters:
        raise InvalidInput(
            f"no linter is configured or detected in {root}",
            hint="set `lint_command` in coder.config.json (with {file} for the file), or `cmd` "
            "on the lint step",
        )
    return linters


def detect(root: Path) -> list[Linter]:
    """The linters the project's own files name (a linter it does not use would only add
    findings the project does not care about)."""

    def has(*names: str) -> bool:
        return any((root / name).is_file() for name in names)

    def mentions(name: str, *words: str) -> bool:
        try:  # a fifo a command left there is refused, not waited on
            text = read_regular(root / name).decode("utf-8", errors="replace")
        except OSError:
            return False
        return any(word in text for word in words)

    found = []
    if has("ruff.toml", ".ruff.toml") or mentions("pyproject.toml", "[tool.ruff"):
        found.append(LINTERS["ruff"])
    elif has(".flake8") or mentions("setup.cfg", "[flake8]") or mentions("tox.ini", "[flake8]"):
        found.append(LINTERS["flake8"])
    eslint_configs = [f"eslint.config.{ext}" for ext in ("js", "mjs", "cjs", "ts", "mts")]
    eslint_configs += [f".eslintrc{ext}" for ext in ("", ".js", ".cjs", ".json", ".yml", ".yaml")]
    if has(*eslint_configs) or mentions("package.json", '"eslintConfig"'):
        found.append(LINTERS["eslint"])
    if has(".golangci.yml", ".golangci.yaml", ".golangci.toml", ".golangci.json"):
        found.append(LINTERS["golangci-lint"])
    if has("clippy.toml", ".clippy.toml") or mentions("Cargo.toml", "lints.clippy]"):
        found.append(LINTERS["clippy"])
    return found


# The output formats coder reads (any linter may print any of them):
# `path:line[:col]: [CODE] message` (ruff concise and pylint, flake8, pylint, golangci-lint, mypy);
_LINE = re.compile(
    r"^(?P<path>[^\s:][^:\n]*?):(?P<line>\d+):(?:(?P<col>\d+):)?\s*(?P<rest>\S.*)$", re.M
)
# a message line, then ` --> path:line:col` under it (ruff's default, rustc and clippy);
_ARROW = re.compile(r"^\s*-->\s*(?P<path>[^\s:][^:\n]*?):(?P<line>\d+)(?::(?P<col>\d+))?\s*$")
# a file's path alone on a line, then `  line:col  message` lines (ruff grouped, ESLint's
# default "stylish");
_HEADER = re.compile(r"^(?P<path>[^\s:][^\s:]*?):?\s*$")
_ENTRY = re.compile(r"^\s+(?P<line>\d+):(?P<col>\d+)\s+(?P<rest>\S.*)$")
# and ESLint's JSON (`Linter.output`).
_CODE = re.compile(
    r"^(?:(?:warning|error)(?:\[[\w-]+\])?:\s*)?\[?(?P<code>[A-Z]+[0-9]+)\b\]?:?\s*"
    r"(?:\[\*\]\s*)?(?P<msg>.*)$"
)


def parse_output(output: str, linter: Linter, path: str) -> list[Finding]:
    """The findings about `path` in a linter's output."""
    about = [f for f in parse_all(output, linter) if f.path == path]
    absolute = [f for f in parse_all(output, linter) if f.path.startswith("/")]  # ESLint's
    return about + [f for f in absolute if f.path.endswith("/" + path)]


def parse_all(output: str, linter: Linter) -> list[Finding]:
    """Every finding a linter's output names, whatever file it is about, in any of the
    formats above (paths as printed, `./` dropped)."""
    if linter.output == "eslint-json":
        return _eslint(output)
    found: list[Finding] = []
    for m in _LINE.finditer(output):
        found.append(_finding(m["path"], m["line"], m["col"], m["rest"]))
    lines = output.splitlines()
    header: str | None = None
    for i, text in enumerate(lines):
        if arrow := _ARROW.match(text):
            above = next((t for t in reversed(lines[:i]) if t.strip()), "")
            found.append(_finding(arrow["path"], arrow["line"], arrow["col"], above))
        elif entry := _ENTRY.match(text):
            if header is not None:
                found.append(_finding(header, entry["line"], entry["col"], entry["rest"]))
        elif head := _HEADER.match(text):
            header = head["path"] if "." in head["path"] or "/" in head["path"] else None
        elif not text.strip():
            header = None
    return found


def _finding(path: str, line: str, col: str | None, rest: str) -> Finding:
    rest = rest.strip()
    parts = re.split(r"\s{2,}", rest)
    if len(parts) >= 2 and parts[0] in ("error", "warning"):  # ESLint: severity, message, rule
        code = parts[-1] if len(parts) > 2 else ""
        message = "  ".join(parts[1:-1] if len(parts) > 2 else parts[1:])
        return Finding(_normal(path), int(line), int(col or 1), code, message)
    code_match = _CODE.match(rest)
    code, message = (code_match["code"], code_match["msg"]) if code_match else ("", rest)
    return Finding(_normal(path), int(line), int(col or 1), code, message.strip())


def _eslint(output: str) -> list[Finding]:
    start = output.find("[")
    try:
        reports = json.loads(output[start:]) if start >= 0 else []
    except ValueError:
        return []
    found = []
    for report in reports if isinstance(reports, list) else []:
        file_path = _normal(str(report.get("filePath", "")))
        for m in report.get("messages", []):
            found.append(
                Finding(
                    file_path,
                    int(m.get("line") or 1),
                    int(m.get("column") or 1),
                    str(m.get("ruleId") or ""),
                    str(m.get("message", "")).strip(),
                )
            )
    return found


def unread_failure(linter: Linter, path: str, exit_code: int | None, output: str) -> str | None:
    """Why a linter's run proves nothing clean although it named no finding coder could read:
    it exited non-zero (the exit status decides), with the end of what it printed; else
    None. A linter that exits non-zero with findings in its output is read by them (the
    findings outside the changed lines do not count)."""
    if exit_code in (0, None) or parse_all(output, linter):  # None: stopped, not judged
        return None
    last = [line.strip() for line in output.strip().splitlines() if line.strip()][-3:]
    said = f": {' | '.join(last)[:300]}" if last else " and printed nothing"
    return (
        f"{linter.name} exited with {exit_code} on {path}, and its output names no finding "
        f"coder can read, so the exit status decides{said}"
    )


def _normal(path: str) -> str:
    return PurePosixPath(path.strip()).as_posix().removeprefix("./")


def new_findings(
    before: Sequence[Finding], before_text: str, after: Sequence[Finding], after_text: str
) -> list[Finding]:
    """The findings of `after` that `before` did not have (compared by rule, message and the
    text of their line, as many times as each occurred)."""
    old_lines, new_lines = before_text.split("\n"), after_text.split("\n")
    seen = Counter(_identity(f, old_lines) for f in before)
    fresh = []
    for finding in after:
        key = _identity(finding, new_lines)
        if seen[key]:
            seen[key] -= 1
        else:
            fresh.append(finding)
    return fresh


def _identity(finding: Finding, lines: list[str]) -> tuple[str, str, str]:
    text = lines[finding.line - 1].strip() if 0 < finding.line <= len(lines) else ""
    return finding.code, finding.message, text
