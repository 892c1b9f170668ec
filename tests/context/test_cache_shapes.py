"""`.coder/cache` files of the wrong shape (valid JSON, not what coder writes: edited by hand,
left by another version, planted) are ignored and rebuilt: a model run never fails on them,
and each cache file is written again holding only entries of its own shape. Judged by the
run's exit and the cache files on disk afterwards; the model runs use the fake Ollama."""

from __future__ import annotations

import json
from array import array
from pathlib import Path
from typing import Any

import pygit2
import pytest

from coder.context import repomap, retrieval
from coder.context.languages import language_of
from tests.conftest import coder, git
from tests.fake_ollama import FakeOllama
from tests.helpers import call, done, taskfile

TASK = """
    id: cz
    title: Caches
    graph:
      - {id: s1, kind: analyze, goal: find how calc.py adds numbers}
"""
PYTHON = ("calc.py", "tests/test_calc.py")
OTHER = ("README.md", "pyproject.toml")

# Wrong shapes of one file's entry, each valid JSON.
TAGS = [
    "garbage",
    [[["add", "function", "1", 2, "def add"]], {}],  # a line number as text
    [[["add", "function", 1, 2]], {}],  # a definition cut short
    [[], ["add"]],  # references as a list
    [[], {"add": 1.5}],  # a count that is no integer
    {"definitions": [], "references": {}},
    [[], {}, "more"],
]
CHUNKS = [
    "garbage",
    [[1, 2]],
    [[1, 2, "add", "add numbers"]],  # the tokens as one string
    [["1", 2, "add", ["add"]]],
    [[1, 2, "add", [3]]],
    {"0": [1, 2, "add", []]},
    [None],
]


def blobs(repo: Path, paths: tuple[str, ...]) -> dict[str, str]:
    return {p: git(repo, "rev-parse", f"HEAD:{p}").strip() for p in paths}


def tags_key(path: str, blob: str) -> str:
    return f"{language_of(path)}:{blob}"


def chunks_key(path: str, blob: str) -> str:
    return f"{blob}:{language_of(path) or 'text'}"


def well_shaped_tags(entry: Any) -> bool:
    definitions, references = entry
    return all([type(v) for v in d] == [str, str, int, int, str] for d in definitions) and all(
        type(n) is int for n in references.values()
    )


def well_shaped_chunks(entry: Any) -> bool:
    return all(
        [type(v) for v in c] == [int, int, str, list] and all(type(t) is str for t in c[3])
        for c in entry
    )


def model_run(fake: FakeOllama, repo: Path) -> None:
    fake.enqueue(call("code_search", query="add two numbers"), done("found add"))
    code, out, err = coder(repo, "run", "--autonomous", "-f", str(taskfile(repo, TASK)))
    assert code == 0, out + err
    assert "Traceback" not in err


def test_a_model_run_rebuilds_a_tags_cache_of_the_wrong_shape(
    fake: FakeOllama, sample: Path
) -> None:
    cache = sample / ".coder" / "cache"
    cache.mkdir(parents=True)
    found = blobs(sample, PYTHON)
    planted = {tags_key(p, b): TAGS[i] for i, (p, b) in enumerate(found.items())}
    planted |= {f"python:{i:040x}": shape for i, shape in enumerate(TAGS)}  # no such file
    (cache / "tags-v1.json").write_text(json.dumps(planted))
    model_run(fake, sample)
    rebuilt = json.loads((cache / "tags-v1.json").read_text())
    assert set(rebuilt) == {tags_key(p, b) for p, b in found.items()}
    assert all(well_shaped_tags(e) for e in rebuilt.values())
    assert any(d[0] == "add" for d in rebuilt[tags_key("calc.py", found["calc.py"])][0])


def test_a_model_run_rebuilds_a_chunks_cache_of_the_wrong_shape(
    fake: FakeOllama, sample: Path
) -> None:
    cache = sample / ".coder" / "cache"
    cache.mkdir(parents=True)
    found = blobs(sample, PYTHON + OTHER)
    planted = {chunks_key(p, b): CHUNKS[i] for i, (p, b) in enumerate(found.items())}
    (cache / "chunks-v2.json").write_text(json.dumps(planted))
    model_run(fake, sample)
    rebuilt = json.loads((cache / "chunks-v2.json").read_text())
    assert set(rebuilt) >= {chunks_key(p, b) for p, b in found.items()}
    assert all(well_shaped_chunks(e) for e in rebuilt.values())
    sent = json.dumps(fake.chat_bodies()[-1]["messages"])
    assert "calc.py" in sent  # code_search answered from the rebuilt index


@pytest.mark.parametrize(
    "planted",
    [
        ["native"],
        {"KEY": "native", "other": 5},
        {"KEY": {"protocol": "native"}, "other": {"protocol": "text", "reason": 5}},
        {"KEY": {"protocol": ["text"], "reason": "x"}, "other": None},
    ],
)
def test_a_model_run_decides_again_over_a_protocol_cache_of_the_wrong_shape(
    fake: FakeOllama, sample: Path, planted: Any
) -> None:
    cache = sample / ".coder" / "cache"
    cache.mkdir(parents=True)
    key = f"ollama {fake.url} qwen2.5-coder:7b"
    text = json.dumps(planted).replace('"KEY"', json.dumps(key))
    (cache / "tool-protocols.json").write_text(text)
    model_run(fake, sample)
    remembered = json.loads((cache / "tool-protocols.json").read_text())
    assert remembered == {key: {"protocol": "native", "reason": remembered[key]["reason"]}}
    assert "tools" in remembered[key]["reason"]  # Ollama's capabilities said so


@pytest.mark.parametrize("shape", range(len(TAGS)))
def test_the_repo_map_reparses_a_tags_entry_of_the_wrong_shape(
    make_repo, tmp_path: Path, shape: int
) -> None:
    repo = make_repo({"calc.py": "def add(a, b):\n    return a + b\n"})
    blob = git(repo, "rev-parse", "HEAD:calc.py").strip()
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "tags-v1.json").write_text(json.dumps({tags_key("calc.py", blob): TAGS[shape]}))
    built = repomap.build(pygit2.Repository(str(repo)), "HEAD", budget=500, cache_dir=cache)
    assert "add" in built.text
    [entry] = json.loads((cache / "tags-v1.json").read_text()).values()
    assert well_shaped_tags(entry)


@pytest.mark.parametrize("shape", range(len(CHUNKS)))
def test_code_search_rechunks_an_entry_of_the_wrong_shape(
    make_repo, tmp_path: Path, shape: int
) -> None:
    repo = make_repo({"calc.py": "def add(a, b):\n    return a + b\n"})
    blob = git(repo, "rev-parse", "HEAD:calc.py").strip()
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "chunks-v2.json").write_text(json.dumps({chunks_key("calc.py", blob): CHUNKS[shape]}))
    hits = retrieval.search(repo, "add numbers", k=3, cache_dir=cache)
    assert [(h.chunk.path, h.chunk.name) for h in hits] == [("calc.py", "add")]
    [entry] = json.loads((cache / "chunks-v2.json").read_text()).values()
    assert well_shaped_chunks(entry)


VECTORS = [
    b'{"keys": "ab", "dim": 0}\n',
    b'{"keys": [["x"]], "dim": 4}\n' + bytes(16),
    b'{"keys": ["k"], "dim": "4"}\n' + bytes(16),
    b'{"keys": ["k", 7], "dim": 4}\n' + bytes(32),
    b'{"keys": ["k"], "dim": -4}\n',
    b"[4]\n",
]


@pytest.mark.parametrize("planted", VECTORS, ids=range(len(VECTORS)))
def test_cached_vectors_of_the_wrong_shape_are_computed_again(
    make_repo, tmp_path: Path, planted: bytes
) -> None:
    repo = make_repo({"calc.py": "def add(a, b):\n    return a + b\n", "README.md": "# c\n"})
    cache = tmp_path / "cache"
    cache.mkdir()
    path = cache / "embeddings-m.bin"
    path.write_bytes(planted)
    embedded: list[str] = []

    def embedder(texts: list[str]) -> list[list[float]]:
        embedded.extend(texts)
        return [[1.0, float(len(t)), 0.0, 1.0] for t in texts]

    hits = retrieval.search(repo, "add", k=3, cache_dir=cache, embedder=embedder, embed_key="m")
    assert hits and hits[0].chunk.path == "calc.py"
    head, _, body = path.read_bytes().partition(b"\n")
    meta = json.loads(head)
    assert meta["dim"] == 4 and all(type(k) is str for k in meta["keys"])
    vectors = array("f")
    vectors.frombytes(body)
    assert len(vectors) == 4 * len(meta["keys"]) and len(meta["keys"]) == len(embedded) - 1
