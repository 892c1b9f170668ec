"""Which tree-sitter grammar reads a file, and one parser per grammar.

The grammars come from `tree-sitter-language-pack` 0.x, which ships them compiled inside its
wheel. (Its 1.x series downloads grammars from GitHub on first use instead: that fails without
network, and would send requests off the machine, so the dependency is pinned below 1.)

Only languages with definition queries in `tags.py` are listed: those are the ones coder can
map, chunk and check. Everything else is plain text to it.
"""

from __future__ import annotations

import functools
import threading
from pathlib import PurePosixPath
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tree_sitter import Language, Parser, Tree

EXTENSIONS: dict[str, str] = {
    ".py": "python",
    ".pyi": "python",
    ".js": "javascript",
    ".mjs": "javascript",
    ".cjs": "javascript",
    ".jsx": "javascript",
    ".ts": "typescript",
    ".mts": "typescript",
    ".cts": "typescript",
    ".tsx": "tsx",
    ".go": "go",
    ".rs": "rust",
    ".java": "java",
    ".c": "c",
    ".h": "c",
    ".cc": "cpp",
    ".cpp": "cpp",
    ".cxx": "cpp",
    ".hh": "cpp",
    ".hpp": "cpp",
    ".hxx": "cpp",
    ".rb": "ruby",
    ".cs": "csharp",
    ".php": "php",
}


# Directories whose files are someone else's (or generated): not parsed, ranked or indexed.
VENDORED = frozenset(
    {
        "node_modules",
        "vendor",
        "third_party",
        "third-party",
        "3rdparty",
        ".venv",
        "venv",
        "site-packages",
        "__pycache__",
        "dist",
        "build",
        "target",
        ".tox",
        ".nox",
        ".mypy_cache",
        ".pytest_cache",
        ".ruff_cache",
        ".idea",
        ".vscode",
        ".coder",
        ".git",
        ".next",
        "coverage",
    }
)


def vendored(path: str) -> bool:
    """Whether a repository path lies in a VENDORED (or *.egg-info) directory."""
    return any(p in VENDORED or p.endswith(".egg-info") for p in PurePosixPath(path).parts[:-1])


def language_of(path: str) -> str | None:
    """The grammar for a repository path, by its extension (None: not code coder reads)."""
    return EXTENSIONS.get(PurePosixPath(path).suffix.lower())


@functools.cache
def grammar(name: str) -> Language:
    from tree_sitter_language_pack import get_language

    return get_language(name)  # type: ignore[arg-type]  # a SupportedLanguage literal


_local = threading.local()  # a parser holds state while it parses: one per thread


def parse_tree(name: str, source: bytes) -> Tree:
    """The syntax tree of `source` in grammar `name`."""
    parsers: dict[str, Parser] = _local.__dict__.setdefault("parsers", {})
    parser = parsers.get(name)
    if parser is None:
        from tree_sitter import Parser

        parser = parsers[name] = Parser(grammar(name))
    return parser.parse(source)
