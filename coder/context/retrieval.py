"""code_search: BM25 over code chunks, optionally fused with embedding similarity.

Chunks: in a file tree-sitter reads, each definition is a chunk (a class without the methods
that have chunks of their own), and the lines outside any definition (imports, module code)
are cut into windows; other text files are cut into windows of WINDOW lines. A chunk's tokens
are its words split at snake_case and camelCase boundaries, lower-cased and lightly stemmed,
plus its path and its definition's name, so "parse the config file" finds `def load_config`
in `config/parser.py`.

The index covers the working directory as it is: files unchanged since HEAD are read from the
HEAD tree, changed and new ones from disk. Chunks are cached per blob id and language
(`blobcache.py`), so a new tree re-chunks only the files that changed, and the BM25 index
is rebuilt from the cached tokens (plus each file's path tokens, never cached) when the
set of files changes and kept in memory for the state it was built for. A chunk's tokens and
name come from text redacted by the run's redactor: no secret becomes a token or a cache entry,
and no file name is cached.

Hybrid: with an embedder (an embedding model configured), BM25's best CANDIDATES chunks are
embedded (vectors cached by chunk content), ranked by cosine similarity to the query, and the
two rankings are fused by reciprocal rank (k=60). Without one, the ranking is BM25's alone.
"""

from __future__ import annotations

import functools
import hashlib
import heapq
import json
import math
import re
import threading
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from coder.context.blobcache import BlobCache, typed
from coder.context.languages import language_of, vendored
from coder.context.repomap import MAX_TAG_BYTES
from coder.context.tags import Definition, extract
from coder.files import nofollow
from coder.files.durable import make_private_dirs, write_atomic
from coder.git.trees import hash_blob
from coder.git.workdir import working_files
from coder.redact import Redactor

VERSION = 2  # 2: entries keyed by blob and language, path tokens no longer cached
WINDOW = 40  # lines per window chunk
MAX_CHUNK_LINES = 120  # a longer definition is split into windows
CANDIDATES = 100  # BM25 hits re-ranked by embeddings
RRF_K = 60
MAX_VECTORS = 50_000  # embeddings kept in the cache (per model)
TEXT_SUFFIXES = frozenset(
    ".md .rst .txt .adoc .toml .yaml .yml .json .cfg .ini .sh .bash .sql .html .css .scss "
    ".vue .svelte .kt .swift .scala .lua .ex .exs .erl .hs .ml .clj .r .jl .pl .dart .gradle "
    ".xml .proto .graphql .tf .mk".split()
)
TEXT_NAMES = frozenset({"makefile", "dockerfile", "readme", "license", "changelog"})

Embedder = Callable[[Sequence[str]], list[list[float]]]

_STOP = frozenset(
    """a an and are as at be by for from has have if in into is it its of on or that the this
    to was were will with not no can do does self none true false return def class import
    get set""".split()
)
_WORDS = re.compile(r"[A-Za-z_][A-Za-z0-9_]*|\d+")
_CAMEL = re.compile(r"[A-Z]+(?=[A-Z][a-z])|[A-Z]?[a-z]+|[A-Z]+|\d+")


def stem(word: str) -> str:
    """A light stemmer (plurals, -ing, -ed, a final e), enough for "parses", "parsed" and
    "parsing" to meet "parse"."""
    if len(word) > 4 and word.endswith("ies"):
        word = word[:-3] + "y"
    elif len(word) > 4 and word.endswith(("sses", "shes", "ches", "xes", "zes")):
        word = word[:-2]
    elif len(word) > 3 and word.endswith("s") and not word.endswith(("ss", "us", "is")):
        word = word[:-1]
    elif len(word) > 5 and word.endswith("ing"):
        word = word[:-3]
    elif len(word) > 4 and word.endswith("ied"):
        word = word[:-3] + "y"
    elif len(word) > 4 and word.endswith("ed"):
        word = word[:-2]
    return word[:-1] if len(word) > 4 and word.endswith("e") else word


@functools.lru_cache(maxsize=65536)
def _word_tokens(word: str) -> tuple[str, ...]:
    parts = [p for piece in word.split("_") for p in _CAMEL.findall(piece)]
    out = [stem(p.lower()) for p in parts if len(p) > 1 or p.isdigit()]
    if len(parts) > 1:
        out.append(word.lower().strip("_"))
    return tuple(t for t in out if t not in _STOP)


def tokenize(text: str) -> list[str]:
    tokens: list[str] = []
    for word in _WORDS.findall(text):
        tokens.extend(_word_tokens(word))
    return tokens


@dataclass(frozen=True)
class Chunk:
    path: str
    start: int  # 1-based, inclusive
    end: int
    name: str  # the definition ("" for a window)


@dataclass(frozen=True)
class Hit:
    chunk: Chunk
    score: float


# --------------------------------------------------------------------------- chunking


def chunk_file(
    path: str, data: bytes, redactor: Redactor | None = None
) -> list[tuple[int, int, str, list[str]]]:
    """(start, end, name, tokens) of each chunk of one file's content (its path only says
    which language it is: path tokens are added by the index), redacted by `redactor` (else
    the built-in secret formats)."""
    scrub = redactor or Redactor()
    text = data.decode("utf-8", errors="replace")
    lines = scrub.redact(text).split("\n")  # no secret becomes a token (or a cache entry)
    if lines and lines[-1] == "":
        lines.pop()
    if not lines:
        return []
    language = language_of(path)
    spans: list[tuple[int, int, str]] = []
    if language is not None:
        spans = _definition_spans(extract(language, data).definitions, len(lines))
    out = []
    for start, end, name in spans or _windows(1, len(lines), ""):
        body = "\n".join(lines[start - 1 : end])
        if not body.strip():
            continue
        name = scrub.redact(name) if name else name
        out.append((start, end, name, tokenize(name) * 2 + tokenize(body)))
    return out


def _definition_spans(defs: Sequence[Definition], total: int) -> list[tuple[int, int, str]]:
    """Each definition's own lines (nested definitions cut out), and windows over the rest."""
    owner = [""] * (total + 2)  # the innermost definition owning each line
    for d in sorted(defs, key=lambda d: (d.line, -d.end)):  # outer first, inner overwrite
        for line in range(d.line, min(d.end, total) + 1):
            owner[line] = f"{d.name}@{d.line}"
    spans: list[tuple[int, int, str]] = []
    line = 1
    while line <= total:
        start, key = line, owner[line]
        while line + 1 <= total and owner[line + 1] == key:
            line += 1
        spans.extend(_windows(start, line, key.rsplit("@", 1)[0]))
        line += 1
    return spans


def _windows(first: int, last: int, name: str) -> list[tuple[int, int, str]]:
    size = MAX_CHUNK_LINES if name else WINDOW
    return [(s, min(last, s + size - 1), name) for s in range(first, last + 1, size)]


def _indexable(path: str) -> bool:
    if vendored(path):
        return False
    pure = PurePosixPath(path)
    return (
        language_of(path) is not None
        or pure.suffix.lower() in TEXT_SUFFIXES
        or pure.stem.lower() in TEXT_NAMES
    )


# --------------------------------------------------------------------------- the index


class CodeIndex:
    """BM25 over the chunks of a set of files ((path, blob id) -> content), Lucene's variant
    (what bm25s computes by default): idf = ln(1 + (N - df + 0.5) / (df + 0.5)), a term's
    weight in a chunk tf / (tf + k1 * (1 - b + b * len / avg len)). In plain Python over an
    inverted index: a query touches only the chunks holding its terms, which costs less than
    loading numpy for the few thousand chunks of a repository."""

    K1 = 1.5
    B = 0.75

    def __init__(self, chunks: list[Chunk], tokens: list[list[str]]) -> None:
        self.chunks = chunks
        postings: dict[str, dict[int, int]] = {}
        for doc, words in enumerate(tokens):
            for word in words:
                counts = postings.setdefault(word, {})
                counts[doc] = counts.get(doc, 0) + 1
        lengths = [len(words) for words in tokens]
        average = sum(lengths) / len(lengths) if lengths else 1.0
        norm = [self.K1 * (1 - self.B + self.B * n / (average or 1.0)) for n in lengths]
        total = len(tokens)
        # per term: its idf and, per chunk holding it, the term's weight there
        self._weights: dict[str, tuple[float, dict[int, float]]] = {
            word: (
                math.log(1 + (total - len(counts) + 0.5) / (len(counts) + 0.5)),
                {doc: tf / (tf + norm[doc]) for doc, tf in counts.items()},
            )
            for word, counts in postings.items()
        }

    def bm25(self, query: str, k: int) -> list[Hit]:
        scores: dict[int, float] = {}
        for term in tokenize(query):  # a repeated word counts again, as in bm25s
            found = self._weights.get(term)
            if found is None:
                continue
            idf, weights = found
            for doc, weight in weights.items():
                scores[doc] = scores.get(doc, 0.0) + idf * weight
        best = heapq.nsmallest(k, scores.items(), key=lambda item: (-item[1], item[0]))
        return [Hit(self.chunks[doc], score) for doc, score in best if score > 0]


def search(
    root: Path,
    query: str,
    *,
    k: int = 10,
    cache_dir: Path | None = None,
    embedder: Embedder | None = None,
    embed_key: str = "",
    redactor: Redactor | None = None,
) -> list[Hit]:
    """The k best chunks of the working directory `root` for `query` (chunk names redacted by
    `redactor`, else the built-in secret formats; the paths are the files' own)."""
    index = index_for(root, cache_dir, redactor or Redactor())
    hits = index.bm25(query, CANDIDATES if embedder else k)
    if embedder is None or not hits:
        return hits[:k]
    return fuse(hits, query, root, embedder, cache_dir, embed_key)[:k]


# (state digest, the secrets it was redacted for) -> index (the latest few; in memory only)
_indexes: dict[tuple[str, frozenset[str]], CodeIndex] = {}
_lock = threading.Lock()


def index_for(root: Path, cache_dir: Path | None, redactor: Redactor | None = None) -> CodeIndex:
    scrub = redactor or Redactor()
    files = worktree_files(root)
    digest = hashlib.sha256(
        "\n".join(f"{p}\0{b}" for p, b, _ in files).encode() + str(cache_dir).encode()
    ).hexdigest()
    memo = (digest, scrub.known)
    with _lock:
        index = _indexes.get(memo)
    if index is not None:
        return index
    stored = cache_dir / f"chunks-v{VERSION}.json" if cache_dir else None
    cache = BlobCache(stored, scrub, valid=_chunks_entry)
    chunks: list[Chunk] = []
    tokens: list[list[str]] = []
    keep = []
    for path, blob, read in files:
        key = f"{blob}:{language_of(path) or 'text'}"  # how it is chunked; no file name
        entry = cache.get(key)
        if entry is None:
            data = read()
            entry = [] if data is None else [list(c) for c in chunk_file(path, data, scrub)]
            cache.put(key, entry)
        keep.append(key)
        path_tokens = tokenize(path)
        for start, end, name, toks in entry:
            chunks.append(Chunk(path, start, end, name))
            tokens.append(path_tokens + toks)
    cache.save(keep)
    index = CodeIndex(chunks, tokens)
    with _lock:
        if len(_indexes) >= 4:
            _indexes.pop(next(iter(_indexes)))
        _indexes[memo] = index
    return index


def _chunks_entry(entry: Any) -> bool:
    """Whether a cached entry is one `chunk_file` gives: [[start, end, name, tokens], ...]."""
    return type(entry) is list and all(
        typed(c, int, int, str, list) and set(map(type, c[3])) <= {str} for c in entry
    )


def worktree_files(root: Path) -> list[tuple[str, str, Callable[[], bytes | None]]]:
    """(path, blob id, reader) of every indexable file of the working directory: HEAD's
    blobs for clean files, the hash of the file on disk for changed or new ones."""
    files = working_files(root)
    base, changed = files.committed, files.changed
    out: list[tuple[str, str, Callable[[], bytes | None]]] = []
    for path in sorted(set(base) | set(changed)):
        if not _indexable(path) or path.startswith(".coder/"):
            continue
        if path not in changed:
            blob = base[path]
            out.append((path, blob, functools.partial(_blob_data, files.read_blob, blob)))
            continue
        data = _file_data(root / path)
        if data is not None:
            out.append((path, hash_blob(data), functools.partial(lambda d: d, data)))
    return out


def _blob_data(read_blob: Callable[[str], bytes], blob: str) -> bytes | None:
    data = read_blob(blob)
    return None if len(data) > MAX_TAG_BYTES or b"\0" in data[:8192] else data


def _file_data(path: Path) -> bytes | None:
    try:
        if path.is_symlink() or not path.is_file() or path.stat().st_size > MAX_TAG_BYTES:
            return None
        data = path.read_bytes()
    except OSError:
        return None
    return None if b"\0" in data[:8192] else data


# --------------------------------------------------------------------------- hybrid


def fuse(
    hits: list[Hit],
    query: str,
    root: Path,
    embedder: Embedder,
    cache_dir: Path | None,
    embed_key: str,
) -> list[Hit]:
    """BM25's ranking and the embedding ranking of the same candidates, fused by reciprocal
    rank: score = sum over rankings of 1 / (RRF_K + rank)."""
    texts = [_chunk_text(root, h.chunk) for h in hits]
    vectors = _embeddings(texts, embedder, cache_dir, embed_key)
    (query_vector,) = embedder([query])
    sims = [_cosine(v, query_vector) for v in vectors]
    order = sorted(range(len(hits)), key=lambda i: (-sims[i], i))
    dense_rank = {i: r for r, i in enumerate(order)}
    fused = [
        Hit(h.chunk, 1.0 / (RRF_K + i + 1) + 1.0 / (RRF_K + dense_rank[i] + 1))
        for i, h in enumerate(hits)
    ]
    return sorted(fused, key=lambda h: -h.score)


def _cosine(a: Sequence[float], b: Sequence[float]) -> float:
    dot = math.fsum(x * y for x, y in zip(a, b, strict=False))
    return dot / (
        math.sqrt(math.fsum(x * x for x in a)) * math.sqrt(math.fsum(y * y for y in b)) + 1e-9
    )


def _chunk_text(root: Path, chunk: Chunk) -> str:
    try:
        lines = (root / chunk.path).read_text(encoding="utf-8", errors="replace").split("\n")
    except OSError:
        lines = []
    return f"{chunk.path}\n" + "\n".join(lines[chunk.start - 1 : chunk.end])[:4000]


def _embeddings(
    texts: list[str], embedder: Embedder, cache_dir: Path | None, embed_key: str
) -> list[array[float]]:
    """Vectors of `texts`, from the cache (by content and model) or the embedder."""
    keys = [hashlib.sha1(t.encode()).hexdigest() for t in texts]
    path = None
    if cache_dir is not None:
        slug = re.sub(r"[^A-Za-z0-9_.-]", "_", embed_key) or "default"
        path = cache_dir / f"embeddings-{slug}.bin"
    known = _load_vectors(path)
    missing = [i for i, key in enumerate(keys) if key not in known]
    if missing:
        for i, vector in zip(missing, embedder([texts[i] for i in missing]), strict=True):
            known[keys[i]] = array("f", vector)
        _save_vectors(path, known)
    return [known[key] for key in keys]


# The vector cache: one JSON line (the keys and the dimension), then the float32 vectors.


def _load_vectors(path: Path | None) -> dict[str, array[float]]:
    """The cached vectors; none when the file is missing or not of the shape `_save_vectors`
    writes (then the vectors are computed again and the file rewritten)."""
    if path is None:
        return {}
    try:
        data = nofollow.read_bytes(path)
        head, _, body = data.partition(b"\n")
        meta = json.loads(head)
        flat = array("f")
        flat.frombytes(body)
    except (OSError, ValueError, RecursionError):
        return {}
    keys, dim = (meta.get("keys"), meta.get("dim")) if isinstance(meta, dict) else (None, None)
    if not (
        isinstance(keys, list)
        and all(type(key) is str for key in keys)
        and type(dim) is int
        and dim > 0
        and len(flat) == dim * len(keys)
    ):
        return {}
    return {key: flat[i * dim : (i + 1) * dim] for i, key in enumerate(keys)}


def _save_vectors(path: Path | None, vectors: dict[str, array[float]]) -> None:
    if path is None or not vectors:
        return
    keys = list(vectors)[-MAX_VECTORS:]  # the newest (insertion order: loaded, then new)
    dim = len(vectors[keys[0]])
    keys = [k for k in keys if len(vectors[k]) == dim]  # a model change of size: keep one
    flat = array("f")
    for key in keys:
        flat.extend(vectors[key])
    data = json.dumps({"keys": keys, "dim": dim}).encode() + b"\n" + flat.tobytes()
    try:
        make_private_dirs(path.parent)
        write_atomic(path, data, crash_point=None)
    except OSError:
        pass
