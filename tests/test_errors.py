"""The error tree lives in one module, drawn in its docstring, each class with its exit code."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import coder
from coder import errors

PACKAGE = Path(coder.__file__).resolve().parent
ERROR_CLASSES = {
    name: cls
    for name, cls in vars(errors).items()
    if isinstance(cls, type) and issubclass(cls, errors.CoderError)
}
EXCEPTION_BASES = set(ERROR_CLASSES) | {"Exception", "BaseException", "ValueError", "OSError"}


def test_no_error_class_is_defined_outside_coder_errors() -> None:
    """Private flow-control exceptions (a leading underscore, never raised past their module)
    are the only exception classes allowed elsewhere."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path == PACKAGE / "errors.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.ClassDef) or node.name.startswith("_"):
                continue
            bases = {
                b.id if isinstance(b, ast.Name) else getattr(b, "attr", "") for b in node.bases
            }
            if bases & EXCEPTION_BASES:
                found.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno}: {node.name}")
    assert not found, "move these into coder/errors.py:\n" + "\n".join(found)


def test_the_docstring_draws_every_class_with_its_parent_and_exit_code() -> None:
    doc = errors.__doc__ or ""
    drawn: dict[str, tuple[int, str | None]] = {}
    stack: list[tuple[int, str]] = []
    for line in doc.splitlines():
        match = re.match(r"^(\s*(?:[│ ]   )*(?:[├└]── )?)([A-Z]\w+)\s+(?:exit )?(\d+)", line)
        if not match:
            continue
        depth, name, code = len(match[1]), match[2], int(match[3])
        while stack and stack[-1][0] >= depth:
            stack.pop()
        drawn[name] = (code, stack[-1][1] if stack else None)
        stack.append((depth, name))
    assert set(drawn) == set(ERROR_CLASSES)
    for name, (code, parent) in drawn.items():
        cls = ERROR_CLASSES[name]
        assert cls.exit_code == code, name
        assert parent is None or cls.__bases__[0].__name__ == parent, name
