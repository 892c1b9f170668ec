"""The code index's settings (`CodeSearch`): its cache directory and, when `embedding_model`
is set, the embedder for hybrid code_search (the configured provider's `embed`,
coder.models.factory.open_embedder). Decided once per run (coder.agent.session) and once per
MCP server."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from coder.config import as_config
from coder.models.factory import open_embedder
from coder.tools.base import CodeSearch

if TYPE_CHECKING:
    from coder.redact import Redactor


def code_settings(
    config: Mapping[str, Any] | Any, cache_dir: Path | None, redactor: Redactor
) -> CodeSearch:
    """code_search's settings for ToolContext.code (what the embedder is sent passes
    `redactor`)."""
    config = as_config(config)  # a plain mapping: tests
    model = config.embedding_model
    return CodeSearch(
        cache_dir=cache_dir,
        embedder=open_embedder(config, redactor=redactor),
        # names the vector cache: the same model name on another kind of server may differ
        embed_key=embed_key(config) if model else "",
    )


def embed_key(config: Mapping[str, Any] | Any) -> str:
    """The provider and the name of the embedding model (a named model resolved)."""
    config = as_config(config)  # a plain mapping: tests
    model = str(config.embedding_model)
    entry = (config.models or {}).get(model)
    if isinstance(entry, dict):
        return f"{entry.get('provider') or config.provider or 'ollama'}-{entry['model']}"
    return f"{config.provider or 'ollama'}-{model}"
