"""A plan as the readable YAML file that is written (and checked, line by line)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any


def render(doc: Mapping[str, Any], header: str = "") -> str:
    """Readable YAML: block style, multi-line strings as `|` blocks, short lists of scalars
    inline (`depends_on: [s1]`), a blank line between steps."""
    import yaml

    class Dumper(yaml.SafeDumper):
        def increase_indent(self, flow: bool = False, indentless: bool = False) -> None:
            super().increase_indent(flow, False)  # indent lists under their key

    def text(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
        return dumper.represent_scalar(
            "tag:yaml.org,2002:str", value, style="|" if "\n" in value else None
        )

    def sequence(dumper: yaml.SafeDumper, value: list[Any]) -> yaml.Node:
        inline = (
            all(isinstance(v, (str, int, float, bool)) and "\n" not in str(v) for v in value)
            and len(json.dumps(value)) <= 60
        )
        return dumper.represent_sequence("tag:yaml.org,2002:seq", value, flow_style=inline)

    def inline(dumper: yaml.SafeDumper, value: _Inline) -> yaml.Node:
        return dumper.represent_mapping("tag:yaml.org,2002:map", dict(value), flow_style=True)

    Dumper.add_representer(str, text)
    Dumper.add_representer(list, sequence)
    Dumper.add_representer(_Inline, inline)
    body = yaml.dump(
        _with_inline(doc),
        Dumper=Dumper,
        sort_keys=False,
        allow_unicode=True,
        width=100,
        default_flow_style=False,
    )
    lines, in_graph = body.splitlines(), False
    out: list[str] = []
    for line in lines:
        if in_graph and line.startswith("  - ") and out and not out[-1].endswith(":"):
            out.append("")
        if line and not line.startswith(" "):  # a top-level key
            in_graph = line == "graph:"
        out.append(line)
    return header + "\n".join(out) + "\n"


class _Inline(dict[str, Any]):
    """A small mapping written on one line: `{path: calc.py, mode: patch}`."""


def _with_inline(doc: Mapping[str, Any]) -> dict[str, Any]:
    def small(value: Any) -> Any:
        if (
            isinstance(value, dict)
            and len(json.dumps(value)) <= 70
            and all(
                isinstance(v, (str, int, float, bool)) and "\n" not in str(v)
                for v in value.values()
            )
        ):
            return _Inline(value)
        return value

    out = dict(doc)
    if isinstance(out.get("graph"), list):
        out["graph"] = [
            {
                k: (
                    [small(v) for v in value]
                    if k in ("changes", "assert") and isinstance(value, list)
                    else small(value)
                    if k == "on_fail"
                    else value
                )
                for k, value in step.items()
            }
            if isinstance(step, dict)
            else step
            for step in out["graph"]
        ]
    return out
