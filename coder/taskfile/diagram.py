"""The DAG as a picture: boxes by level for the terminal, Mermaid and Graphviz DOT to export.

A `Node` is one step as the picture needs it: what it is (id, kind, goal, needs) and, for a
run, where it stands (status, attempts, commit). The same nodes feed all three renderers, so a
taskfile (`coder show -f`) and a run (`coder show -t`) draw alike; a node without a status is a
step that has not run.

The renderers only lay out text. Colour comes from the caller (`style(status, text)`), so this
module stays free of terminal concerns and the exports stay byte-stable.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from coder.display import escaped
from coder.taskfile import graph

Style = Callable[[str, str], str]  # (status, text) -> text as the terminal shows it

GLYPHS = {
    "success": "✔",
    "failed": "✘",
    "error": "✘",
    "running": "●",
    "interrupted": "⏸",
    "skipped": "↷",
    "pending": "◌",
}
# Fill and stroke per status for the exports (GitHub's palette: readable on light and dark).
COLOURS = {
    "success": ("#dafbe1", "#1a7f37"),
    "failed": ("#ffebe9", "#cf222e"),
    "error": ("#ffebe9", "#cf222e"),
    "running": ("#ddf4ff", "#0969da"),
    "interrupted": ("#fff8c5", "#9a6700"),
    "skipped": ("#fff8c5", "#9a6700"),
    "pending": ("#f6f8fa", "#8c959f"),
}
MIN_WIDTH, MAX_WIDTH = 22, 30  # inside a terminal box


@dataclass(frozen=True)
class Node:
    id: str
    kind: str
    goal: str
    depends_on: tuple[str, ...] = ()
    status: str | None = None  # None: not run (a taskfile)
    attempts: int = 0
    commit: str | None = None

    def state_line(self) -> str:
        """`✔ success · 1 try · 3f2a91c0`; "" for a step that has not run."""
        if self.status is None:
            return ""
        parts = [f"{GLYPHS.get(self.status, '?')} {self.status}"]
        if self.attempts:
            parts.append(f"{self.attempts} {'try' if self.attempts == 1 else 'tries'}")
        if self.commit:
            parts.append(self.commit[:8])
        return " · ".join(parts)

    def goal_line(self) -> str:
        """The goal on one line, its control characters escaped (it is the taskfile's)."""
        return escaped(" ".join(self.goal.split()))


def nodes_of_task(task: Any) -> list[Node]:
    """Nodes of a taskfile (`coder.taskfile.Task`), in file order."""
    return [Node(s.id, s.kind, s.goal, tuple(s.depends_on)) for s in task.steps]


def nodes_of_run(task: Any, steps: Mapping[str, Mapping[str, Any]]) -> list[Node]:
    """Nodes of a run: its task's steps (`coder.taskfile.Task`: a file without depends_on runs
    in file order, no edges written down) with their records' status, attempts and commit as
    `coder show -t --json` prints them, in file order."""
    nodes = []
    for step in task.steps:
        st = steps.get(step.id, {})
        nodes.append(
            Node(
                step.id,
                step.kind,
                step.goal,
                step.depends_on,
                status=st.get("status", "pending"),
                attempts=int(st.get("attempts") or 0),
                commit=st.get("commit"),
            )
        )
    return nodes


def levels_of(nodes: Sequence[Node]) -> list[list[str]]:
    return graph.levels(graph.build({n.id: n.depends_on for n in nodes}))


# --- the terminal ---------------------------------------------------------------------------


def text(nodes: Sequence[Node], *, width: int = 100, style: Style | None = None) -> str:
    """Boxes, one row of boxes per level (wrapped to `width`), each box naming the steps it
    needs; a legend of the statuses shown. `style` colours a box by its node's status."""
    paint = style or (lambda _status, s: s)
    by_id = {n.id: n for n in nodes}
    levels = levels_of(nodes)
    label_width = len(f"level {len(levels)}") + 2
    inner = max(12, min(_box_width(nodes), width - label_width - 4))
    bodies = {n.id: _box_body(n, inner) for n in nodes}
    height = max(len(b) for b in bodies.values())
    per_row = max(1, (width - label_width + 2) // (inner + 6))
    lines: list[str] = []
    for number, level in enumerate(levels, 1):
        for start in range(0, len(level), per_row):
            row = level[start : start + per_row]
            boxes = [_frame(bodies[sid], inner, height) for sid in row]
            for i in range(height + 2):
                prefix = f"level {number}" if (i == 0 and start == 0) else ""
                cells = "  ".join(
                    paint(by_id[sid].status or "pending", box[i]) for sid, box in zip(row, boxes)
                )
                lines.append(f"{prefix:<{label_width}}{cells}".rstrip())
    shown = [s for s in GLYPHS if any(n.status == s for n in nodes)]
    if shown:
        lines.append("")
        lines.append("  ".join(paint(s, f"{GLYPHS[s]} {s}") for s in shown))
    return "\n".join(lines) + "\n"


def _box_width(nodes: Sequence[Node]) -> int:
    wanted = max(
        max(len(_title(n)) + (len(_needs(n)) + 2 if n.depends_on else 0), len(n.state_line()))
        for n in nodes
    )
    return max(MIN_WIDTH, min(MAX_WIDTH, wanted))


def _title(node: Node) -> str:
    return f"{node.id} · {node.kind}"


def _needs(node: Node) -> str:
    return "← " + ", ".join(node.depends_on)


def _box_body(node: Node, inner: int) -> list[str]:
    """The lines inside a box: id and kind (and what it needs, on the same line when it fits),
    the run's status line, the goal."""
    title, needs = _title(node), _needs(node) if node.depends_on else ""
    if not needs:
        body = [title]
    elif len(title) + 2 + len(needs) <= inner:
        body = [title + " " * (inner - len(title) - len(needs)) + needs]
    else:
        body = [title, needs]
    if node.status is not None:
        body.append(node.state_line())
    body.append(node.goal_line())
    return [_clip(line, inner) for line in body]


def _frame(body: list[str], inner: int, height: int) -> list[str]:
    padded = body + [""] * (height - len(body))
    return (
        [f"╭{'─' * (inner + 2)}╮"]
        + [f"│ {line:<{inner}} │" for line in padded]
        + [f"╰{'─' * (inner + 2)}╯"]
    )


def _clip(line: str, limit: int) -> str:
    return line if len(line) <= limit else line[: limit - 1] + "…"


# --- exports --------------------------------------------------------------------------------

_UNSAFE_ID = re.compile(r"[^A-Za-z0-9_]")


def node_ids(nodes: Sequence[Node]) -> dict[str, str]:
    """Step id -> an id safe in Mermaid and DOT: letters, digits and `_`, never a keyword
    (`end`, `graph`, `subgraph`...): always prefixed, made unique by position if needed."""
    out: dict[str, str] = {}
    for position, node in enumerate(nodes, 1):
        safe = "step_" + _UNSAFE_ID.sub("_", node.id)
        out[node.id] = safe if safe not in out.values() else f"{safe}_{position}"
    return out


def _export_label(node: Node) -> list[str]:
    lines = [_title(node)]
    if node.status is not None:
        lines.append(node.state_line())
    goal = node.goal_line()
    if goal:
        lines.append(_clip(goal, 48))
    return lines


def _mermaid_text(text: str) -> str:
    """Text safe inside a quoted Mermaid label: entity codes for what the parser would read
    as syntax (`"`), as an entity (`#`) or as HTML / Markdown (`<`, `>`, `&`, backtick)."""
    for char, code in (
        ("#", "#35;"),
        ('"', "#quot;"),
        ("<", "#lt;"),
        (">", "#gt;"),
        ("&", "#amp;"),
        ("`", "#96;"),
    ):
        text = text.replace(char, code)
    return text


def mermaid(nodes: Sequence[Node]) -> str:
    """A Mermaid flowchart (top to bottom), statuses as classes; GitHub and GitLab render it
    inside a ```mermaid block."""
    ids = node_ids(nodes)
    lines = ["flowchart TD"]
    for node in nodes:
        label = "<br/>".join(_mermaid_text(line) for line in _export_label(node))
        lines.append(f'    {ids[node.id]}["{label}"]')
    for node in nodes:
        for dep in node.depends_on:
            if dep in ids:
                lines.append(f"    {ids[dep]} --> {ids[node.id]}")
    used = [s for s in COLOURS if any(n.status == s for n in nodes)]
    for status in used:
        fill, stroke = COLOURS[status]
        lines.append(f"    classDef {status} fill:{fill},stroke:{stroke},color:#1f2328")
    for status in used:
        members = ",".join(ids[n.id] for n in nodes if n.status == status)
        lines.append(f"    class {members} {status}")
    return "\n".join(lines) + "\n"


def _dot_text(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"')


def dot(nodes: Sequence[Node], *, title: str = "") -> str:
    """A Graphviz digraph (`dot -Tsvg`), statuses as fill colours."""
    ids = node_ids(nodes)
    lines = ["digraph coder {"]
    if title:
        lines.append(f'    label="{_dot_text(escaped(" ".join(title.split())))}";')
        lines.append("    labelloc=t;")
    lines.append('    fontname="Helvetica";')
    lines.append("    rankdir=TB;")
    lines.append(
        '    node [shape=box, style="rounded,filled", fillcolor="#ffffff", fontname="Helvetica"];'
    )
    for node in nodes:
        label = "\\n".join(_dot_text(line) for line in _export_label(node))
        colour = ""
        if node.status in COLOURS:
            fill, stroke = COLOURS[node.status]
            colour = f', fillcolor="{fill}", color="{stroke}"'
        lines.append(f'    {ids[node.id]} [label="{label}"{colour}];')
    for node in nodes:
        for dep in node.depends_on:
            if dep in ids:
                lines.append(f"    {ids[dep]} -> {ids[node.id]};")
    lines.append("}")
    return "\n".join(lines) + "\n"
