"""What summaries when the context folds (coder.agent.summarize) cost and keep, measured on the
fake Ollama server.

    python bench/fold.py                 # 16 pages of 30 lines, an 8,192-token model
    python bench/fold.py --pages 24      # a longer step

One `coder run --autonomous` (a subprocess, HOME isolated) of an analyze step that reads a
log page by page with fs_read, then finishes. Each page holds one fact in its middle
(`FACT n: valuen`; folding keeps only a result's first line, so a folded page loses it). The
run is made twice, with `fold_summaries` off and on; the scripted turns are the same.

The fake model writes the summary a model that follows coder's summary prompt would write:
the facts the summarised turns hold, quoted (tests/helpers.py `quoting_summaries`). So this
measures the mechanism (what reaches the later requests, and what it costs), not a real
model's summarising: a real model may keep fewer facts, never more.

    model calls           the step's chat requests (summary calls included)
    prompt tokens/step    the fake's prompt_eval_count estimate (a quarter of the JSON of
                          messages + tools) summed over the step's requests: what a server
                          evaluates with no cache
    uncached tokens/step  the same, less each request's common prefix with the one before
                          (tests/prefix_cache.py's rendering: what a one-slot KV cache
                          reuses): what the server really evaluates
    largest request       the largest prompt estimate (must stay under the window)
    facts kept, last      planted facts present in the request that ends the step (the turn
                          that "answers"), out of all
    facts reachable       over every request after a fact's page was read, the share that
                          still holds the fact
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.fake_ollama import FakeOllama, Reply, estimate_prompt_tokens  # noqa: E402
from tests.helpers import call, done, quoting_summaries  # noqa: E402
from tests.prefix_cache import common_prefix, is_priming, render  # noqa: E402

PAGE = 30  # lines per fs_read
WINDOW = 8192
MODEL = "bench:8k"
FACT = re.compile(r"FACT \d+: \w+")
TASK = """\
id: fold
title: Read the log
model: bench:8k
policies: {max_turns: 200}
graph:
  - {kind: analyze, goal: "Read log.txt page by page and report what it says"}
"""


def log_text(pages: int) -> str:
    lines = [
        f"line {i}: " + "request served in 12 ms from the pool " * 2 for i in range(PAGE * pages)
    ]
    for i in range(PAGE // 2, PAGE * pages, PAGE):
        lines[i] = f"FACT {i}: value{i}"
    return "\n".join(lines) + "\n"


def script(pages: int) -> list[Reply]:
    reads = [call("fs_read", path="log.txt", offset=1 + PAGE * i, limit=PAGE) for i in range(pages)]
    return [*reads, done("read the log")]


def run(tmp: Path, pages: int, summaries: bool) -> dict[str, Any]:
    name = "on" if summaries else "off"
    home = tmp / f"home-{name}"
    (home / ".config" / "coder").mkdir(parents=True)
    (home / ".config" / "coder" / "config.json").write_text(
        json.dumps({"fold_summaries": summaries})
    )
    (home / ".gitconfig").write_text(
        "[user]\n\tname = Bench\n\temail = bench@localhost\n[init]\n\tdefaultBranch = main\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OLLAMA_", "CODER_", "GIT_"))}
    env.update(HOME=str(home), XDG_CONFIG_HOME=str(home / ".config"), GIT_CONFIG_NOSYSTEM="1")
    repo = tmp / f"repo-{name}"
    repo.mkdir()
    (repo / "log.txt").write_text(log_text(pages))
    (repo / "README.md").write_text("# a service's log\n")
    for args in (["init", "-q", "-b", "main"], ["add", "-A"], ["commit", "-q", "-m", "init"]):
        subprocess.run(["git", *args], cwd=repo, env=env, check=True)
    (tmp / f"task-{name}.yaml").write_text(TASK)
    models = {MODEL: {"context_length": WINDOW, "capabilities": ["completion", "tools"]}}
    with FakeOllama(models=models) as fake:
        fake.answer = quoting_summaries(FACT.pattern)
        fake.enqueue(*script(pages))
        env["OLLAMA_HOST"] = fake.url
        proc = subprocess.run(
            [sys.executable, "-m", "coder", "run", "--autonomous", "-f", f"../task-{name}.yaml"],
            cwd=repo,
            env={**env, "PYTHONPATH": str(ROOT)},
            capture_output=True,
            text=True,
        )
        left = fake.pending
        bodies = [b for b in fake.chat_bodies() if b.get("messages") and not is_priming(b)]
    if proc.returncode != 0 or left:
        raise SystemExit(f"coder run failed ({left} replies left):\n{proc.stdout}{proc.stderr}")
    return measure(bodies, pages)


def measure(bodies: list[dict[str, Any]], pages: int) -> dict[str, Any]:
    planted = [f"FACT {i}: value{i}" for i in range(PAGE // 2, PAGE * pages, PAGE)]
    texts = ["\n".join(m.get("content", "") for m in b["messages"]) for b in bodies]
    read: set[str] = set()  # facts whose page came back in a tool result so far
    reachable = pairs = 0
    for body, text in zip(bodies, texts):
        present = set(FACT.findall(text))
        pairs += len(read)
        reachable += len(read & present)
        for m in body["messages"]:
            if m["role"] == "tool":
                read |= set(FACT.findall(m.get("content", "")))
    sizes = [estimate_prompt_tokens(b) for b in bodies]
    uncached = sizes[0] + sum(
        size - common_prefix(render(prev), render(cur)) // 4
        for prev, cur, size in zip(bodies, bodies[1:], sizes[1:])
    )
    return {
        "calls": len(bodies),
        "prompt_tokens": sum(sizes),
        "uncached_tokens": uncached,
        "largest": max(sizes),
        "kept_last": len(set(FACT.findall(texts[-1])) & set(planted)),
        "planted": len(planted),
        "reachable": reachable / pairs if pairs else 1.0,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pages", type=int, default=16, help="pages the step reads")
    pages = parser.parse_args().pages
    tmp = Path(tempfile.mkdtemp(prefix="coder-fold-"))
    try:
        off, on = run(tmp, pages, False), run(tmp, pages, True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    rows = [
        ("model calls", "calls", "{:,}"),
        ("prompt tokens/step", "prompt_tokens", "{:,}"),
        ("uncached tokens/step", "uncached_tokens", "{:,}"),
        ("largest request", "largest", "{:,}"),
    ]
    print(f"{pages} pages of {PAGE} lines, a {WINDOW:,}-token window\n")
    print(f"{'':24}{'folding only':>16}{'with summaries':>16}{'ratio':>8}")
    for label, key, fmt in rows:
        ratio = on[key] / off[key] if off[key] else float("nan")
        print(f"{label:24}{fmt.format(off[key]):>16}{fmt.format(on[key]):>16}{ratio:>8.2f}")
    kept = [f"{r['kept_last']}/{r['planted']}" for r in (off, on)]
    print(f"{'facts kept, last':24}{kept[0]:>16}{kept[1]:>16}")
    share = [f"{r['reachable']:.0%}" for r in (off, on)]
    print(f"{'facts reachable':24}{share[0]:>16}{share[1]:>16}")


if __name__ == "__main__":
    main()
