"""What the model is shown and how its edits are checked: retrieval recall, the repo map, the
per-edit checks. Ratios and figures against baselines measured in the same run; no goal is
asserted (the goals are printed beside the figures).

    python bench/context.py                       # all three parts
    python bench/context.py --only recall --libraries click networkx rich
    python bench/context.py --embed-model nomic-embed-text   # + hybrid, if the server has it

1. Retrieval recall. The source of installed libraries (default click, and rich when it is
   installed, else networkx), copied into a temporary git repository. Every public function
   with a docstring is a query: the docstring's first sentence with the function's name taken
   out; the target is the function's file. recall@k = the share of queries whose file is among
   the files of the first k results. code_search (BM25; hybrid when --embed-model names a
   model the server of the coder config here serves: Ollama or OpenAI-compatible) against a
   grep baseline over the query's words (files ranked by how many of the query's words they
   contain, then by how often). Goal: BM25 recall@5 >= 0.8 on both.
2. Repo map. On the same trees and on a generated tree of --files Python files that import
   each other: tokens of the file list the prompt had before (paths, folded by directory past
   400 files) against the ranked map at the default budget (what it shows: definitions with
   their lines); the time to build the map cold (no cache), for a new task on the same tree
   (tags cached, another focus) and warm (the same tree and task: the rendered map from the
   cache). Goal: warm < 50 ms for 5,000 files.
3. Edit feedback. fs_edit of one line of a 2,000-line Python file through the registry, with
   the syntax check on against off (the edit alone): the check's overhead per edit (goal
   < 100 ms). The linter's own time (ruff, when on PATH) is reported apart: the time of one
   `ruff check` of the file through the sandbox.
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

GIT_ENV = {
    **os.environ,
    "GIT_CONFIG_GLOBAL": os.devnull,
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_AUTHOR_NAME": "Bench",
    "GIT_AUTHOR_EMAIL": "bench@localhost",
    "GIT_COMMITTER_NAME": "Bench",
    "GIT_COMMITTER_EMAIL": "bench@localhost",
}
KS = (1, 5, 10)
_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]+")
_STOP = frozenset("the a an of to and or in is are be for with this that it as by on from".split())


def git_repo(path: Path) -> Path:
    subprocess.run(["git", "init", "-q", "-b", "main"], cwd=path, check=True, env=GIT_ENV)
    subprocess.run(["git", "add", "-A"], cwd=path, check=True, env=GIT_ENV)
    subprocess.run(["git", "commit", "-qm", "source"], cwd=path, check=True, env=GIT_ENV)
    return path


def library_tree(name: str, tmp: Path) -> Path | None:
    spec = importlib.util.find_spec(name)
    if spec is None or spec.origin is None:
        return None
    source = Path(spec.origin).parent
    dest = tmp / name
    shutil.copytree(source, dest / name, ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    return git_repo(dest)


def best_of(fn: Callable[[], Any], repeats: int = 3) -> tuple[float, Any]:
    best, value = float("inf"), None
    for _ in range(repeats):
        started = time.perf_counter()
        value = fn()
        best = min(best, time.perf_counter() - started)
    return best, value


# --------------------------------------------------------------------------- 1. recall


def queries(repo: Path) -> list[tuple[str, str]]:
    """(query, target file) for every public function with a docstring."""
    out = []
    for path in sorted(repo.rglob("*.py")):
        rel = path.relative_to(repo).as_posix()
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError):
            continue
        for node in ast.walk(tree):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            doc = ast.get_docstring(node)
            if node.name.startswith("_") or not doc:
                continue
            sentence = re.split(r"(?<=[.!?])\s|\n\n", doc.strip(), maxsplit=1)[0]
            query = re.sub(rf"\b{re.escape(node.name)}\b", " ", sentence).strip()
            if len(_WORD.findall(query)) >= 2:
                out.append((query, rel))
    return out


def grep_ranking(files: dict[str, str], query: str) -> list[str]:
    """Files (lower-cased texts) ranked by how many of the query's words they contain."""
    words = {w.lower() for w in _WORD.findall(query) if w.lower() not in _STOP}
    scored = []
    for rel, lowered in files.items():
        present = [w for w in words if w in lowered]
        if present:
            scored.append((-len(present), -sum(lowered.count(w) for w in present), rel))
    return [rel for *_, rel in sorted(scored)]


def recall(rankings: list[list[str]], targets: list[str]) -> dict[int, float]:
    return {
        k: sum(t in r[:k] for r, t in zip(rankings, targets, strict=True)) / max(1, len(targets))
        for k in KS
    }


def files_of(hits: list[Any]) -> list[str]:
    seen: list[str] = []
    for hit in hits:
        if hit.chunk.path not in seen:
            seen.append(hit.chunk.path)
    return seen


def bench_recall(trees: dict[str, Path], embedder: Any, embed_model: str) -> None:
    from coder.context import retrieval

    print("1. retrieval recall (query: a docstring's first sentence; target: its file)")
    header = f"   {'library':<10} {'queries':>7} {'ranker':<12}" + "".join(
        f" {f'@{k}':>6}" for k in KS
    )
    print(header)
    for name, repo in trees.items():
        pairs = queries(repo)
        targets = [t for _, t in pairs]
        files = {
            p.relative_to(repo).as_posix(): p.read_text(errors="replace").lower()
            for p in repo.rglob("*.py")
        }
        started = time.perf_counter()
        retrieval.index_for(repo, None)
        index_s = time.perf_counter() - started
        rankers: dict[str, Callable[[str], list[str]]] = {
            "grep words": lambda q: grep_ranking(files, q),
            "code_search": lambda q: files_of(retrieval.search(repo, q, k=30)),
        }
        if embedder is not None:
            rankers["hybrid"] = lambda q: files_of(
                retrieval.search(repo, q, k=30, embedder=embedder, embed_key=embed_model)
            )
        results = {}
        for label, rank in rankers.items():
            started = time.perf_counter()
            rankings = [rank(q) for q, _ in pairs]
            per_query = (time.perf_counter() - started) / max(1, len(pairs))
            results[label] = recall(rankings, targets)
            cells = "".join(f" {results[label][k]:>6.2f}" for k in KS)
            print(
                f"   {name:<10} {len(pairs):>7} {label:<12}{cells}"
                f"   {per_query * 1000:.1f} ms/query"
            )
        ratio = results["code_search"][5] / max(results["grep words"][5], 1e-9)
        goal = "ok" if results["code_search"][5] >= 0.8 else "UNDER GOAL"
        print(
            f"   {name:<10} code_search recall@5 {results['code_search'][5]:.2f} "
            f"(goal >= 0.80: {goal}), {ratio:.2f}x grep's; index built in {index_s:.2f}s "
            f"({len(files)} files)"
        )
    if embedder is None:
        print("   hybrid: not measured (no --embed-model, or no Ollama serving it)")


# --------------------------------------------------------------------------- 2. repo map


def synthetic_tree(tmp: Path, count: int) -> Path:
    """`count` Python modules in packages of 50; each defines a class and two functions and
    calls functions of three other modules."""
    root = tmp / f"synthetic{count}"
    for i in range(count):
        path = root / f"pkg{i // 50:03}" / f"mod{i:05}.py"
        path.parent.mkdir(parents=True, exist_ok=True)
        others = [(i * 7 + 3) % count, (i * 13 + 5) % count, (i * i + 11) % count]
        calls = "\n".join(f"    total += compute_value_{j}(x)" for j in others)
        path.write_text(
            f'"""Module {i}."""\n\n\nclass Record{i}:\n    """A record."""\n\n'
            f"    def describe(self):\n        return 'record {i}'\n\n\n"
            f"def compute_value_{i}(x):\n    return x * {i}\n\n\n"
            f"def aggregate_{i}(x):\n    total = 0\n{calls}\n    return total\n"
        )
    return git_repo(root)


def old_file_list(paths: list[str]) -> str:
    """The map the prompt had before the ranked map: the paths, folded by top directory past
    400 files."""
    if len(paths) <= 400:
        return "\n".join(paths)
    by_dir: dict[str, int] = {}
    for path in paths:
        top = path.split("/", 1)[0] + ("/" if "/" in path else "")
        by_dir[top] = by_dir.get(top, 0) + 1
    return "\n".join(
        f"{d} ({n} files)" if d.endswith("/") else d for d, n in sorted(by_dir.items())
    )


def bench_map(trees: dict[str, Path], tmp: Path) -> None:
    import pygit2

    from coder.context import repomap
    from coder.git.trees import tree_paths

    budget = repomap.default_budget(32768)
    print(f"2. repo map (budget {budget} tokens: the default for num_ctx 32768)")
    print(
        f"   {'tree':<16} {'files':>6} {'file list':>10} {'ranked map':>10} {'defs shown':>10}"
        f" {'cold':>9} {'new task':>9} {'warm':>8}"
    )
    for name, repo in trees.items():
        opened = pygit2.Repository(str(repo))
        paths = tree_paths(opened, "HEAD")
        listing = repomap._tokens(old_file_list(paths))
        cache = tmp / f"cache-{name}"
        cold_s, built = best_of(
            lambda: repomap.build(opened, "HEAD", budget=budget, cache_dir=None), repeats=1
        )
        repomap.build(opened, "HEAD", budget=budget, cache_dir=cache)  # fills the tag cache
        n = [0]

        def new_task() -> Any:
            n[0] += 1
            focus = repomap.Focus.of([f"task number {n[0]} about compute_value_{n[0]}"])
            return repomap.build(opened, "HEAD", budget=budget, focus=focus, cache_dir=cache)

        task_s, _ = best_of(new_task)
        warm_s, warm = best_of(
            lambda: repomap.build(opened, "HEAD", budget=budget, cache_dir=cache)
        )
        assert warm.cached and warm.text == built.text
        ok = (
            ""
            if len(paths) < 5000
            else f"  (warm goal < 50 ms: {'ok' if warm_s < 0.05 else 'OVER'})"
        )
        print(
            f"   {name:<16} {len(paths):>6} {listing:>10} {built.tokens:>10}"
            f" {built.definitions:>10}"
            f" {cold_s:>8.2f}s {task_s:>8.3f}s {warm_s * 1000:>6.2f}ms{ok}"
        )
    print("   (tokens: characters / 4; the file list shows no definitions)")


# --------------------------------------------------------------------------- 3. edit feedback


def bench_edit(tmp: Path, repeats: int) -> None:
    from dataclasses import replace

    from coder.config import as_config
    from coder.policy.commands import Policy
    from coder.redact import Redactor
    from coder.taskfile.policies import Policies
    from coder.tools.base import ToolContext
    from coder.tools.registry import default_registry

    root = tmp / "edit"
    root.mkdir()
    body = "".join(
        f"def function_{i}(value):\n    '''Return value plus {i}.'''\n    result = value + {i}\n"
        f"    return result\n\n"
        for i in range(400)
    )
    (root / "big.py").write_text(body)
    git_repo(root)
    lines = body.count("\n")
    registry = default_registry()
    base = ToolContext(
        root=root, policy=Policy(), redactor=Redactor(), policies=Policies(lint_after_edit=False)
    )
    unchecked = replace(base, policies=Policies(veto_syntax_errors=False, lint_after_edit=False))
    checked = base
    current = [7]

    def edit(ctx: ToolContext) -> Any:  # every edit makes new content (no lint memo hit)
        old, new = current[0], current[0] + 1000
        current[0] = new
        args = {"path": "big.py", "search": f"value + {old}\n", "replace": f"value + {new}\n"}
        result = registry.call("fs_edit", args, ctx)
        assert result.ok, result.content
        return result

    times = {}
    for label, ctx in (("edit alone", unchecked), ("edit + syntax check", checked)):
        samples = []
        for _ in range(repeats):
            started = time.perf_counter()
            edit(ctx)
            samples.append(time.perf_counter() - started)
        times[label] = sorted(samples)[len(samples) // 2]
    overhead = times["edit + syntax check"] - times["edit alone"]
    print(
        f"3. edit feedback: fs_edit of one line of a {lines}-line Python file (median of {repeats})"
    )
    for label, seconds in times.items():
        print(f"   {label:<22} {seconds * 1000:>7.1f} ms")
    verdict = "ok" if overhead < 0.1 else "OVER GOAL"
    print(
        f"   syntax check overhead  {overhead * 1000:>7.1f} ms per edit "
        f"({times['edit + syntax check'] / times['edit alone']:.2f}x the edit; "
        f"goal < 100 ms: {verdict})"
    )
    if shutil.which("ruff") is None:
        print("   linter: ruff is not on PATH; not measured")
        return
    from coder.policy.sandbox import run_command

    lint_s, _ = best_of(
        lambda: run_command(
            "ruff check --no-cache --quiet big.py", cwd=root, policy=Policy(), root=root
        )
    )
    print(f"   linter: one `ruff check` of the file through the sandbox {lint_s * 1000:.0f} ms")
    from coder.checks.lintreport import LINTERS

    ruff = as_config({"lint_command": LINTERS["ruff"].command})
    linted = replace(checked, policies=Policies(), config=ruff)
    edit(linted)  # the first edit of a file lints it before and after; later ones only after
    samples = []
    for _ in range(repeats):
        started = time.perf_counter()
        edit(linted)
        samples.append(time.perf_counter() - started)
    full = sorted(samples)[len(samples) // 2]
    print(f"   edit + syntax check + ruff (after the first edit) {full * 1000:.0f} ms per edit")


# --------------------------------------------------------------------------- main


def embedder(model: str | None) -> Any:
    """The embedder a run would use (the coder config of the current directory: its
    provider and endpoints), with `model` as embedding_model; None when it does not answer."""
    if not model:
        return None
    from coder import config as config_mod
    from coder.models.factory import open_embedder
    from coder.redact import Redactor

    cfg = config_mod.load(Path.cwd(), flags={"embedding_model": model})
    embed = open_embedder(cfg, redactor=Redactor())
    assert embed is not None
    try:
        embed(["probe"])
    except Exception as exc:  # noqa: BLE001 - no server or no model: hybrid is skipped
        print(f"(embedding model {model} unavailable: {type(exc).__name__}: {exc})")
        return None
    return embed


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--only", choices=("recall", "map", "edit"))
    parser.add_argument("--libraries", nargs="+")
    parser.add_argument("--files", type=int, default=5000, help="files of the generated tree")
    parser.add_argument("--repeats", type=int, default=9, help="edits per variant")
    parser.add_argument("--embed-model")
    args = parser.parse_args()
    libraries = args.libraries or [
        "click",
        "rich" if importlib.util.find_spec("rich") else "networkx",
    ]
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="coder-bench-context-") as name:
        tmp = Path(name)
        trees = {lib: tree for lib in libraries if (tree := library_tree(lib, tmp)) is not None}
        if args.only in (None, "recall"):
            bench_recall(trees, embedder(args.embed_model), args.embed_model or "")
        if args.only in (None, "map"):
            bench_map({**trees, f"generated {args.files}": synthetic_tree(tmp, args.files)}, tmp)
        if args.only in (None, "edit"):
            bench_edit(tmp, args.repeats)
    print(f"(benchmark took {time.perf_counter() - started:.0f}s)")


if __name__ == "__main__":
    main()
