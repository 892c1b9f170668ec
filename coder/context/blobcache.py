"""Results computed from one file's content, cached by its git blob id under `.coder/cache/`.

A blob id names the content, so a cached entry never goes stale: the next build of a changed
tree reparses only the blobs it has not seen. Each cache is one JSON file holding the entries
of the last tree it was saved for (older ones are pruned), written atomically; two runs saving
at once leave one complete file, and a missing or unreadable one is rebuilt.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from coder.durable import write_atomic


class BlobCache:
    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._entries: dict[str, Any] | None = None
        self._dirty = False

    @property
    def entries(self) -> dict[str, Any]:
        if self._entries is None:
            self._entries = _load(self.path)
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
            self.path.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(
                self.path, json.dumps(kept, separators=(",", ":")).encode(), crash_point=None
            )
        except OSError:
            return
        self._entries, self._dirty = kept, False


def _load(path: Path | None) -> dict[str, Any]:
    if path is None:
        return {}
    try:
        data = json.loads(path.read_bytes())
    except (OSError, ValueError, RecursionError):
        return {}
    return data if isinstance(data, dict) else {}


def write_text(path: Path, text: str) -> None:
    """A derived file (a rendered map, an index) written atomically; errors ignored."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, text.encode("utf-8"), crash_point=None)
    except OSError:
        pass
