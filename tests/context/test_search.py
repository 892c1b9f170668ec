"""code_search's index: chunks, tokens, BM25 over the working directory as it is, the hybrid
ranking with an embedder, and the code_search tool on top."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from coder.context import retrieval
from tests.conftest import git

LIBRARY = {
    "shop/pricing.py": (
        '"""Prices."""\n\n'
        "def apply_discount(price, percent):\n"
        '    """Reduce a price by a percentage, never below zero."""\n'
        "    return max(0, price - price * percent / 100)\n\n\n"
        "def format_money(amount):\n"
        '    """Render an amount of cents as a string with two decimals."""\n'
        '    return f"{amount / 100:.2f}"\n'
    ),
    "shop/inventory.py": (
        "class Warehouse:\n"
        '    """Where the stock is kept."""\n\n'
        "    def restock(self, item, count):\n"
        '        """Add items to the shelves after a delivery arrives."""\n'
        "        self.items[item] = self.items.get(item, 0) + count\n"
    ),
    "docs/guide.md": "# Guide\n\nShipping labels are printed from the admin page.\n",
    "vendor/lib.py": "def apply_discount_vendored():\n    pass\n",
}


@pytest.fixture
def shop(make_repo) -> Path:
    return make_repo(LIBRARY, name="shop")


def names(hits: list[retrieval.Hit]) -> list[str]:
    return [f"{h.chunk.path}:{h.chunk.name}" for h in hits]


def test_tokens_split_identifiers_and_stem() -> None:
    assert retrieval.tokenize("parseConfigFile") == ["pars", "config", "file", "parseconfigfile"]
    assert retrieval.tokenize("load_user_accounts") == [
        "load",
        "user",
        "account",
        "load_user_accounts",
    ]
    assert retrieval.tokenize("the parsed entries") == ["pars", "entry"]
    assert {retrieval.stem(w) for w in ("parse", "parses", "parsed", "parsing")} == {"pars"}
    assert [retrieval.stem(w) for w in ("classes", "matches", "is", "status")] == [
        "class",
        "match",
        "is",
        "status",
    ]


def test_a_function_is_found_by_its_docstring(shop: Path) -> None:
    hits = retrieval.search(shop, "reduce a price by a percentage", k=3)
    assert names(hits)[0] == "shop/pricing.py:apply_discount"
    hits = retrieval.search(shop, "add items after a delivery", k=3)
    assert names(hits)[0] == "shop/inventory.py:restock"
    assert (hits[0].chunk.start, hits[0].chunk.end) == (4, 6)
    assert names(retrieval.search(shop, "shipping labels", k=1)) == ["docs/guide.md:"]


def test_definitions_are_chunks_and_the_rest_is_windows(shop: Path) -> None:
    chunks = retrieval.chunk_file("shop/inventory.py", LIBRARY["shop/inventory.py"].encode())
    assert [(start, end, name) for start, end, name, _ in chunks] == [
        (1, 3, "Warehouse"),  # the class without its method
        (4, 6, "restock"),
    ]
    text = "\n".join(f"line {i}" for i in range(100)).encode()
    assert [(s, e) for s, e, _, _ in retrieval.chunk_file("notes.txt", text)] == [
        (1, 40),
        (41, 80),
        (81, 100),
    ]


def test_vendored_code_is_not_indexed(shop: Path) -> None:
    assert all(
        not h.chunk.path.startswith("vendor/")
        for h in retrieval.search(shop, "apply discount vendored", k=10)
    )


def test_the_index_follows_the_working_directory(shop: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    assert retrieval.search(shop, "compute shipping weight", k=3, cache_dir=cache) == [] or all(
        "shipping_weight" not in h.chunk.name
        for h in retrieval.search(shop, "compute shipping weight", k=3)
    )
    (shop / "shop" / "shipping.py").write_text(
        "def shipping_weight(parcel):\n    return parcel.grams\n"
    )
    (shop / "shop" / "pricing.py").unlink()
    hits = retrieval.search(shop, "compute shipping weight", k=3, cache_dir=cache)
    assert names(hits)[0] == "shop/shipping.py:shipping_weight"  # an uncommitted new file
    assert not [
        h
        for h in retrieval.search(shop, "reduce a price", k=5, cache_dir=cache)
        if h.chunk.path == "shop/pricing.py"
    ]
    git(shop, "add", "-A")
    git(shop, "commit", "-qm", "shipping")
    assert names(retrieval.search(shop, "compute shipping weight", k=1, cache_dir=cache)) == [
        "shop/shipping.py:shipping_weight"
    ]
    cached = (cache / f"chunks-v{retrieval.VERSION}.json").read_text()
    assert "shipping" in cached and "apply" not in cached  # entries of the tree only


def test_the_hybrid_ranking_fuses_embeddings_by_reciprocal_rank(shop: Path, tmp_path: Path) -> None:
    calls: list[int] = []

    def similarity(text: str) -> float:
        return 1.0 if "cents" in text else -1.0 if "discount" in text else 0.0

    def embedder(texts):  # type: ignore[no-untyped-def]
        calls.append(len(texts))
        return [[similarity(t), 1.0] for t in texts]

    query = "price percent cents"
    plain = retrieval.search(shop, query, k=10)
    assert names(plain)[0] == "shop/pricing.py:apply_discount"  # BM25: price and percent
    # the embedder's ranking of the same candidates (query vector [1, 1])
    texts = {h.chunk: retrieval._chunk_text(shop, h.chunk) for h in plain}
    dense = sorted(
        plain,
        key=lambda h: -(similarity(texts[h.chunk]) + 1) / math.hypot(similarity(texts[h.chunk]), 1),
    )
    expected = sorted(
        plain,
        key=lambda h: (
            -(
                1 / (retrieval.RRF_K + plain.index(h) + 1)
                + 1 / (retrieval.RRF_K + dense.index(h) + 1)
            )
        ),
    )
    hybrid = retrieval.search(
        shop, query, k=10, embedder=embedder, cache_dir=tmp_path, embed_key="m"
    )
    assert names(hybrid) == names(expected)
    assert names(hybrid)[0] == "shop/pricing.py:format_money"  # "cents" won it the first place
    embedded = sum(calls)
    retrieval.search(shop, query, k=10, embedder=embedder, cache_dir=tmp_path, embed_key="m")
    assert sum(calls) == embedded + 1  # only the query: the chunks' vectors were cached


def test_hybrid_code_search_through_ollama_embed(shop: Path, tmp_path: Path) -> None:
    from coder.policy.commands import Policy
    from coder.redact import Redactor
    from coder.tools.base import ToolContext
    from coder.tools.codeindex import code_settings
    from coder.tools.registry import default_registry
    from tests.fake_ollama import DEFAULT_MODELS, FakeOllama

    models = {**DEFAULT_MODELS, "nomic-embed-text:latest": {"capabilities": ["embedding"]}}
    with FakeOllama(models=models) as server:
        config = {"ollama_host": server.url, "embedding_model": "nomic-embed-text"}
        settings = code_settings(config, tmp_path / "cache", Redactor())
        assert settings.embedder is not None
        vectors = settings.embedder(["parse the config", "parse the config file"])
        assert len(vectors) == 2 and len(vectors[0]) == 16
        ctx = ToolContext(root=shop, policy=Policy(), redactor=Redactor(), code=settings)
        result = default_registry().call(
            "code_search", {"query": "reduce a price by a percentage"}, ctx
        )
        assert result.ok and result.content.startswith("shop/pricing.py:3-5 (apply_discount)")
        embeds = [r for r in server.requests if r.path == "/api/embed"]
        assert embeds and embeds[-1].body["model"] == "nomic-embed-text"
        assert list((tmp_path / "cache").glob("embeddings-ollama-nomic-embed-text.bin"))
        # an embedding model the server does not have: BM25 alone, and the model is told
        missing = code_settings({**config, "embedding_model": "no-such-model"}, None, Redactor())
        ctx = ToolContext(root=shop, policy=Policy(), redactor=Redactor(), code=missing)
        result = default_registry().call(
            "code_search", {"query": "reduce a price by a percentage"}, ctx
        )
        assert result.ok and result.content.startswith("shop/pricing.py:3-5 (apply_discount)")
        assert (
            f"[embeddings unavailable (model 'no-such-model' is not available on {server.url}"
            in result.content
        )
        assert "ranked by BM25 only]" in result.content


def test_hybrid_code_search_through_an_openai_compatible_server(shop: Path, tmp_path: Path) -> None:
    """The same through the OpenAI provider (the real SDK, /v1/embeddings), at the second of
    two endpoints: the first refuses connections."""
    from coder.policy.commands import Policy
    from coder.redact import Redactor
    from coder.tools.base import ToolContext
    from coder.tools.codeindex import code_settings
    from coder.tools.registry import default_registry
    from tests.fake_ollama import down_url, embedding
    from tests.fake_openai import MODEL, FakeOpenAI

    embedder = "nomic-embed-text-v1.5"
    query = {"query": "reduce a price by a percentage"}
    with FakeOpenAI() as server:
        server.models[embedder] = {"capabilities": ["embedding"]}
        config = {
            "provider": "openai",
            "base_url": [down_url() + "/v1", server.url],
            "embedding_model": embedder,
        }
        settings = code_settings(config, tmp_path / "cache", Redactor())
        ctx = ToolContext(root=shop, policy=Policy(), redactor=Redactor(), code=settings)
        result = default_registry().call("code_search", query, ctx)
        assert result.ok and result.content.startswith("shop/pricing.py:3-5 (apply_discount)")
        assert "embeddings unavailable" not in result.content
        bodies = [r.body for r in server.requests if r.path == "/v1/embeddings"]
        assert len(bodies) == 2  # the candidate chunks, then the query
        assert bodies[0]["model"] == embedder and len(bodies[0]["input"]) > 1
        assert bodies[1]["input"] == [query["query"]]
        assert list((tmp_path / "cache").glob("embeddings-openai-nomic-embed-text-v1.5.bin"))
        assert settings.embedder is not None
        assert settings.embedder(["again"]) == [embedding("again")]
        # a chat model (a server started without --embeddings): BM25 alone, and why
        chat_only = code_settings({**config, "embedding_model": MODEL}, None, Redactor())
        ctx = ToolContext(root=shop, policy=Policy(), redactor=Redactor(), code=chat_only)
        result = default_registry().call("code_search", query, ctx)
        assert result.ok and result.content.startswith("shop/pricing.py:3-5 (apply_discount)")
        assert "does not support embeddings. Start it with `--embeddings`" in result.content
        assert "ranked by BM25 only]" in result.content


def test_the_embedding_model_may_be_a_named_model_on_another_server(
    shop: Path, tmp_path: Path
) -> None:
    """Chats at an OpenAI-compatible server, embeddings from a local Ollama (config `models`)."""
    from coder.policy.commands import Policy
    from coder.redact import Redactor
    from coder.tools.base import ToolContext
    from coder.tools.codeindex import code_settings
    from coder.tools.registry import default_registry
    from tests.fake_ollama import DEFAULT_MODELS, FakeOllama, down_url

    models = {**DEFAULT_MODELS, "nomic-embed-text:latest": {"capabilities": ["embedding"]}}
    with FakeOllama(models=models) as local:
        config = {
            "provider": "openai",
            "base_url": down_url() + "/v1",  # the chat server: never asked for embeddings
            "models": {
                "embedder": {
                    "provider": "ollama",
                    "base_url": local.url,
                    "model": "nomic-embed-text",
                }
            },
            "embedding_model": "embedder",
        }
        settings = code_settings(config, tmp_path / "cache", Redactor())
        ctx = ToolContext(root=shop, policy=Policy(), redactor=Redactor(), code=settings)
        result = default_registry().call(
            "code_search", {"query": "reduce a price by a percentage"}, ctx
        )
        assert result.ok and "embeddings unavailable" not in result.content
        embeds = [r.body for r in local.requests if r.path == "/api/embed"]
        assert embeds and embeds[-1]["model"] == "nomic-embed-text"
    assert list((tmp_path / "cache").glob("embeddings-ollama-nomic-embed-text.bin"))
