"""Results computed from one file's content, cached by its git blob id under `.coder/cache/`.

A blob id names the content, so a cached entry never goes stale: the next build of a changed
tree reparses only the blobs it has not seen. Each cache is one JSON file holding the entries
of the last tree it was saved for (older ones are pruned), written atomically; two runs saving
at once leave one complete file, and a missing or unreadable one is rebuilt. So is an entry
that does not have the shape its cache writes (`valid`): the file is anyone's to edit, and a
hand-made or foreign entry is dropped, computed again, and the file rewritten without it.

No secret the run knows is kept: entries are computed from redacted text (the callers redact
with the run's redactor), and an entry an earlier run wrote before it knew a secret is dropped
when loaded (recomputed, and the file rewritten without it).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from coder.files import nofollow
from coder.files.durable import make_private_dirs, write_atomic

if TYPE_CHECKING:
    from coder.redact import Redactor


class BlobCache:
    def __init__(
        self,
        path: Path | None,
        redactor: Redactor | None = None,
        *,
        valid: Callable[[Any], bool] = lambda _entry: True,
    ) -> None:
        self.path = path
        self.redactor = redactor
        self.valid = valid  # whether a loaded entry has the shape this cache writes
        self._entries: dict[str, Any] | None = None
        self._dirty = False

    @property
    def entries(self) -> dict[str, Any]:
        if self._entries is None:
            self._entries, self._dirty = _load(self.path, self.redactor, self.valid)
        return self._entries

    def get(self, blob: str) -> Any:
        return self.entries.get(blob)

    def put(self, blob: str, value: Any) -> None:
        self.entries[blob] = value
        self._dirty = True

    def save(self, keep: Iterable[str]) -> None:
        """Write the entries of the blobs in `keep` (no-op when nothing changed or without a
        cache directory; a cache that cannot be written is only a slower next build)."""
        if self.path is None:
            return
        wanted = set(keep)
        entries = self.entries
        if not self._dirty and wanted >= entries.keys():
            return
        kept = {k: v for k, v in entries.items() if k in wanted}
        try:
            make_private_dirs(self.path.parent)
            write_atomic(
                self.path, json.dumps(kept, separators=(",", ":")).encode(), crash_point=None
            )
        except OSError:
            return
        self._entries, self._dirty = kept, False


def _load(
    path: Path | None, redactor: Redactor | None, valid: Callable[[Any], bool]
) -> tuple[dict[str, Any], bool]:
    """The entries, and whether some were dropped: for holding a known secret, or for not
    having the shape `valid` checks."""
    if path is None:
        return {}, False
    try:
        text = nofollow.read_bytes(path).decode("utf-8")
        data = json.loads(text)
    except (OSError, ValueError, RecursionError):
        return {}, False
    if not isinstance(data, dict):
        return {}, True
    entries = {k: v for k, v in data.items() if valid(v)}
    if redactor is not None and redactor.mentions_known(text):
        entries = {k: v for k, v in entries.items() if not redactor.mentions_known(f"{k} {v}")}
    return entries, len(entries) != len(data)


def typed(item: Any, *types: type) -> bool:
    """Whether `item` is a list of exactly these types (`int` is no `bool`, nor a float):
    the shape of a cache entry as JSON gives it back."""
    return type(item) is list and tuple(map(type, item)) == types  # C loops: 20,000 files


def write_text(path: Path, text: str) -> None:
    """A derived file (a rendered map, an index) written atomically; errors ignored."""
    try:
        make_private_dirs(path.parent)
        write_atomic(path, text.encode("utf-8"), crash_point=None)
    except OSError:
        pass
