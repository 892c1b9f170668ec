"""What model calls cost (`Usage`), summed over a step or a run; apart from the provider seam
(which re-exports it) so that reading a run's state (`coder status`) needs none of the rest."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any, TypedDict, cast


class UsageRecord(TypedDict, total=False):
    """A Usage as stored (state, events) and shown (`--json`)."""

    prompt_tokens: int
    eval_tokens: int
    prompt_s: float
    eval_s: float
    load_s: float
    total_s: float
    calls: int
    cached_tokens: int
    cache_reports: int
    tokens_per_s: float  # derived, in `as_dict`
    cache_share: float | None  # derived, in a run's total (`coder show`)


@dataclass(frozen=True)
class Usage:
    """What model calls cost; sums with `+` across the calls of a step or a run.

    `cached_tokens` is what the server says it served from its prompt cache (OpenAI-compatible
    `usage.prompt_tokens_details.cached_tokens`, llama.cpp `timings.cache_n`), counted over the
    `cache_reports` calls whose server reported it (Ollama reports none): a measured figure,
    never an estimate."""

    prompt_tokens: int = 0
    eval_tokens: int = 0
    prompt_s: float = 0
    eval_s: float = 0
    load_s: float = 0
    total_s: float = 0
    calls: int = 0
    cached_tokens: int = 0
    cache_reports: int = 0

    def __add__(self, other: Usage) -> Usage:
        if not isinstance(other, Usage):
            return NotImplemented
        sums = {f.name: getattr(self, f.name) + getattr(other, f.name) for f in fields(self)}
        return Usage(**sums)

    @property
    def tokens_per_s(self) -> float:
        """Generation speed (eval tokens per second of eval time); 0 when unknown."""
        return self.eval_tokens / self.eval_s if self.eval_s > 0 else 0.0

    def as_dict(self) -> UsageRecord:
        return cast(UsageRecord, {**asdict(self), "tokens_per_s": self.tokens_per_s})

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> Usage:
        """A Usage from a stored dict (unknown keys, such as tokens_per_s, are ignored)."""
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in (data or {}).items() if k in known})


def cache_share(usage: Mapping[str, Any] | Usage) -> float | None:
    """The share of prompt tokens the server served from its cache, or None when no call
    reported it."""
    u = usage if isinstance(usage, Usage) else Usage.from_dict(usage)
    if not u.cache_reports or not u.prompt_tokens:
        return None
    return u.cached_tokens / u.prompt_tokens
