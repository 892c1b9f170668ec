"""A request's seed, set for the requests made within `seeded(seed)`.

The config's `seed` is every provider's (coder.models.streaming.settings_of), and a provider is
shared by the steps that use its model at its endpoint. A step tried several ways at once
(coder.run.candidates) needs a seed per attempt instead: each candidate's thread runs within
`seeded(base + k)`, and the providers ask `seed(own)` as they build a request. A context
variable, as coder.models.bounds' bound: it holds in the thread that set it, and reaches a
pool's threads through `contextvars.copy_context()` (coder.models.router).
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator

_current: contextvars.ContextVar[int | None] = contextvars.ContextVar("seed", default=None)


@contextlib.contextmanager
def seeded(seed: int) -> Iterator[None]:
    """The requests made within ask the server for `seed`."""
    token = _current.set(seed)
    try:
        yield
    finally:
        _current.reset(token)


def seed(own: int | None) -> int | None:
    """The seed of a request: the one set by `seeded`, else the provider's `own`."""
    chosen = _current.get()
    return own if chosen is None else chosen
