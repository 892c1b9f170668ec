"""The first syntax error of a source file, and how to show it to a model.

tree-sitter parses every language of `languages.py` the same way and marks what it could not
parse with ERROR and MISSING nodes. Python, JSON, YAML and TOML are also read by Python's own
parsers, and an error counts only when both agree: a grammar that lags the language (new
syntax) or a dialect (JSON with comments, as in `tsconfig.json`) then never refuses a valid
file, and the message and position come from the authoritative parser.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

from coder.context.languages import parse_tree, syntax_language_of

CONTEXT_LINES = 3  # shown above and below the error


@dataclass(frozen=True)
class SyntaxProblem:
    line: int  # 1-based
    column: int  # 1-based
    message: str


def check(path: str, source: bytes) -> SyntaxProblem | None:
    """The first syntax error of `source` (named `path`), or None when it parses or when coder
    has no grammar for it."""
    language = syntax_language_of(path)
    if language is None or b"\0" in source:
        return None
    try:
        problem = _tree_sitter_error(language, source)
    except (RecursionError, MemoryError, ValueError, LookupError):
        return None
    second_opinion = _AUTHORITIES.get(language)
    if problem is None or second_opinion is None:
        return problem
    try:
        return second_opinion(path, source)
    except (ValueError, RecursionError, MemoryError):
        return None


def _tree_sitter_error(language: str, source: bytes) -> SyntaxProblem | None:
    root = parse_tree(language, source).root_node
    if not root.has_error:
        return None
    node = _first_error(root)
    row, col = node.start_point
    if node.is_missing:
        message = f"missing `{node.type}`"
    else:
        text = (node.text or b"").decode("utf-8", errors="replace").strip().split("\n")[0]
        message = f"unexpected `{text[:40]}`" if text else "syntax error"
    line = source.split(b"\n")[row] if row < source.count(b"\n") + 1 else b""
    return SyntaxProblem(row + 1, len(line[:col].decode("utf-8", errors="replace")) + 1, message)


def _first_error(node: Any) -> Any:
    """The first ERROR or MISSING node in document order (descending only into subtrees that
    contain one)."""
    while True:
        if node.is_error or node.is_missing:
            return node
        child = next((c for c in node.children if c.has_error or c.is_missing), None)
        if child is None:
            return node
        node = child


def _python_error(path: str, source: bytes) -> SyntaxProblem | None:
    import ast

    try:
        with warnings.catch_warnings():  # invalid escapes and the like are not errors
            warnings.simplefilter("ignore")
            compile(source, path, "exec", flags=ast.PyCF_ONLY_AST, dont_inherit=True)
    except SyntaxError as exc:
        return SyntaxProblem(exc.lineno or 1, exc.offset or 1, exc.msg)
    return None


def _json_error(_path: str, source: bytes) -> SyntaxProblem | None:
    import json

    try:
        json.loads(source)
    except json.JSONDecodeError as exc:
        return SyntaxProblem(exc.lineno, exc.colno, exc.msg)
    return None


def _yaml_error(_path: str, source: bytes) -> SyntaxProblem | None:
    import yaml

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    try:
        for _event in yaml.parse(source, Loader=loader):  # syntax only: tags are not built
            pass
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        line, column = (mark.line + 1, mark.column + 1) if mark else (1, 1)
        return SyntaxProblem(line, column, exc.problem or "syntax error")
    except yaml.YAMLError:
        return SyntaxProblem(1, 1, "syntax error")
    return None


def _toml_error(_path: str, source: bytes) -> SyntaxProblem | None:
    import re
    import tomllib

    try:
        tomllib.loads(source.decode("utf-8"))
    except tomllib.TOMLDecodeError as exc:
        where = re.search(r"\(at line (\d+), column (\d+)\)", str(exc))
        line, column = (int(where[1]), int(where[2])) if where else (1, 1)
        return SyntaxProblem(line, column, re.sub(r" \(at .*\)$", "", str(exc)))
    except UnicodeDecodeError:
        return None
    return None


# languages with a parser of Python's own, which has the last word (see the module docstring)
_AUTHORITIES = {
    "python": _python_error,
    "json": _json_error,
    "yaml": _yaml_error,
    "toml": _toml_error,
}


def show(text: str, problem: SyntaxProblem, context: int = CONTEXT_LINES) -> str:
    """The lines around the error, numbered like fs_read, with a caret under the column."""
    lines = text.split("\n")
    first = max(1, problem.line - context)
    last = min(len(lines), problem.line + context)
    width = max(5, len(str(last)))
    out = []
    for number in range(first, last + 1):
        out.append(f"{number:>{width}}| {lines[number - 1]}")
        if number == problem.line:
            out.append(" " * (width + 2 + max(0, problem.column - 1)) + "^ " + problem.message)
    return "\n".join(out)
