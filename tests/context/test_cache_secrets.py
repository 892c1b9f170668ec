"""`.coder/cache` keeps no secret the run knows: the repo map's tags and rendered maps and the
code index's chunks are computed from redacted text, no file name is cached, and an entry an
earlier run wrote before it knew a secret (a passed-through variable it did not have) is
dropped and written again without it."""

from __future__ import annotations

from pathlib import Path

import pygit2

from coder.context import repomap, retrieval
from coder.redact import Redactor

SECRET = "zebra42quux"  # one lower-case word: it would be a search token of its own


def _cache_text(cache: Path) -> str:
    return "\n".join(p.read_text() for p in sorted(cache.rglob("*")) if p.is_file())


def test_a_cache_written_before_a_secret_was_known_is_cleaned(make_repo, tmp_path: Path) -> None:
    repo = make_repo(
        {
            "app.py": f'def connect(handle="{SECRET}"):\n    return {SECRET}\n',
            f"docs/{SECRET}.md": "# notes\n",
            "README.md": "# r\n",
        }
    )
    cache = tmp_path / "cache"
    opened = pygit2.Repository(str(repo))

    def both(redactor: Redactor) -> repomap.RepoMap:
        retrieval.search(repo, "connect handle", k=3, cache_dir=cache, redactor=redactor)
        return repomap.build(opened, "HEAD", budget=1000, cache_dir=cache, redactor=redactor)

    unaware = both(Redactor())  # a run that did not know the value
    assert SECRET in unaware.text and SECRET in _cache_text(cache)
    aware = Redactor([SECRET])
    known = both(aware)
    assert SECRET not in known.text and "[REDACTED:known_secret]" in known.text
    assert not known.cached  # the cached map held the secret: built again
    assert SECRET not in _cache_text(cache).lower()
    hits = retrieval.search(repo, "connect handle", k=3, cache_dir=cache, redactor=aware)
    assert [h.chunk.path for h in hits][:1] == ["app.py"]  # still found, by its path and body
    assert both(aware).cached  # and the clean map is reused
