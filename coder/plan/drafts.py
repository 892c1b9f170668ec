"""The model's answers: the JSON object found in one, and the document coder writes from it
(its own fields set, readable key order)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from coder import yamldoc
from coder.agent.repair import json_objects
from coder.errors import Problem
from coder.plan.spec import Spec

# Key order of the written file: what a reader wants first.
TASK_KEYS = ("id", "title", "spec", "base", "policies", "success", "graph")
STEP_KEYS = (
    "id",
    "kind",
    "goal",
    "depends_on",
    "cmd",
    "cwd",
    "env",
    "framework",
    "args",
    "changes",
    "assert",
    "timeout",
    "retries",
    "on_fail",
    "tools",
)
# Filled in by coder, not by the model: the run resolves them from the config and the id.
DROPPED_KEYS = ("branch", "model", "created_at")


@dataclass(frozen=True)
class Draft:
    """One answer of the model, checked."""

    answer: str  # the model's text
    name: str  # the draft file's name as shown in problems
    text: str  # what the draft file holds: the rendered YAML, or the raw answer
    data: dict[str, Any] | None  # the normalised document, when the answer was a JSON object
    problems: list[Problem]
    task_id: str | None
    target: Path


def parse_answer(content: str, done_reason: str | None, name: str) -> tuple[Any, Problem | None]:
    """The JSON object in a model's answer; a problem (with the position in the answer) if
    there is none. Tolerates a fence or prose around the object (models without `format`)."""
    text = content.strip()
    cut = (
        " (the answer was cut off at the length limit: plan fewer, shorter steps)"
        if done_reason == "length"
        else ""
    )
    if not text:
        return None, Problem(name, 1, 1, f"the answer is empty{cut}")
    try:
        return yamldoc.loads_json(text), None
    except json.JSONDecodeError as exc:
        first = exc
    embedded = _embedded_object(text)
    if embedded is not None:
        return embedded, None
    return None, Problem(
        name, first.lineno, first.colno, f"the answer is not valid JSON: {first.msg}{cut}"
    )


def _embedded_object(text: str) -> dict[str, Any] | None:
    """The first object in the text that looks like a taskfile (models wrap JSON in prose)."""
    return next(
        (
            obj
            for obj in json_objects(text)
            if isinstance(obj, dict) and ("graph" in obj or "title" in obj)
        ),
        None,
    )


def normalise(data: dict[str, Any], spec: Spec, task_id: str) -> dict[str, Any]:
    """The document to write: coder's fields set, readable key order, and step ids by
    position made explicit. A graph without depends_on stays without: written out, the file
    order would become requirements (a skipped step would skip the rest). Unknown keys are
    kept so the schema check reports them."""
    doc: dict[str, Any] = {k: v for k, v in data.items() if k not in DROPPED_KEYS}
    doc["id"], doc["spec"] = task_id, spec.text
    graph = doc.get("graph")
    if isinstance(graph, list) and all(isinstance(s, dict) for s in graph):
        doc["graph"] = [
            _ordered({"id": raw.get("id", f"s{i}"), **raw}, STEP_KEYS)
            for i, raw in enumerate(graph, 1)
        ]
    return _ordered(doc, TASK_KEYS)


def _ordered(mapping: Mapping[str, Any], keys: tuple[str, ...]) -> dict[str, Any]:
    first = {k: mapping[k] for k in keys if k in mapping}
    return {**first, **{k: v for k, v in mapping.items() if k not in first}}
