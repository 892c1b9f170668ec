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
from coder.safeio import read_regular

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


_LINE = re.compile(
    r"^(?P<path>[^\s:][^:\n]*?):(?P<line>\d+):(?:(?P<col>\d+):)?\s*(?P<rest>\S.*)$", re.M
)
_CODE = re.compile(
    r"^(?:(?:warning|error):\s*)?(?P<code>[A-Z]+[0-9]+)\b:?\s*(?:\[\*\]\s*)?(?P<msg>.*)$"
)


def parse_output(output: str, linter: Linter, path: str) -> list[Finding]:
    """The findings about `path` in a linter's output."""
    if linter.output == "eslint-json":
        return _eslint(output, path)
    found = []
    for m in _LINE.finditer(output):
        if _normal(m["path"]) != path:
            continue
        rest = m["rest"].strip()
        code_match = _CODE.match(rest)
        code, message = (code_match["code"], code_match["msg"]) if code_match else ("", rest)
        found.append(Finding(path, int(m["line"]), int(m["col"] or 1), code, message.strip()))
    return found


def _eslint(output: str, path: str) -> list[Finding]:
    start = output.find("[")
    try:
        reports = json.loads(output[start:]) if start >= 0 else []
    except ValueError:
        return []
    found = []
    for report in reports if isinstance(reports, list) else []:
        file_path = str(report.get("filePath", ""))
        if not (file_path == path or file_path.endswith("/" + path)):
            continue
        for m in report.get("messages", []):
            found.append(
                Finding(
                    path,
                    int(m.get("line") or 1),
                    int(m.get("column") or 1),
                    str(m.get("ruleId") or ""),
                    str(m.get("message", "")).strip(),
                )
            )
    return found


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
