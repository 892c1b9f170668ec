"""Which tree-sitter grammar reads a file, and one parser per grammar.

Each language's grammar comes from its own wheel (`tree-sitter-python`, ...: tens to hundreds
of KB each, compiled, no network), listed in `WHEELS`. (The all-in-one
`tree-sitter-language-pack` weighed 184 MB, and its 1.x series downloads grammars at run time:
that fails without network and would send requests off the machine.)

`EXTENSIONS` lists the languages with definition queries in `tags.py`: the ones coder can map,
chunk and check. `SYNTAX_ONLY` ones are only checked (the syntax veto of an edit).
"""

from __future__ import annotations

import functools
import importlib
import threading
from pathlib import PurePosixPath
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tree_sitter import Language, Parser, Tree

# grammar -> (module of its own wheel, the function that returns it)
WHEELS: dict[str, tuple[str, str]] = {
    "python": ("tree_sitter_python", "language"),
    "javascript": ("tree_sitter_javascript", "language"),
    "typescript": ("tree_sitter_typescript", "language_typescript"),
    "tsx": ("tree_sitter_typescript", "language_tsx"),
    "go": ("tree_sitter_go", "language"),
    "rust": ("tree_sitter_rust", "language"),
    "java": ("tree_sitter_java", "language"),
    "c": ("tree_sitter_c", "language"),
    "cpp": ("tree_sitter_cpp", "language"),
    "csharp": ("tree_sitter_c_sharp", "language"),
    "ruby": ("tree_sitter_ruby", "language"),
    "php": ("tree_sitter_php", "language_php"),  # PHP with its HTML around it
    "bash": ("tree_sitter_bash", "language"),
    "json": ("tree_sitter_json", "language"),
    "yaml": ("tree_sitter_yaml", "language"),
    "toml": ("tree_sitter_toml", "language"),
}

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


SYNTAX_ONLY: dict[str, str] = {
    ".sh": "bash",
    ".bash": "bash",
    ".json": "json",
    ".yaml": "yaml",
    ".yml": "yaml",
    ".toml": "toml",
}


def language_of(path: str) -> str | None:
    """The grammar for a repository path, by its extension (None: not code coder reads, or its
    grammar's wheel is missing)."""
    name = EXTENSIONS.get(PurePosixPath(path).suffix.lower())
    return name if name is not None and grammar(name) is not None else None


def syntax_language_of(path: str) -> str | None:
    """The grammar that checks a file's syntax: a code language, or a SYNTAX_ONLY one."""
    name = SYNTAX_ONLY.get(PurePosixPath(path).suffix.lower())
    if name is not None and grammar(name) is not None:
        return name
    return language_of(path)


@functools.cache
def grammar(name: str) -> Language | None:
    """The grammar `name` from its wheel; None if that wheel is not installed."""
    from tree_sitter import Language

    module, function = WHEELS[name]
    try:
        found = importlib.import_module(module)
    except ImportError:
        return None
    return Language(getattr(found, function)())


_local = threading.local()  # a parser holds state while it parses: one per thread


def parse_tree(name: str, source: bytes) -> Tree:
    """The syntax tree of `source` in grammar `name`."""
    parsers: dict[str, Parser] = _local.__dict__.setdefault("parsers", {})
    parser = parsers.get(name)
    if parser is None:
        from tree_sitter import Parser

        language = grammar(name)
        if language is None:
            raise LookupError(f"no tree-sitter grammar for {name} is installed")
        parser = parsers[name] = Parser(language)
    return parser.parse(source)
