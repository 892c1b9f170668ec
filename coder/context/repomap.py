"""The ranked repository map: the definitions that matter most, within a token budget.

Built from a commit (never from a working directory), in four steps, the way Aider's repo map
works:

1. tags: each code file's definitions and references (`tags.py`), cached by blob id;
2. a graph of files: A -> B when A uses a name that B defines, weighted by how often, by how
   specific the name is (long names count more; private `_x` and names defined in many files
   count less), by whether the task mentions it
   and by how few files use it (a name used everywhere, like `path`, says little);
3. personalised PageRank over that graph, the teleport vector pointing at the files and names
   the task mentions, so the map leans toward the work at hand; each file's rank then flows
   along its edges to the definitions it uses;
4. the best-ranked definitions, grouped by file with their line numbers and first lines, as many
   as fit the budget; the remaining files are listed by name while room is left.

The rendered map is cached under `.coder/cache/repomap/` by tree id, budget and focus, so every
step of a run and every later run of the same tree and task get the same bytes for the cost of
reading one file. What is cached and returned is redacted by the run's redactor (file names and
first lines can hold a secret); a cached map holding a secret the run knows is built again.

PageRank is computed here in plain Python (power iteration, the same definition and stopping
rule as networkx's): `networkx.pagerank` needs scipy and numpy, 100 MB of wheels coder
otherwise has no use for.
"""

from __future__ import annotations

import hashlib
import math
import os
import re
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

from coder.context.blobcache import BlobCache, typed, write_text
from coder.context.languages import language_of, vendored
from coder.context.tags import Definition, FileTags, extract
from coder.files import nofollow
from coder.git import trees
from coder.git.trees import blob_data
from coder.redact import Redactor

if TYPE_CHECKING:
    from coder.git.repository import Repo

VERSION = 1  # bump when the tags or the rendering change: old caches are then ignored
CHARS_PER_TOKEN = 4  # as the agent loop estimates
MAX_TAG_BYTES = 512 * 1024  # larger files are likely generated: listed, not parsed
MIN_BUDGET, MAX_BUDGET = 512, 8192
KEEP_MAPS = 32  # rendered maps kept in .coder/cache/repomap/
_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]{2,}")
_PATHLIKE = re.compile(r"[\w./-]+\.\w+|[\w.-]+/[\w./-]+")


def default_budget(num_ctx: int | None) -> int:
    """Tokens for the map when the config does not say: an eighth of the context window."""
    return max(MIN_BUDGET, min(MAX_BUDGET, (num_ctx or 8192) // 8))


@dataclass(frozen=True)
class Focus:
    """What the map leans toward: paths and words the task mentions."""

    files: frozenset[str] = frozenset()
    words: frozenset[str] = frozenset()

    @classmethod
    def of(cls, texts: Iterable[str], files: Iterable[str] = ()) -> Focus:
        words: set[str] = set()
        paths = set(files)
        for text in texts:
            words.update(w for w in _WORD.findall(text) if _specific(w))
            paths.update(m.strip("./") for m in _PATHLIKE.findall(text))
        return cls(frozenset(p for p in paths if p), frozenset(words))

    @classmethod
    def of_task(cls, task: Mapping[str, Any]) -> Focus:
        """Everything a taskfile says it is about: title, spec, goals and `changes`."""
        texts = [str(task.get("title") or ""), str(task.get("spec") or "")]
        files: list[str] = []
        for step in task.get("graph") or []:
            texts.append(str(step.get("goal") or ""))
            files += [str(c.get("path")) for c in step.get("changes") or [] if c.get("path")]
        return cls.of(texts, files)

    def key(self) -> str:
        return "\n".join(sorted(self.files)) + "\0" + "\n".join(sorted(self.words))


def _specific(word: str) -> bool:
    """A word that likely names code (snake_case, camelCase, digits, or long), not prose such
    as "add" or "test"."""
    inner = word.strip("_")
    return len(word) >= 6 or "_" in inner or inner[1:] != inner[1:].lower() or not word.isalpha()


@dataclass(frozen=True)
class RepoMap:
    text: str
    files: int  # files in the tree
    definitions: int  # definitions shown
    tokens: int  # estimated
    cached: bool  # the rendered map came from the cache
    seconds: float


def build(
    repo: Repo,
    commit: str,
    *,
    budget: int,
    focus: Focus = Focus(),
    cache_dir: Path | None = None,
    redactor: Redactor | None = None,
) -> RepoMap:
    """The map of `commit` (see the module docstring), at most `budget` tokens, redacted by
    `redactor` (else the built-in secret formats)."""
    started = time.perf_counter()

    scrub = redactor or Redactor()

    tree_id = trees.tree_id(repo, commit)
    rendered = None
    if cache_dir is not None:
        digest = hashlib.sha256(
            f"{VERSION}\0{tree_id}\0{budget}\0{focus.key()}".encode()
        ).hexdigest()[:32]
        rendered = cache_dir / "repomap" / f"{digest}.txt"
        try:
            text = nofollow.read_bytes(rendered).decode("utf-8")
            header, _, body = text.partition("\n")
            files, definitions = (int(n) for n in header.split())
            if scrub.mentions_known(body):  # written before the secret was known
                raise ValueError("built again")
            return RepoMap(
                body, files, definitions, _tokens(body), True, time.perf_counter() - started
            )
        except (OSError, ValueError):
            pass
    blobs = trees.tree_blobs(repo, tree_id)
    paths = [path for path, _ in blobs]
    if budget <= 0:  # no map (repo_map_tokens: 0): nothing is parsed
        return RepoMap("", len(paths), 0, 0, False, time.perf_counter() - started)
    text, shown = render(paths, file_tags(repo, blobs, cache_dir, scrub), focus, budget)
    text = scrub.redact(text)
    if rendered is not None:
        write_text(rendered, f"{len(paths)} {shown}\n{text}")
        _prune(rendered.parent)
    return RepoMap(text, len(paths), shown, _tokens(text), False, time.perf_counter() - started)


def _prune(folder: Path, keep: int = KEEP_MAPS) -> None:
    """Only the most recently written maps stay (one per tree, budget and task). The folder
    is reached, and its entries removed, without following a link (coder.files.nofollow): a link
    planted at `.coder/cache/repomap` leaves what it names alone."""
    try:
        with nofollow.open_dir(folder) as fd:
            found = [(os.stat(n, dir_fd=fd, follow_symlinks=False), n) for n in os.listdir(fd)]
            maps = sorted(found, key=lambda entry: entry[0].st_mtime, reverse=True)
            for _, old in maps[keep:]:
                os.unlink(old, dir_fd=fd)
    except OSError:
        pass


def file_tags(
    repo: Repo,
    blobs: Sequence[tuple[str, str]],
    cache_dir: Path | None,
    redactor: Redactor,
) -> dict[str, FileTags]:
    """Tags of every code file among `blobs` ((path, blob id)), from the cache when known;
    names and first lines redacted by `redactor` before they are cached."""
    stored = cache_dir / f"tags-v{VERSION}.json" if cache_dir else None
    cache = BlobCache(stored, redactor, valid=_tags_entry)
    out: dict[str, FileTags] = {}
    keep = []
    for path, blob in blobs:
        language = language_of(path)
        if language is None or vendored(path):
            continue
        key = f"{language}:{blob}"
        keep.append(key)
        entry = cache.get(key)
        if entry is None:
            data = blob_data(repo, blob)
            tags = FileTags((), {}) if len(data) > MAX_TAG_BYTES else extract(language, data)
            entry = _redacted_tags(tags, redactor)
            cache.put(key, entry)
        out[path] = FileTags(tuple(Definition.from_list(d) for d in entry[0]), dict(entry[1]))
    cache.save(keep)
    return out


def _tags_entry(entry: Any) -> bool:
    """Whether a cached entry is one `_redacted_tags` writes: [definitions, references]."""
    return (
        typed(entry, list, dict)
        and all(typed(d, str, str, int, int, str) for d in entry[0])
        and set(map(type, entry[1].values())) <= {int}
    )


def _redacted_tags(tags: FileTags, redactor: Redactor) -> list[Any]:
    """A cache entry of `tags`: names and first lines redacted, a reference that names a
    secret left out (one scan of the whole file's worth when nothing is to be redacted, the
    common case)."""
    definitions = [d.as_list() for d in tags.definitions]
    texts = [t for d in tags.definitions for t in (d.name, d.signature)] + list(tags.references)
    joined = "\n".join(texts)
    if redactor.redact(joined) == joined:
        return [definitions, tags.references]
    definitions = [
        [redactor.redact(d.name), d.kind, d.line, d.end, redactor.redact(d.signature)]
        for d in tags.definitions
    ]
    references = {k: n for k, n in tags.references.items() if redactor.redact(k) == k}
    return [definitions, references]


def _tokens(text: str) -> int:
    return -(-len(text) // CHARS_PER_TOKEN)


# --------------------------------------------------------------------------- ranking


def rank(
    paths: Sequence[str], tags: Mapping[str, FileTags], focus: Focus
) -> tuple[list[tuple[str, str]], dict[str, float]]:
    """(file, name) definitions, best first, and each file's PageRank."""
    index = {p: i for i, p in enumerate(paths)}
    defined: dict[str, set[str]] = {}
    for path, t in tags.items():
        for d in t.definitions:
            defined.setdefault(d.name, set()).add(path)
    mentioned = {p for p in paths if p in focus.files or _basename_in(p, focus.files)}
    weights: dict[tuple[int, int], float] = {}
    uses: list[tuple[int, str, str, float]] = []  # (referrer, definer, name, weight)
    referrers: dict[str, int] = {}
    for t in tags.values():
        for name in t.references:
            referrers[name] = referrers.get(name, 0) + 1
    for path, t in tags.items():
        for name, count in t.references.items():
            definers = defined.get(name)
            if not definers:
                continue
            w = _name_weight(name, len(definers), name in focus.words) * count**0.5
            w *= math.log((len(tags) + 1) / referrers[name])  # used everywhere: says little
            for target in definers:
                if target != path:
                    key = (index[path], index[target])
                    weights[key] = weights.get(key, 0.0) + w
                    uses.append((index[path], target, name, w))
    personal = [1.0] * len(paths)
    for path in mentioned:
        personal[index[path]] += 100.0
    for name in focus.words & defined.keys():
        for path in defined[name]:
            personal[index[path]] += 10.0
    edges = [(src, target, w) for (src, target), w in weights.items()]
    ranks = pagerank(len(paths), edges, personal)
    out_weight = [0.0] * len(paths)
    for src, _target, w in edges:
        out_weight[src] += w
    score: dict[tuple[str, str], float] = {}
    for src, target, name, w in uses:
        score[(target, name)] = score.get((target, name), 0.0) + ranks[src] * w / out_weight[src]
    file_rank = {p: float(ranks[i]) for p, i in index.items()}
    for path, t in tags.items():  # what the task names ranks high even when nothing uses
        for name in {d.name for d in t.definitions}:  # it yet; the rest keeps its place
            own = (path, name)
            boost = file_rank[path] if path in mentioned or name in focus.words else 0.0
            score[own] = (score.get(own, 0.0) + boost) * (10 if name in focus.words else 1)
    order = sorted(score, key=lambda k: (-score[k], -file_rank[k[0]], k[0], k[1]))
    return order, file_rank


def _basename_in(path: str, mentioned: frozenset[str]) -> bool:
    return PurePosixPath(path).name in mentioned


def _name_weight(name: str, definers: int, mentioned: bool) -> float:
    weight = 1.0
    if mentioned:
        weight *= 10
    if len(name) >= 8 and ("_" in name.strip("_") or not name.islower()):
        weight *= 10  # a specific name (snake_case or camelCase): a real dependency
    if name.startswith("_"):
        weight *= 0.1
    if definers > 5:
        weight *= 0.1  # defined everywhere (`run`, `name`): says little
    return weight


def pagerank(
    n: int,
    edges: Sequence[tuple[int, int, float]],
    personalization: Sequence[float],
    *,
    alpha: float = 0.85,
    tol: float = 1.0e-6,
    max_iter: int = 100,
) -> list[float]:
    """Weighted personalised PageRank by power iteration over (source, target, weight)
    edges: networkx's `pagerank` (dangling nodes jump by the personalization vector; stop
    when the L1 change is below n * tol)."""
    if n == 0:
        return []
    total = sum(personalization)
    p = [v / total for v in personalization]
    out = [0.0] * n
    for src, _target, w in edges:
        out[src] += w
    dangling = [i for i in range(n) if out[i] == 0]
    # per target: the sources linking to it, and the share of each source's rank it gets
    into: list[list[tuple[int, float]]] = [[] for _ in range(n)]
    for src, target, w in edges:
        into[target].append((src, w / out[src]))
    x = [1.0 / n] * n
    for _ in range(max_iter):
        last = x
        jump = alpha * math.fsum(last[i] for i in dangling) + (1 - alpha)
        x = [
            alpha * sum(last[s] * share for s, share in links) + jump * p_i
            for links, p_i in zip(into, p, strict=True)
        ]
        if sum(abs(a - b) for a, b in zip(x, last, strict=True)) < n * tol:
            break
    return x


# --------------------------------------------------------------------------- rendering


def render(
    paths: Sequence[str], tags: Mapping[str, FileTags], focus: Focus, budget: int
) -> tuple[str, int]:
    """The map text within `budget` tokens and the number of definitions it shows."""
    order, file_rank = rank(paths, tags, focus) if paths else ([], {})
    room = budget * CHARS_PER_TOKEN - _NOTE_ROOM  # keep room to say what was left out
    lo, hi = 0, len(order)
    while lo < hi:  # the most definitions that fit
        mid = (lo + hi + 1) // 2
        if len(_definitions_text(order[:mid], tags)) <= room:
            lo = mid
        else:
            hi = mid - 1
    text = _definitions_text(order[:lo], tags)
    shown_files = {path for path, _ in order[:lo]}
    others = sorted(
        (p for p in paths if p not in shown_files), key=lambda p: (-file_rank.get(p, 0.0), p)
    )
    return text + _others_text(others, budget * CHARS_PER_TOKEN - len(text), bool(text)), lo


_NOTE_ROOM = 64  # characters of "[... N more files; fs_glob lists them]"


def _definitions_text(chosen: Sequence[tuple[str, str]], tags: Mapping[str, FileTags]) -> str:
    by_file: dict[str, set[str]] = {}
    for path, name in chosen:
        by_file.setdefault(path, set()).add(name)
    blocks = []
    for path, names in by_file.items():  # first-ranked file first
        defs = tags[path].definitions
        picked = [d for d in defs if d.name in names]
        shown = {d for d in defs if any(_encloses(d, p) for p in picked)} | set(picked)
        width = len(str(max(d.line for d in shown)))
        lines = [f"{d.line:>{width}}| {d.signature}" for d in sorted(shown, key=_position)]
        blocks.append(path + "\n" + "\n".join(lines))
    return "\n".join(blocks)


def _encloses(outer: Definition, inner: Definition) -> bool:
    return outer.line <= inner.line and inner.end <= outer.end and outer != inner


def _position(d: Definition) -> tuple[int, int]:
    return d.line, -d.end


def _others_text(others: Sequence[str], room: int, after_definitions: bool) -> str:
    """The files not shown above, by rank, as many as fit in `room` characters."""
    if not others:
        return ""
    sep = "\n" if after_definitions else ""
    head = f"{sep}{'Other files' if after_definitions else 'Files'} ({len(others)}):"
    note = f"\n[... {len(others)} more files; fs_glob lists them]"
    left = room - len(head) - len(note)
    listed: list[str] = []
    for path in others:
        if left < len(path) + 1:
            break
        listed.append(path)
        left -= len(path) + 1
    if not listed:
        short = f"{sep}[{len(others)} files not shown; fs_glob lists them]"
        return short if len(short) <= room else ""
    text = head + "\n" + "\n".join(listed)
    if len(listed) < len(others):
        text += f"\n[... {len(others) - len(listed)} more files; fs_glob lists them]"
    return text
