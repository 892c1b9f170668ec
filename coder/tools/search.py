"""code_search: find code by what it does, not by an exact string (`coder.context.retrieval`).

The model asks in words ("where is the config file parsed"); it gets the best chunks of the
working directory as it is now (its own edits included): path, line range, the definition's
name, its first line and the lines that match, capped.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Required, TypedDict

from coder.context import retrieval
from coder.context.retrieval import tokenize
from coder.errors import CoderError
from coder.tools.base import Tool, ToolContext, ToolResult, params, prop
from coder.tools.worktree import glob_regex, normalize_glob, numbered, real_root

MAX_RESULTS = 20
RESULT_CHARS = 6000
MATCH_LINES = 3  # matching lines shown per hit, besides its first line


class SearchArgs(TypedDict, total=False):
    query: Required[str]
    limit: int
    glob: str


def code_search(ctx: ToolContext, args: SearchArgs) -> ToolResult:
    query = str(args["query"]).strip()
    if not retrieval.tokenize(query):
        return ToolResult.error(
            "the query has no searchable words",
            hint="describe the code in words, e.g. `parse the config file`",
        )
    limit = min(max(1, int(args.get("limit", 8))), MAX_RESULTS)
    root = Path(real_root(ctx))
    wanted = glob_regex(normalize_glob(ctx, args["glob"])) if args.get("glob") else None
    notes: list[str] = []
    embedder = ctx.code.embedder
    try:
        hits = _search(ctx, root, query, limit, wanted, embedder)
    except Exception as exc:  # noqa: BLE001 - the embedding server failed: BM25 alone
        if embedder is None:
            raise
        reason = exc.message if isinstance(exc, CoderError) else f"{type(exc).__name__}: {exc}"
        notes.append(f"embeddings unavailable ({reason}); ranked by BM25 only")
        hits = _search(ctx, root, query, limit, wanted, None)
    if not hits:
        return ToolResult(
            True,
            f"no code matches {query!r}" + "".join(f"\n[{n}]" for n in notes),
            data={"count": 0},
            hint="try other words (names, what the code does), or fs_grep for exact text",
        )
    blocks: list[str] = []
    used = 0
    terms = set(retrieval.tokenize(query))
    for hit in hits:
        block = _show(root, hit.chunk, terms)
        if used + len(block) > RESULT_CHARS and blocks:
            notes.append(f"{len(hits) - len(blocks)} more results cut; narrow the query or glob")
            break
        blocks.append(block)
        used += len(block)
    text = "\n".join(blocks) + "".join(f"\n[{n}]" for n in notes)
    results = [
        {"path": h.chunk.path, "start": h.chunk.start, "end": h.chunk.end, "name": h.chunk.name}
        for h in hits[: len(blocks)]
    ]
    return ToolResult(True, text, data={"count": len(results), "results": results})


def _search(
    ctx: ToolContext, root: Path, query: str, limit: int, wanted: Any, embedder: Any
) -> list[Any]:
    k = limit if wanted is None else limit * 20
    hits = retrieval.search(
        root,
        query,
        k=k,
        cache_dir=ctx.code.cache_dir,
        embedder=embedder,
        embed_key=ctx.code.embed_key,
        redactor=ctx.redactor,
    )
    if wanted is not None:
        hits = [h for h in hits if wanted.fullmatch(h.chunk.path)]
    return hits[:limit]


def _show(root: Path, chunk: Any, terms: set[str]) -> str:
    try:
        text = (root / chunk.path).read_text(encoding="utf-8", errors="replace")
    except OSError:
        text = ""
    lines = text.split("\n")[chunk.start - 1 : chunk.end]
    title = f"{chunk.path}:{chunk.start}-{chunk.end}" + (f" ({chunk.name})" if chunk.name else "")
    picked = [0] if lines else []
    for offset, line in enumerate(lines[1:], 1):
        if len(picked) > MATCH_LINES:
            break
        if terms & set(tokenize(line)):
            picked.append(offset)
    width = max(5, len(str(chunk.end)))
    shown = [numbered([lines[i][:200]], chunk.start + i, width) for i in picked]
    return title + ("\n" + "\n".join(shown) if shown else "")


CODE_SEARCH = Tool(
    name="code_search",
    description=(
        "Find code by what it does or is called, in words (e.g. `where the config file is "
        "parsed`, `retry with backoff`): the best matching functions, classes and file "
        "sections with their paths and line ranges. Use fs_grep for exact text."
    ),
    parameters=params(
        {
            "query": prop("string", "What you are looking for, in words or names."),
            "limit": prop("integer", f"Number of results (default 8, at most {MAX_RESULTS})."),
            "glob": prop("string", "Only files matching this glob, e.g. src/**/*.py (optional)."),
        },
        required=["query"],
    ),
    handler=code_search,
    read_only=True,
)
