"""The JSON Schemas in `schemas/`: the single source of truth for every file coder reads.

They ship inside the wheel as `coder/schemas/`; in a source checkout (or an editable install)
they are read from the repository's top-level `schemas/` directory.
"""

from __future__ import annotations

import functools
import json
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from jsonschema.protocols import Validator

TASK_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")  # a task id, as task.schema.json says

NAMES = ("task", "step", "state", "log", "config")

# A JSON Schema document (ours, a tool's parameters, an MCP server's input schema): JSON
# whose shape is the JSON Schema vocabulary, read with `jsonschema`, not by coder's types.
JsonSchema = dict[str, Any]


def schema_dir() -> Path:
    packaged = Path(__file__).parent / "schemas"
    if packaged.is_dir():
        return packaged
    return Path(__file__).resolve().parent.parent / "schemas"


@functools.cache
def load_schema(name: str) -> JsonSchema:
    if name not in NAMES:
        raise KeyError(f"unknown schema {name!r}")
    path = schema_dir() / f"{name}.schema.json"
    with path.open(encoding="utf-8") as fh:
        schema: JsonSchema = json.load(fh)
    return schema


@functools.cache
def validator(name: str) -> Validator:
    """A Draft 2020-12 validator for one schema, its `$ref`s inlined (`bundled`): resolving
    a reference at every step of a 1,000-step taskfile was a quarter of `coder validate`."""
    from jsonschema import Draft202012Validator

    return Draft202012Validator(bundled(name), format_checker=Draft202012Validator.FORMAT_CHECKER)


def bundled(name: str) -> JsonSchema:
    """The schema with every `$ref` inlined (for consumers without a registry, such as
    Ollama's structured output)."""
    by_id = {load_schema(n)["$id"]: load_schema(n) for n in NAMES}

    def inline(node: Any, doc: JsonSchema) -> Any:
        if isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str):
                doc_id, _, pointer = ref.partition("#")
                target_doc = by_id[doc_id] if doc_id else doc
                target: Any = target_doc
                for part in filter(None, pointer.split("/")):
                    target = target[part]
                drop = ("$id", "$schema", "$defs")
                return inline({k: v for k, v in target.items() if k not in drop}, target_doc)
            return {k: inline(v, doc) for k, v in node.items() if k != "$defs"}
        if isinstance(node, list):
            return [inline(v, doc) for v in node]
        return node

    return inline(load_schema(name), load_schema(name))  # type: ignore[no-any-return]
