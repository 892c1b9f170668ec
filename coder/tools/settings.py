"""The ToolContext settings a run takes from its config and taskfile: the edit checks
(`policies.veto_syntax_errors`, `policies.lint_after_edit`, `lint_command`), the code index's
cache directory and, when `embedding_model` is set, the embedder for hybrid code_search."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

EMBED_TIMEOUT_S = 120.0


def code_settings(
    config: Mapping[str, Any] | Any, policies: Mapping[str, Any], cache_dir: Path | None
) -> dict[str, Any]:
    """Keyword arguments for ToolContext."""
    model = config.get("embedding_model")
    return {
        "cache_dir": cache_dir,
        "veto_syntax_errors": bool(policies.get("veto_syntax_errors", True)),
        "lint_after_edit": bool(policies.get("lint_after_edit", True)),
        "lint_command": config.get("lint_command"),
        "embedder": ollama_embedder(str(config.get("ollama_host")), model) if model else None,
        "embed_key": model or "",
    }


def ollama_embedder(host: str, model: str) -> Any:
    """Texts -> vectors through Ollama's /api/embed (one client per call, closed after it:
    a search makes at most two calls)."""

    def embed(texts: Sequence[str]) -> list[list[float]]:
        import ollama

        with ollama.Client(host=host, timeout=EMBED_TIMEOUT_S) as client:
            response = client.embed(model=model, input=list(texts))
        return [list(v) for v in response.embeddings]

    return embed
