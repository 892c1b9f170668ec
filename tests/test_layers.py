"""The package's layers import one way: from the CLI down, never up.

Every `import coder.x` / `from coder.x import ...` in every module (at module level, inside
functions and under TYPE_CHECKING alike) is read with `ast` and checked against the layer map
below. A new module must be placed in the map; a new upward import fails here with the file,
line and both layers named.

Inside the layers, modules import without circles: the module-level import graph (a node per
module, not per layer) is searched for one, and a circle fails naming its modules in order
(imports under TYPE_CHECKING count too: see test_no_import_circle).
"""

from __future__ import annotations

import ast
import re
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
        "files",
        "crashpoints",
        "interrupts",
    ),
    # the domain: configuration, taskfiles and their graph, test and lint reports
    ("config", "taskfile", "checks"),
    # safety rules and git
    ("policy", "git", "project"),
    # what the model is shown about the code (tree-sitter, the repo map, code search)
    ("context",),
    ("models",),
    ("tools",),
    ("agent",),
    # the run engine
    ("run",),
    # the services a user calls on a run, one module per command
    ("services",),
    # a run's steps on other machines (workers, engines, the coordinator's part)
    ("fleet",),
    # planning and the MCP server
    ("plan", "mcp"),
    ("cli", "__main__"),
)
LAYER_OF = {name: i for i, names in enumerate(LAYERS) for name in names}


def unit_of(module: str) -> str:
    """`coder.run.steps.model` -> `run`; `coder` -> `coder`."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def module_name(path: Path, package: Path = PACKAGE) -> str:
    parts = list(path.relative_to(package.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


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


RAY_ENGINE = PACKAGE / "fleet" / "ray_engine.py"


def ray_imports(path: Path) -> list[int]:
    """The lines where a module imports ray (at any level)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    return sorted(
        node.lineno
        for node in ast.walk(tree)
        if (isinstance(node, ast.Import) and any(a.name.split(".")[0] == "ray" for a in node.names))
        or (isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "ray")
    )


def test_only_the_ray_engine_imports_ray() -> None:
    """ray is an optional extra (`coder[ray]`, 80 MB): one module imports it, and only the ray
    executor imports that module (coder.fleet.engines.engine_for)."""
    found = [
        f"{p.relative_to(PACKAGE.parent)}:{line}"
        for p in MODULES
        if p != RAY_ENGINE
        for line in ray_imports(p)
    ]
    assert not found, "ray imported outside coder/fleet/ray_engine.py:\n" + "\n".join(found)
    assert ray_imports(RAY_ENGINE), "the check looks at the module that does import ray"
    lazily = 'import_module("coder.fleet.ray_engine")'
    importers = [
        p.name
        for p in MODULES
        if lazily in p.read_text(encoding="utf-8")
        or any(target == "coder.fleet.ray_engine" for _, target in imports_of(p))
    ]
    assert importers == ["engines.py"]


# --------------------------------------------------------------------------- import circles


def module_imports(path: Path, modules: set[str]) -> set[str]:
    """The modules of `modules` that `path` imports, at module level, inside a function (a
    lazy import only puts off the circle) or under TYPE_CHECKING (a type in the wrong
    module). `from coder.x import y` is an edge to the module `coder.x.y` when there is one,
    else to `coder.x`. A package's `__init__` is not
    counted as imported by its submodules' imports (Python runs it first, but it is the
    package's index, not a dependency)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                found.add(sub if sub in modules else node.module)
    return found & modules


def import_graph(package: Path) -> dict[str, set[str]]:
    """Module -> the modules it imports, over every module under `package`."""
    paths = {module_name(p, package): p for p in sorted(package.rglob("*.py"))}
    names = set(paths)
    return {m: module_imports(p, names) - {m} for m, p in paths.items()}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One circle per strongly connected part of `graph` (Tarjan), as the path that goes
    round it: `[a, b, a]` for a imports b imports a."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    parts: list[set[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            part = {stack.pop()}
            while v not in part:
                part.add(stack.pop())
            if len(part) > 1:
                parts.append(part)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return [_round(graph, part) for part in parts]


def _round(graph: dict[str, set[str]], part: set[str]) -> list[str]:
    """The shortest way from the part's first module back to it, inside the part."""
    start = min(part)
    paths = {start: [start]}
    queue = [start]
    while queue:
        v = queue.pop(0)
        for w in sorted(graph[v] & part):
            if w == start:
                return paths[v] + [start]
            if w not in paths:
                paths[w] = paths[v] + [w]
                queue.append(w)
    raise AssertionError(f"no way round {sorted(part)}")


def test_no_import_circle() -> None:
    """No module of coder imports itself back through others: a circle means neither module
    can be read, tested or moved without the other. Imports inside functions count (a lazy
    import only puts the circle off), and so do imports under `if TYPE_CHECKING:` (they never
    run, but a circle through one is a type in the wrong module)."""
    found = circles(import_graph(PACKAGE))
    assert not found, "import circles:\n" + "\n".join(" -> ".join(c) for c in found)


def test_the_circle_check_sees_a_circle(tmp_path: Path) -> None:
    """The test above can fail: a lazy import that closes a circle is found, and so is one
    under TYPE_CHECKING."""
    pkg = tmp_path / "coder"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("", encoding="utf-8")
    (pkg / "a.py").write_text("from coder import b\n", encoding="utf-8")
    (pkg / "b.py").write_text("def f():\n    from coder.c import x\n", encoding="utf-8")
    (pkg / "c.py").write_text("import coder.a\nx = 1\n", encoding="utf-8")
    (pkg / "d.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from coder import e\n",
        encoding="utf-8",
    )
    (pkg / "e.py").write_text("from coder import d\n", encoding="utf-8")
    assert circles(import_graph(pkg)) == [
        ["coder.a", "coder.b", "coder.c", "coder.a"],
        ["coder.d", "coder.e", "coder.d"],
    ]


def test_package_indexes_name_every_module() -> None:
    """A package docstring that lists its modules (`name.py` ...) lists all of them, and its
    subpackages (`name/`), so it stays an index a newcomer can trust."""
    stale = []
    for init in sorted(PACKAGE.rglob("__init__.py")):
        doc = ast.get_docstring(ast.parse(init.read_text(encoding="utf-8"))) or ""
        if not re.search(r"\b\w+\.py\b", doc):
            continue  # not an index
        here = init.parent
        parts = [p.name for p in here.glob("*.py") if p.name != "__init__.py"]
        parts += [f"{d.name}/" for d in here.iterdir() if (d / "__init__.py").is_file()]
        missing = sorted(p for p in parts if not re.search(rf"(?<![\w/]){re.escape(p)}", doc))
        if missing:
            stale.append(f"{init.relative_to(PACKAGE.parent)}: {', '.join(missing)}")
    assert not stale, "package docstrings that leave out modules:\n" + "\n".join(stale)


def unexplained_namesakes(package: Path) -> list[str]:
    """Modules that share a name with a module of another package, where neither package's
    docstring names the other module (`coder.tools.shell` in coder.run.steps' docstring says
    its `shell` is the step kind's, not the tool's)."""
    by_name: dict[str, list[Path]] = {}
    for path in sorted(package.rglob("*.py")):
        if path.name != "__init__.py":
            by_name.setdefault(path.stem, []).append(path)
    found = []
    for name, paths in sorted(by_name.items()):
        for i, one in enumerate(paths):
            for other in paths[i + 1 :]:
                docs = [_package_doc(one.parent), _package_doc(other.parent)]
                said = [module_name(other, package), module_name(one, package)]
                if not any(m in doc for doc, m in zip(docs, said, strict=True)):
                    rel = sorted(str(p.relative_to(package.parent)) for p in (one, other))
                    found.append(" and ".join(rel))
    return found


def _package_doc(directory: Path) -> str:
    init = directory / "__init__.py"
    if not init.is_file():
        return ""
    return ast.get_docstring(ast.parse(init.read_text(encoding="utf-8"))) or ""


def test_no_namesakes_unless_the_package_says_why() -> None:
    """Two modules of one name in different packages make a reader guess which one is meant:
    rename one, or have its package's docstring name the other and say why both."""
    found = unexplained_namesakes(PACKAGE)
    assert not found, "modules of one name, unexplained:\n" + "\n".join(found)


def test_the_namesake_check_sees_one(tmp_path: Path) -> None:
    pkg = tmp_path / "coder"
    for sub, doc in (("a", ""), ("b", '"""b.py"""'), ("c", '"""unlike coder.a.x"""')):
        (pkg / sub).mkdir(parents=True)
        (pkg / sub / "__init__.py").write_text(doc, encoding="utf-8")
        (pkg / sub / "x.py").write_text("", encoding="utf-8")
    (pkg / "__init__.py").write_text("", encoding="utf-8")
    assert unexplained_namesakes(pkg) == [
        "coder/a/x.py and coder/b/x.py",
        "coder/b/x.py and coder/c/x.py",
    ]


# --------------------------------------------------------------------------- imports at the top

MOST_FUNCTION_LEVEL_IMPORTS = 60


def _imports_coder(node: ast.Import | ast.ImportFrom) -> bool:
    if isinstance(node, ast.Import):
        return any(a.name.split(".")[0] == "coder" for a in node.names)
    return node.level == 0 and (node.module or "").split(".")[0] == "coder"


def function_level_imports(package: Path) -> list[str]:
    """`file:line: import ...` of each import of a coder module inside a function (a method,
    a function inside one)."""
    found = []
    for path in sorted(package.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        inside = {
            node
            for function in ast.walk(tree)
            if isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef)
            for statement in function.body
            for node in ast.walk(statement)
            if isinstance(node, ast.Import | ast.ImportFrom) and _imports_coder(node)
        }
        rel = path.relative_to(package.parent)
        found += [
            f"{rel}:{n.lineno}: {ast.unparse(n)}" for n in sorted(inside, key=lambda n: n.lineno)
        ]
    return found


def test_imports_are_at_the_top() -> None:
    """A module imports what it uses at its top, so that the import graph a reader sees is
    the real one. An import of a coder module inside a function is kept only for the command
    line's start-up (bench/startup.py, tests/test_cli_basics.py): at the command boundary
    (`coder/cli/`: the error edge `coder --help` loads, `status` with no runs yet), and in a
    module `coder --help`, `status`, `show -t`, `logs -t` or `validate` loads, for what only
    its other paths need (libgit2 through `coder.git`, YAML through `coder.yamldoc`, the run
    engine), or in front of rich (`coder.cli.live`), which only the live view loads."""
    found = function_level_imports(PACKAGE)
    assert len(found) <= MOST_FUNCTION_LEVEL_IMPORTS, (
        f"{len(found)} imports of coder modules inside functions, at most "
        f"{MOST_FUNCTION_LEVEL_IMPORTS}: move one to its module's top where no start-up command "
        "would then load what it does not need (this test's docstring):\n" + "\n".join(found)
    )


def test_the_import_count_sees_an_import_in_a_function(tmp_path: Path) -> None:
    """The test above can fail: an import of a coder module in a function, a nested function
    or a method is found; one at the top, or of another package, is not."""
    pkg = tmp_path / "coder"
    pkg.mkdir()
    (pkg / "a.py").write_text(
        "import os\nfrom coder import b\n\n"
        "def f():\n    import json\n    from coder.c import x\n\n"
        "    def g():\n        import coder.d\n\n"
        "class K:\n    def m(self):\n        if x:\n            from coder import e\n",
        encoding="utf-8",
    )
    assert function_level_imports(pkg) == [
        "coder/a.py:6: from coder.c import x",
        "coder/a.py:9: import coder.d",
        "coder/a.py:14: from coder import e",
    ]


# --------------------------------------------------------------------------- function length

LONGEST = 80  # lines of a function from its `def`, its docstring included


def long_functions(package: Path) -> list[str]:
    """`file:line name (N lines)` of every function (or method) longer than LONGEST."""
    found = []
    for path in sorted(package.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                if length > LONGEST:
                    rel = path.relative_to(package.parent)
                    found.append(f"{rel}:{node.lineno} {node.name} ({length} lines)")
    return found


def test_no_function_over_80_lines() -> None:
    """A function a reader cannot take in at once is split along its steps."""
    assert long_functions(PACKAGE) == []


def test_the_length_check_sees_a_long_function(tmp_path: Path) -> None:
    pkg = tmp_path / "coder"
    pkg.mkdir()
    body = "".join(f"    x{i} = {i}\n" for i in range(LONGEST))
    (pkg / "long.py").write_text(f"def short():\n    pass\n\n\ndef long():\n{body}")
    assert long_functions(pkg) == [f"coder/long.py:5 long ({LONGEST + 1} lines)"]
