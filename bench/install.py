"""What installing coder costs: `pip install .` into a fresh virtual environment, its size on
disk and its time, with the largest packages named, against a baseline measured in the same
run (a fresh venv with nothing installed; its size is subtracted). Goal: <= 150 MB.

    python bench/install.py            # from the local package index pip is configured with
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GOAL_MB = 150


def size_of(path: Path) -> int:
    total = 0
    for dirpath, _dirs, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(dirpath, name)).st_size
            except OSError:
                pass
    return total


def site_packages(venv: Path) -> Path:
    [found] = venv.glob("lib/python*/site-packages")
    return found


def fresh_venv(where: Path) -> Path:
    subprocess.run([sys.executable, "-m", "venv", str(where)], check=True)
    return where


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="coder-install-") as tmp:
        empty = size_of(site_packages(fresh_venv(Path(tmp) / "empty")))
        venv = fresh_venv(Path(tmp) / "coder")
        started = time.perf_counter()
        subprocess.run(
            [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", str(ROOT)],
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        seconds = time.perf_counter() - started
        site = site_packages(venv)
        installed = size_of(site) - empty
        by_package: dict[str, int] = {}
        for entry in site.iterdir():
            name = entry.name.split("-")[0].removesuffix(".libs").removesuffix(".py")
            size = size_of(entry) if entry.is_dir() else entry.stat().st_size
            by_package[name] = by_package.get(name, 0) + size
    mb = installed / 2**20
    verdict = "ok" if mb <= GOAL_MB else "over"
    print(
        f"pip install . into a fresh venv: {mb:.0f} MB (goal <= {GOAL_MB} MB: {verdict}), "
        f"{seconds:.0f} s (from the local index; a fresh venv alone: {empty / 2**20:.0f} MB)"
    )
    print("largest:")
    for name, size in sorted(by_package.items(), key=lambda kv: -kv[1])[:8]:
        print(f"   {name:<24} {size / 2**20:6.1f} MB")


if __name__ == "__main__":
    main()
