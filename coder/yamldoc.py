"""Read one YAML (or JSON) document defensively, keeping a line and column for every node.

Hostile input becomes one or more `Problem`s with a position, never a traceback, a crash or a
hang, and costs bounded time, memory and output:

    a directory, FIFO or device      refused before a byte is read
    a 50 MB file, binary, non-UTF-8  refused (size, NUL bytes, the bad byte's position)
    30,000 nested `[`                refused while libyaml's parser streams its events, before
                                     anything recursive (the composer is C code that overflows
                                     the stack; the scanner is quadratic in flow depth) sees it
    a billion-laughs alias bomb      refused by counting nodes and text as if every alias were
    or one 2 MB value used 3,000x    expanded (memoised, so the count stays linear)
    duplicate keys                   refused, naming both lines (YAML would keep the last)
    a 100 KB value in an error       quoted cut short (`quote`)

JSON files (coder.config.json) take the same checks: JSON is YAML, so the YAML parser gives
their positions and duplicate keys, while `json` gives the values (`parse_json`). JSON from
elsewhere (a model's tool arguments, a recording) goes through `loads_json`, whose cheap scan
of the text bounds the nesting before `json` recurses into it.
"""

from __future__ import annotations

import json
import os
import re
import stat
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from coder.errors import DocumentError, Problem
from coder.files.safeio import file_kind

if TYPE_CHECKING:
    import yaml

MAX_BYTES = 4 * 1024 * 1024
MAX_NODES = 200_000  # after alias expansion; a 10,000-step taskfile stays far below
MAX_TEXT = MAX_BYTES  # characters of scalar text after alias expansion
MAX_DEPTH = 64  # nested mappings and sequences; a taskfile needs 5
QUOTE_LIMIT = 60  # characters of a value quoted in a message
MAX_REPORTED = 100  # duplicate keys reported at once


def quote(value: Any, limit: int = QUOTE_LIMIT) -> str:
    """`repr(value)` for a message, cut to about `limit` characters with the full length said."""
    text = repr(value)
    if len(text) <= limit:
        return text
    size = f"{len(value):,} characters" if isinstance(value, str) else f"{len(text):,} as text"
    return f"{text[:limit]}… ({size})"


@cache
def _loader() -> type:
    """SafeLoader (libyaml's when present: ~10x faster) with YAML 1.2 booleans (only
    true/false) and no timestamps: `on`, `yes` and `2024-05-01` stay strings, so they can't
    silently change type under the schema. Built on first use, as yaml is imported: reading
    only JSON (a run's files: `coder status`, `show -t`) needs none of it (~20 ms)."""
    import yaml

    base: type = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

    class Loader(base):  # type: ignore[misc]
        pass

    Loader.yaml_implicit_resolvers = {
        first: [
            (tag, rx)
            for tag, rx in resolvers
            if tag not in ("tag:yaml.org,2002:timestamp", "tag:yaml.org,2002:bool")
        ]
        for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
    }
    Loader.add_implicit_resolver(
        "tag:yaml.org,2002:bool",
        re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"),
        list("tTfF"),
    )
    return Loader


_STR = "tag:yaml.org,2002:str"
_MERGE = "tag:yaml.org,2002:merge"


@dataclass(frozen=True)
class Document:
    name: str
    data: Any
    root: yaml.Node | None
    syntax: str = "YAML"  # or "JSON": how messages name the file's types

    def node(self, path: tuple[Any, ...] | list[Any], *, key: bool = False) -> yaml.Node | None:
        """The node at `path`; the nearest existing ancestor when the path does not exist.
        `key=True` gives the mapping key instead of its value."""
        import yaml

        node = self.root
        if node is None:
            return None
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
        return node

    def position(self, path: tuple[Any, ...] | list[Any], *, key: bool = False) -> tuple[int, int]:
        """1-based (line, col) of `node(path, key=key)`; (1, 1) without a document."""
        node = self.node(path, key=key)
        if node is None:
            return 1, 1
        return _at(node.start_mark)


def read_text(path: Path, name: str) -> str:
    """The file's text, or DocumentError for anything that is not a reasonable text file.

    The file is opened without blocking and checked through the open descriptor, so a FIFO or
    a device (`/dev/zero`) is refused before a byte is read, and a file that grows after the
    check is still read no further than the limit."""

    def fail(message: str, line: int = 1, col: int = 1) -> DocumentError:
        return DocumentError(Problem(name, line, col, message))

    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except FileNotFoundError:
        raise fail("no such file (check the path)") from None
    except PermissionError:
        raise fail("permission denied (check the file's permissions)") from None
    except OSError as exc:
        raise fail(f"cannot read file: {exc.strerror or exc}") from None
    try:
        info = os.fstat(fd)
        if stat.S_ISDIR(info.st_mode):
            raise fail("is a directory, not a file (pass the YAML file inside it)")
        if not stat.S_ISREG(info.st_mode):
            kind = file_kind(info.st_mode)
            raise fail(f"is {kind}, not a regular file; save the content to a file")
        if info.st_size > MAX_BYTES:
            raise fail(
                f"file is too large ({info.st_size / 1e6:.1f} MB; "
                f"the limit is {MAX_BYTES // 2**20} MB)"
            )
        with os.fdopen(os.dup(fd), "rb") as fh:
            raw = fh.read(MAX_BYTES + 1)
    except OSError as exc:
        raise fail(f"cannot read file: {exc.strerror or exc}") from None
    finally:
        os.close(fd)
    if len(raw) > MAX_BYTES:
        raise fail(f"file is too large (it grew past the limit of {MAX_BYTES // 2**20} MB)")
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
    import yaml

    root, loader = _compose(text, name)
    try:
        if root is not None:
            _check_tree(root, name, loader)
        data = loader.construct_document(root) if root is not None else None
    except yaml.YAMLError as exc:
        raise _syntax_error(exc, name, text) from None
    finally:
        loader.dispose()
    return Document(name, data, root)


def parse_json(text: str, name: str) -> Document:
    """A JSON document: values as `json` reads them (YAML 1.1 differs on numbers like 1e5),
    nodes, depth and duplicate keys as for YAML."""
    try:
        data = loads_json(text)
    except json.JSONDecodeError as exc:
        raise DocumentError(
            Problem(name, exc.lineno, exc.colno, f"invalid JSON: {exc.msg}")
        ) from None
    try:
        root, loader = _compose(text, name)
    except DocumentError:  # JSON libyaml cannot read (surrogate-pair escapes): values only
        return Document(name, data, None, "JSON")
    try:
        if root is not None:
            _check_tree(root, name, loader)
    finally:
        loader.dispose()
    return Document(name, data, root, "JSON")


def load(path: Path, name: str | None = None) -> Document:
    name = name or str(path)
    return parse(read_text(path, name), name)


def loads_json(text: str | bytes) -> Any:
    """`json.loads` for JSON from outside (a model, a recording, a repository's file): nesting
    deeper than MAX_DEPTH is a `json.JSONDecodeError` like any other bad JSON, never a
    RecursionError nor a 1,000-level structure for the code after it."""
    if isinstance(text, bytes | bytearray):
        text = text.decode("utf-8")
    _json_depth_check(text)
    return json.loads(text)


def _too_deep(name: str, line: int, col: int) -> DocumentError:
    return DocumentError(
        Problem(
            name,
            line,
            col,
            f"nesting is too deep (more than {MAX_DEPTH} levels of lists and mappings)",
        )
    )


def _syntax_error(exc: yaml.YAMLError, name: str, text: str = "") -> DocumentError:
    import yaml

    if isinstance(exc, yaml.MarkedYAMLError):
        line, col = _at(exc.problem_mark or exc.context_mark)
        if exc.problem == "exceeded maximum nesting depth":  # libyaml's own flow limit (1,000)
            return _too_deep(name, line, col)
        what = exc.problem or "invalid YAML"
        if exc.context:
            what += f" ({exc.context})"
        if "tab" not in what and _char_at(text, line, col) == "\t":  # libyaml did not say
            what += "; the character is a tab, and YAML indents with spaces only"
        return DocumentError(Problem(name, line, col, f"YAML syntax error: {what}"))
    return DocumentError(Problem(name, 1, 1, f"YAML error: {exc}"))


def _compose(text: str, name: str) -> tuple[yaml.Node | None, Any]:
    """The document's node graph and the loader that built it (the caller disposes of it).

    libyaml's parser is iterative, but the composer that builds nodes recurses in C and the
    scanner slows down quadratically with flow depth: stream the events first, counting
    depth and nodes, and stop at the first level or node past the limits."""
    import yaml

    scan = _loader()(text)
    try:
        depth = nodes = 0
        while scan.check_event():
            event = scan.get_event()
            if isinstance(event, yaml.CollectionStartEvent):
                depth += 1
                if depth > MAX_DEPTH:
                    raise _too_deep(name, *_at(event.start_mark))
            elif isinstance(event, yaml.CollectionEndEvent):
                depth -= 1
                continue
            elif not isinstance(event, yaml.ScalarEvent | yaml.AliasEvent):
                continue
            nodes += 1
            if nodes > MAX_NODES:
                raise DocumentError(
                    Problem(name, 1, 1, f"document has more than {MAX_NODES:,} nodes")
                )
    except yaml.YAMLError as exc:
        raise _syntax_error(exc, name, text) from None
    finally:
        scan.dispose()
    loader = _loader()(text)
    try:
        return loader.get_single_node(), loader
    except yaml.YAMLError as exc:
        loader.dispose()
        raise _syntax_error(exc, name, text) from None


def _char_at(text: str, line: int, col: int) -> str:
    """The character at 1-based (line, col) of ``text``, or ""."""
    lines = text.split("\n", line)
    if len(lines) < line:
        return ""
    row = lines[line - 1]
    return row[col - 1] if 0 < col <= len(row) else ""


def _at(mark: Any) -> tuple[int, int]:
    """1-based (line, col) of a libyaml mark (which may be missing)."""
    return (mark.line + 1, mark.column + 1) if mark is not None else (1, 1)


def _too_big(name: str, what: str) -> Problem:
    return Problem(
        name, 1, 1, f"document expands to {what} through its aliases (*name repeats &name)"
    )


def _check_tree(root: yaml.Node, name: str, loader: Any) -> None:
    """Refuse alias bombs and duplicate keys, visiting each node once.

    Sizes are counted as if every alias were expanded (nodes, and characters of scalar text),
    memoised per node so the count itself stays linear in the document. The recursion is
    bounded by MAX_DEPTH, already checked."""
    import yaml

    sizes: dict[int, tuple[int, int]] = {}
    on_path: set[int] = set()
    duplicates: list[Problem] = []

    def size(node: yaml.Node) -> tuple[int, int]:
        key = id(node)
        if key in sizes:
            return sizes[key]
        if key in on_path:  # a recursive alias (&a [*a]) would expand forever
            line, col = _at(node.start_mark)
            raise DocumentError(Problem(name, line, col, "recursive YAML alias"))
        on_path.add(key)
        if isinstance(node, yaml.MappingNode):
            duplicates.extend(_duplicate_keys(node, name, loader))
            children = [n for pair in node.value for n in pair]
        elif isinstance(node, yaml.SequenceNode):
            children = node.value
        else:
            children = []
        count, chars = 1, len(node.value) if isinstance(node, yaml.ScalarNode) else 0
        for child in children:
            c, t = size(child)
            count, chars = min(count + c, MAX_NODES + 1), min(chars + t, MAX_TEXT + 1)
        on_path.discard(key)
        sizes[key] = count, chars
        return count, chars

    count, chars = size(root)
    if count > MAX_NODES:
        raise DocumentError(_too_big(name, f"more than {MAX_NODES:,} nodes"))
    if chars > MAX_TEXT:
        raise DocumentError(_too_big(name, f"more than {MAX_TEXT // 2**20} MB of text"))
    if duplicates:
        raise DocumentError(*sorted(duplicates, key=lambda p: (p.line, p.col))[:MAX_REPORTED])


def _duplicate_keys(node: yaml.MappingNode, name: str, loader: Any) -> list[Problem]:
    """A key given twice in one mapping: YAML and JSON parsers keep the last one silently,
    so `cmd: echo 1` then `cmd: rm -rf x` would run the second. Merge keys (`<<`) are
    exempt: overriding a merged value is what they are for."""
    import yaml

    seen: dict[Any, tuple[int, int]] = {}
    found = []
    for key_node, _ in node.value:
        if not isinstance(key_node, yaml.ScalarNode) or key_node.tag == _MERGE:
            continue
        key = _key_value(key_node, loader)
        line, col = _at(key_node.start_mark)
        if key in seen:
            first, first_col = seen[key]
            where = (  # one line (JSON often is): the columns tell them apart
                f"first at column {first_col}, again at column {col} of line {line}"
                if first == line
                else f"first at line {first}, again at line {line}"
            )
            found.append(
                Problem(
                    name,
                    line,
                    col,
                    f"duplicate key {quote(key)} ({where}); keep one: the last would silently win",
                )
            )
        else:
            seen[key] = (line, col)
    return found


def _key_value(node: yaml.ScalarNode, loader: Any) -> Any:
    import yaml

    if node.tag == _STR:
        return node.value
    try:  # `1` and `0x1` are one key
        value = loader.construct_object(node)
        hash(value)
        return value
    except (yaml.YAMLError, TypeError):
        return (node.tag, node.value)


_JSON_TOKENS = re.compile(r'"(?:[^"\\]|\\.)*"?|[\[\]{}]', re.S)


def _json_depth_check(text: str) -> None:
    """JSONDecodeError at the first `[` or `{` nested deeper than MAX_DEPTH (strings skipped:
    exact for JSON, a bound for broken JSON, which `json` refuses anyway)."""
    depth = 0
    for match in _JSON_TOKENS.finditer(text):
        token = match.group()
        if token in "[{":
            depth += 1
            if depth > MAX_DEPTH:
                message = f"nesting is too deep (more than {MAX_DEPTH} levels)"
                raise json.JSONDecodeError(message, text, match.start())
        elif token in "]}":
            depth -= 1


# --- messages about values -----------------------------------------------------------------


def schema_message(doc: Document, error: Any) -> str:
    """A jsonschema error as one short line: what was expected and what the file has (as
    written, for scalars), with long values cut."""
    import yaml

    instance = error.instance
    if error.validator == "type":
        wanted = error.validator_value
        wanted = [wanted] if isinstance(wanted, str) else list(wanted)
        expected = " or ".join(_TYPE_NAMES.get(w, w) for w in wanted)
        node = doc.node(list(error.absolute_path))
        written = node.value if isinstance(node, yaml.ScalarNode) else None
        got = _describe_value(instance, written, doc.syntax)
        quote_it = "string" in wanted and isinstance(instance, bool | int | float | type(None))
        return f"must be {expected}, got {got}" + ("; quote it" if quote_it else "")
    if error.validator in ("maxLength", "minLength") and isinstance(instance, str):
        bound = error.validator_value
        side = "long" if error.validator == "maxLength" else "short"
        limit = "at most" if side == "long" else "at least"
        return (
            f"{quote(instance)} is too {side} ({len(instance):,} characters; "
            f"{limit} {bound:,} allowed)"
        )
    message: str = error.message
    full = repr(instance)
    if len(full) > QUOTE_LIMIT and full in message:
        message = message.replace(full, quote(instance))
    return message


_TYPE_NAMES = {
    "string": "a string",
    "integer": "a whole number",
    "number": "a number",
    "boolean": "true or false",
    "array": "a list",
    "object": "a mapping",
    "null": "null",
}


def _describe_value(value: Any, written: str | None, syntax: str) -> str:
    if isinstance(value, bool):
        kind = "boolean"
    elif isinstance(value, int | float):
        kind = "number"
    elif value is None:
        return f"a {syntax} null `{written}`" if written else "nothing (the value is empty)"
    elif isinstance(value, list):
        return "a list"
    elif isinstance(value, dict):
        return "a mapping"
    else:
        return f"the string {quote(value)}"
    shown = written if written is not None else json.dumps(value)
    return f"a {syntax} {kind} `{shown[:QUOTE_LIMIT]}`"


def did_you_mean(word: str, choices: list[str]) -> str:
    """` (did you mean 'x'?)` naming the choice closest to a mistyped `word`, or ""."""
    import difflib

    close = difflib.get_close_matches(word, choices, n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""
