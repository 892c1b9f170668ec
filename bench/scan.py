"""A step's scan and staging (`coder.git.staging.stage`) by each of its two ways, as repositories
grow: libgit2 in process, and the git program (run confined, as coder runs it), against the
git CLI's own `git add -A && git write-tree` for scale.

    python bench/scan.py                          # 100 ... 20,000 files, best of 9 each
    python bench/scan.py --sizes 100 3000 --repeats 15

For each size a repository of small text files in nested directories (as bench/step_overhead.py
makes them) gets a linked worktree; each round overwrites one file and times, one after the
other on the same tree:

    libgit2      stage() with the in-process scan forced (IN_PROCESS_BELOW above the size):
                 libgit2's status (it reads every directory), index.add of what changed,
                 write_tree, index.write
    git          stage() with the git program forced (IN_PROCESS_BELOW = 0): `git status`
                 (stat data trusted, untracked cache), `git update-index`, `git write-tree`,
                 each a confined process, objects through the quarantine
    git CLI      `git add -A && git write-tree`, unconfined: what git itself needs to stage
                 (for scale; it leaves nested repositories and submodules to no one)

Both of coder's ways end with the same change set (the staged tree against the base, walked
through tree ids), which is included. The best of --repeats rounds is kept (a shared machine).
The last line says which way is faster at each size: `IN_PROCESS_BELOW` in staging.py sits
between where libgit2 wins and where git does.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from step_overhead import GIT_ENV, file_path, git, make_repo  # noqa: E402

from coder.git import staging  # noqa: E402


def timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def measure(size: int, tmp: Path, repeats: int) -> dict[str, float]:
    repo = make_repo(tmp / f"repo{size}", size)
    worktree = tmp / f"wt{size}"
    git(repo, "worktree", "add", "-q", "-b", f"wt{size}", str(worktree), "main")
    base = git(repo, "rev-parse", "main").strip()
    target = worktree / file_path(size // 2)

    def forced(below: int) -> Callable[[], object]:
        def run() -> object:
            staging.IN_PROCESS_BELOW = below
            return staging.stage(worktree, base)

        return run

    ways: dict[str, Callable[[], object]] = {
        "libgit2": forced(size + 1),
        "git": forced(0),
        "git CLI": lambda: subprocess.run(
            ["bash", "-c", "git add -A && git write-tree"],
            cwd=worktree,
            env=GIT_ENV,
            check=True,
            stdout=subprocess.DEVNULL,
        ),
    }
    best = dict.fromkeys(ways, float("inf"))
    for name, fn in ways.items():  # warm up: caches, the sandbox's spawner, the untracked cache
        target.write_text(f"warm {name}\n")
        fn()
    for k in range(repeats):
        for name, fn in ways.items():
            target.write_text(f"round {k} {name}\n")
            best[name] = min(best[name], timed(fn))
    return best


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument(
        "--sizes", type=int, nargs="+", default=[100, 1000, 3000, 5000, 20_000], help="files"
    )
    parser.add_argument("--repeats", type=int, default=9, help="rounds, best kept (default 9)")
    args = parser.parse_args(argv)
    chosen = staging.IN_PROCESS_BELOW
    began = time.perf_counter()
    faster = []
    with tempfile.TemporaryDirectory(prefix="coder-scan-bench-") as tmp_name:
        for size in sorted(set(args.sizes)):
            best = measure(size, Path(tmp_name), args.repeats)
            lib, prog, cli = best["libgit2"], best["git"], best["git CLI"]
            print(
                f"{size:>7,} files: libgit2 {lib * 1000:7.1f} ms   git {prog * 1000:7.1f} ms   "
                f"(git CLI add+write-tree {cli * 1000:6.1f} ms)   git/libgit2 {prog / lib:4.2f}x"
            )
            faster.append(f"{size:,}: {'libgit2' if lib <= prog else 'git'}")
    staging.IN_PROCESS_BELOW = chosen
    print(
        f"faster: {', '.join(faster)} (IN_PROCESS_BELOW = {staging.IN_PROCESS_BELOW:,}; "
        f"benchmark took {time.perf_counter() - began:.0f}s)"
    )


if __name__ == "__main__":
    main()
