"""Read one YAML document defensively, keeping a line and column for every node.

Hostile input (a directory, binary junk, non-UTF-8 bytes, a 50 MB file, a billion-laughs alias
bomb) becomes one `Problem` with a position instead of a traceback or a hang.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from coder.errors import DocumentError

MAX_BYTES = 4 * 1024 * 1024
MAX_NODES = 200_000  # after alias expansion; a 10,000-step taskfile stays far below


@dataclass(frozen=True)
class Problem:
    """One finding, printed as `FILE:LINE:COL: message` (line and column are 1-based)."""

    file: str
    line: int
    col: int
    message: str
    path: str = ""  # JSON path of the offending field, e.g. $.graph[1].cmd

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.col}: {self.message}"

    def as_dict(self) -> dict[str, Any]:
        return {
            "file": self.file,
            "line": self.line,
            "col": self.col,
            "path": self.path,
            "message": self.message,
        }


_Base: type = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml when present: ~10x faster


class _Loader(_Base):  # type: ignore[misc]
    """SafeLoader with YAML 1.2 booleans (only true/false) and no timestamps: `on`, `yes` and
    `2024-05-01` stay strings, so they can't silently change type under the schema."""


_Loader.yaml_implicit_resolvers = {
    first: [
        (tag, rx)
        for tag, rx in resolvers
        if tag not in ("tag:yaml.org,2002:timestamp", "tag:yaml.org,2002:bool")
    ]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF")
)


@dataclass(frozen=True)
class Document:
    name: str
    data: Any
    root: yaml.Node | None

    def position(self, path: tuple[Any, ...] | list[Any], *, key: bool = False) -> tuple[int, int]:
        """1-based (line, col) of the node at `path`; the nearest existing ancestor when the path
        does not exist. `key=True` points at the mapping key instead of its value."""
        node = self.root
        if node is None:
            return 1, 1
        for depth, part in enumerate(path, 1):
            if isinstance(node, yaml.MappingNode):
                for k, v in node.value:
                    if k.value == part:
                        node = k if key and depth == len(path) else v
                        break
                else:
                    break
            elif (
                isinstance(node, yaml.SequenceNode)
                and isinstance(part, int)
                and part < len(node.value)
            ):
                node = node.value[part]
            else:
                break
        return node.start_mark.line + 1, node.start_mark.column + 1


def read_text(path: Path, name: str) -> str:
    """The file's text, or DocumentError for anything that is not a reasonable text file."""

    def fail(message: str, line: int = 1, col: int = 1) -> DocumentError:
        return DocumentError(Problem(name, line, col, message))

    try:
        if path.is_dir():
            raise fail("is a directory, not a file (pass the YAML file inside it)")
        size = path.stat().st_size
        if size > MAX_BYTES:
            raise fail(
                f"file is too large ({size / 1e6:.1f} MB; the limit is {MAX_BYTES // 2**20} MB)"
            )
        raw = path.read_bytes()
    except FileNotFoundError:
        raise fail("no such file (check the path)") from None
    except PermissionError:
        raise fail("permission denied (check the file's permissions)") from None
    except OSError as exc:
        raise fail(f"cannot read file: {exc.strerror or exc}") from None
    if b"\0" in raw[:8192]:
        raise fail("not a text file (it contains NUL bytes)")
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        col = exc.start - (raw.rfind(b"\n", 0, exc.start) + 1) + 1
        raise fail(
            f"not valid UTF-8 (byte 0x{raw[exc.start]:02x}); save the file as UTF-8", line, col
        ) from None


def parse(text: str, name: str) -> Document:
    """Parse a single YAML document; syntax errors carry the parser's position."""
    loader = _Loader(text)
    try:
        root = loader.get_single_node()
        if root is not None:
            _check_size(root, name)
        data = loader.construct_document(root) if root is not None else None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line, col = (mark.line + 1, mark.column + 1) if mark else (1, 1)
        what = exc.problem or "invalid YAML"
        if exc.context:
            what += f" ({exc.context})"
        raise DocumentError(Problem(name, line, col, f"YAML syntax error: {what}")) from None
    except yaml.YAMLError as exc:
        raise DocumentError(Problem(name, 1, 1, f"YAML error: {exc}")) from None
    except RecursionError:
        raise DocumentError(Problem(name, 1, 1, "YAML nesting is too deep")) from None
    finally:
        loader.dispose()
    return Document(name, data, root)


def load(path: Path, name: str | None = None) -> Document:
    name = name or str(path)
    return parse(read_text(path, name), name)


def _check_size(root: yaml.Node, name: str) -> None:
    """Refuse alias bombs: count nodes as if every alias were expanded (memoised, so the count
    itself stays linear in the document)."""
    sizes: dict[int, int] = {}
    on_path: set[int] = set()

    def size(node: yaml.Node) -> int:
        key = id(node)
        if key in sizes:
            return sizes[key]
        if key in on_path:  # a recursive alias (&a [*a]) would expand forever
            raise DocumentError(
                Problem(
                    name,
                    node.start_mark.line + 1,
                    node.start_mark.column + 1,
                    "recursive YAML alias",
                )
            )
        on_path.add(key)
        if isinstance(node, yaml.MappingNode):
            total = 1 + sum(size(k) + size(v) for k, v in node.value)
        elif isinstance(node, yaml.SequenceNode):
            total = 1 + sum(size(v) for v in node.value)
        else:
            total = 1
        on_path.discard(key)
        sizes[key] = min(total, MAX_NODES + 1)
        return sizes[key]

    if size(root) > MAX_NODES:
        raise DocumentError(
            Problem(
                name,
                1,
                1,
                f"document expands to more than {MAX_NODES:,} nodes "
                "(YAML aliases nested too deeply)",
            )
        )
