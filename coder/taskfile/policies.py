"""A taskfile's `policies`, read once: a frozen `Policies` with its durations in seconds, its
defaults filled in and each value of its one type, which the run hands down to whatever
applies it (the executor, the steps, the tools, preflight).

The schema (`schemas/task.schema.json`, `policies`) checked the document first, so a bad value
has already been reported at its FILE:LINE:COL and named by its field; nothing here judges a
value again. A policy left unset that the config also sets (`timeout`, `max_turns`, ...) is
None: the config's value applies, and where it is applied says which config key.

Not to be confused with `coder.policy`: what commands may do, from the config (a taskfile can
only narrow it, with `allow_network: false`).

Adding a policy: a field here, its entry in the schema, and the one place that applies it.
A policy the config and the command line also set (a field of coder.config.PerRun, which has
its default) is None here when unset: coder.run.settings.resolve finds it by its name.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from coder.errors import InvalidInput


@dataclass(frozen=True)
class Policies:
    approvals: str | None = None  # None: the command's default (coder.run.approvals)
    run_tests_after_each_edit: bool = False
    veto_syntax_errors: bool = True
    lint_after_edit: bool = True
    allow_network: bool | None = None  # only False does anything: a taskfile cannot widen
    max_diff_lines: int | None = None  # per step
    max_files_changed: int | None = None  # per step
    max_parallel: int | None = None  # None: the config's max_parallel
    retries: int = 0  # a step's own `retries` wins
    timeout: int | None = None  # seconds per step; None: the config's step/command timeout
    max_turns: int | None = None  # None: the config's max_turns
    max_tokens: int | None = None  # per step; None: the config's max_step_tokens
    run_max_tokens: int | None = None  # None: the config's run_max_tokens
    run_timeout: int | None = None  # seconds; None: the config's run_timeout

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Policies:
        """The policies of a schema-checked taskfile document (its `policies` mapping)."""
        values = {f.name: data[f.name] for f in fields(cls) if f.name in data}
        for name in DURATIONS & values.keys():
            values[name] = parse_duration(values[name])
        return cls(**values)

    def to_dict(self) -> dict[str, Any]:
        """The policies as a taskfile document writes them: those that differ from their
        default (durations in seconds), so reading them back gives the same `Policies`."""
        return {
            f.name: getattr(self, f.name)
            for f in fields(self)
            if getattr(self, f.name) != f.default
        }


DURATIONS = frozenset({"timeout", "run_timeout"})
_DURATION = re.compile(r"^([1-9][0-9]*)(s|m|h)$")


def parse_duration(value: int | str) -> int:
    """Seconds from 90, "90s", "5m" or "1h" (already checked by the schema)."""
    if isinstance(value, int):
        return value
    match = _DURATION.match(value)
    if not match:
        raise InvalidInput(f"not a duration: {value!r} (use seconds, or 90s, 5m, 1h)")
    return int(match[1]) * {"s": 1, "m": 60, "h": 3600}[match[2]]
