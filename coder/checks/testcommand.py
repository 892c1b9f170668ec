"""Which command runs a project's tests, guessed from the files that name a test framework
(`coder init` writes it into coder.config.json; a step, `doctor` and `merge --if-green` fall
back on it when the config names none). Every file is read through coder.files.safeio: a
worktree a command touched may hold a FIFO where a marker file was."""

from __future__ import annotations

import os
from pathlib import Path

from coder import yamldoc
from coder.files.safeio import read_regular


def detect_test_command(root: Path) -> str | None:
    """The project's test command, from the files that name a test framework."""

    def has(name: str) -> bool:
        return (root / name).exists()

    def mentions(name: str, word: str) -> bool:
        try:  # a fifo a command left there is refused, not waited on
            return word in read_regular(root / name).decode("utf-8", errors="replace")
        except OSError:
            return False

    if has("package.json"):
        try:
            package = yamldoc.loads_json(read_regular(root / "package.json").decode("utf-8"))
            scripts = package.get("scripts", {}) if isinstance(package, dict) else {}
        except (OSError, ValueError):
            scripts = {}
        if isinstance(scripts, dict) and "test" in scripts:
            return "npm test"
    if has("go.mod"):
        return "go test ./..."
    if has("Cargo.toml"):
        return "cargo test"
    python_markers = ("pyproject.toml", "setup.py", "setup.cfg", "tox.ini", "pytest.ini")
    if (
        has("pytest.ini")
        or has("conftest.py")
        or has("tests/conftest.py")
        or any(mentions(m, "pytest") for m in python_markers if has(m))
    ):
        return "python -m pytest -q"
    for folder in ("tests", "test", ""):
        found = sorted((root / folder).glob("test*.py"))[:50]
        if not found:
            continue
        # unittest finds only TestCase classes: plain `def test_...` functions need pytest
        if any(mentions(str(f.relative_to(root)), "TestCase") for f in found):
            return f"python -m unittest discover {f'-s {folder} ' if folder else ''}-v"
        return "python -m pytest -q"
    # Tests inside the package (`toolz/tests/`, `src/pkg/tests/`): what `python -m pytest` at
    # the root collects (TestCase classes too; `unittest discover` would need every folder
    # on the way to be a package)
    return "python -m pytest -q" if _has_inner_tests(root) else None


_TEST_FOLDERS = frozenset({"test", "tests"})  # folder names, not step kinds
# Not the project's own tests: virtual environments, dependencies, build output.
_NOT_TESTS = {".tox", ".nox", "venv", "env", "node_modules", "build", "dist", "site-packages"}


def _has_inner_tests(root: Path, *, depth: int = 4) -> bool:
    """Whether a folder named test or tests, at most `depth` folders below the root, holds
    a file pytest collects (`test_*.py`, `*_test.py`); hidden folders (`.git`, `.venv`) and
    the folders above are passed over."""
    for here, dirs, files in os.walk(root):
        level = here[len(str(root)) :].count(os.sep)
        if (
            os.path.basename(here) in _TEST_FOLDERS
            and level
            and any(
                f.endswith(".py") and (f.startswith("test_") or f.endswith("_test.py"))
                for f in files
            )
        ):
            return True
        keep = [d for d in dirs if d not in _NOT_TESTS and not d.startswith(".")]
        dirs[:] = keep if level < depth else []
    return False
