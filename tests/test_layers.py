"""The package's layers import one way: from the CLI down, never up.

Every `import coder.x` / `from coder.x import ...` in every module (at module level, inside
functions and under TYPE_CHECKING alike) is read with `ast` and checked against the layer map
below. A new module must be placed in the map; a new upward import fails here with the file,
line and both layers named.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import coder

PACKAGE = Path(coder.__file__).resolve().parent

# Lowest first. A module may import its own layer and the layers below it.
LAYERS: tuple[tuple[str, ...], ...] = (
    # base: no coder imports above this line
    (
        "coder",
        "errors",
        "schemas",
        "yamldoc",
        "redact",
        "display",
        "durable",
        "nofollow",
        "crashpoints",
        "safeio",
        "interrupts",
    ),
    # the domain: configuration, taskfiles and their graph, test reports
    ("config", "kinds", "taskfile", "graph", "diagram", "testreport", "lintreport"),
    # safety rules and git
    ("policy", "git"),
    # what the model is shown about the code (tree-sitter, the repo map, code search)
    ("context",),
    ("models",),
    ("tools",),
    ("agent",),
    # the run engine
    ("run",),
    # the services a user calls on a run, one module per command
    ("services",),
    # planning and the MCP server
    ("plan", "mcp"),
    ("cli", "__main__"),
)
LAYER_OF = {name: i for i, names in enumerate(LAYERS) for name in names}


def unit_of(module: str) -> str:
    """`coder.run.steps.model` -> `run`; `coder` -> `coder`."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if a.name.split(".")[0] == "coder"]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "coder":  # `from coder import config`: each name is a module
                found += [(node.lineno, f"coder.{a.name}") for a in node.names]
            elif node.module.startswith("coder."):
                found.append((node.lineno, node.module))
    return found


MODULES = sorted(PACKAGE.rglob("*.py"))


def test_every_module_has_a_layer() -> None:
    missing = sorted({unit_of(module_name(p)) for p in MODULES} - set(LAYER_OF))
    assert not missing, f"add these to LAYERS in {__file__}: {missing}"


def test_every_package_says_what_it_may_import() -> None:
    undocumented = [
        str(init.relative_to(PACKAGE.parent))
        for init in PACKAGE.glob("*/__init__.py")
        if "May import" not in init.read_text(encoding="utf-8")
    ]
    assert not undocumented, f"package docstrings without a 'May import' line: {undocumented}"


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(PACKAGE.parent)))
def test_no_upward_import(path: Path) -> None:
    me = unit_of(module_name(path))
    upward = [
        f"{path.relative_to(PACKAGE.parent)}:{line}: {me} (layer {LAYER_OF[me]}) imports "
        f"{target} (layer {LAYER_OF[unit_of(target)]})"
        for line, target in imports_of(path)
        if LAYER_OF.get(unit_of(target), 0) > LAYER_OF[me]
    ]
    assert not upward, "\n".join(upward)


def test_the_checker_sees_an_upward_import(tmp_path: Path) -> None:
    """The test above can fail: an upward import in a scratch module is found."""
    scratch = tmp_path / "scratch.py"
    scratch.write_text(
        "def f():\n    from coder.run import runs\n    import coder.cli\n", encoding="utf-8"
    )
    assert imports_of(scratch) == [(2, "coder.run"), (3, "coder.cli")]
    assert LAYER_OF[unit_of("coder.cli")] > LAYER_OF[unit_of("coder.policy.sandbox")]


# --- git behind one door: only coder/git/ talks to pygit2 ----------------------------------

GIT_PACKAGE = PACKAGE / "git"


def _pygit2_errors() -> frozenset[str]:
    import pygit2

    return frozenset(
        name
        for name in dir(pygit2)
        if isinstance(getattr(pygit2, name), type)
        and issubclass(getattr(pygit2, name), BaseException)
    )


def pygit2_uses(path: Path) -> list[tuple[int, str]]:
    """Where a module imports pygit2 (at module level, inside a function or under
    TYPE_CHECKING alike) or catches one of its exception types, however it is reached."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    errors = _pygit2_errors()
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [
                (node.lineno, f"import {a.name}")
                for a in node.names
                if a.name.split(".")[0] == "pygit2"
            ]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "pygit2":
            found.append((node.lineno, f"from {node.module} import ..."))
        elif isinstance(node, ast.ExceptHandler) and node.type is not None:
            names = {n.id for n in ast.walk(node.type) if isinstance(n, ast.Name)}
            names |= {n.attr for n in ast.walk(node.type) if isinstance(n, ast.Attribute)}
            found += [(node.lineno, f"except {name}") for name in sorted(names & errors)]
    return found


OUTSIDE_GIT = [p for p in MODULES if GIT_PACKAGE not in p.parents]


@pytest.mark.parametrize("path", OUTSIDE_GIT, ids=lambda p: str(p.relative_to(PACKAGE.parent)))
def test_only_git_imports_pygit2(path: Path) -> None:
    uses = [
        f"{path.relative_to(PACKAGE.parent)}:{line}: {what}" for line, what in pygit2_uses(path)
    ]
    assert not uses, (
        "pygit2 outside coder/git/ (add a function there that returns plain values):\n"
        + "\n".join(uses)
    )


def test_the_checker_sees_pygit2(tmp_path: Path) -> None:
    """The test above can fail: each way of reaching pygit2 in a scratch module is found."""
    scratch = tmp_path / "scratch.py"
    scratch.write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    import pygit2\n"
        "def f():\n    from pygit2.enums import SortMode\n"
        "    try:\n        pass\n    except (OSError, repository.GitError):\n        pass\n",
        encoding="utf-8",
    )
    assert pygit2_uses(scratch) == [
        (3, "import pygit2"),
        (5, "from pygit2.enums import ..."),
        (8, "except GitError"),
    ]
    assert GIT_PACKAGE / "repository.py" in MODULES and all(
        GIT_PACKAGE not in p.parents for p in OUTSIDE_GIT
    )
