"""tree-sitter reading of source files: definitions and references (tags.py), the first
syntax error and how it is shown (syntax.py)."""

from __future__ import annotations

import pytest

from coder.context import syntax, tags
from coder.context.languages import EXTENSIONS, language_of

SAMPLES = {
    "python": (
        b"X = 1\nclass A(Base):\n    def m(self):\n        return helper(X)\n"
        b"def helper(v):\n    return A()\n",
        {("X", "constant", 1), ("A", "class", 2), ("m", "function", 3), ("helper", "function", 5)},
    ),
    "javascript": (
        b"export const API = 1;\nclass Foo { bar() { return baz(API); } }\n"
        b"function baz(x) { return new Foo(); }\n",
        {("API", "constant", 1), ("Foo", "class", 2), ("bar", "method", 2), ("baz", "function", 3)},
    ),
    "typescript": (
        b"interface I { a: number }\ntype T = I | null;\nexport function f(x: I): T { return null }\n",
        {("I", "interface", 1), ("T", "type", 2), ("f", "function", 3)},
    ),
    "go": (
        b"package main\ntype S struct{ X int }\nfunc (s *S) M() int { return helper(s.X) }\n"
        b"func helper(x int) int { return x }\n",
        {("S", "type", 2), ("M", "method", 3), ("helper", "function", 4)},
    ),
    "rust": (
        b"pub struct S { x: i32 }\nimpl S {\n    pub fn new() -> Self { S { x: 0 } }\n}\n"
        b"trait T { fn t(&self); }\n",
        {("S", "struct", 1), ("new", "function", 3), ("T", "trait", 5), ("t", "function", 5)},
    ),
    "java": (
        b"class A {\n  int m() { return B.f(); }\n}\ninterface I {}\n",
        {("A", "class", 1), ("m", "method", 2), ("I", "interface", 4)},
    ),
    "c": (
        b"#define MAX 3\nstatic int *f(int a) { return 0; }\nint g(void) { return f(MAX) ? 1 : 0; }\n",
        {("MAX", "macro", 1), ("f", "function", 2), ("g", "function", 3)},
    ),
    "cpp": (
        b"namespace ns { class K { public: void m(); }; }\nvoid ns::K::m() {}\n",
        {("ns", "module", 1), ("K", "class", 1), ("m", "function", 2)},
    ),
    "ruby": (
        b"module M\n  class K < Base\n    def m; helper; end\n  end\nend\n",
        {("M", "module", 1), ("K", "class", 2), ("m", "method", 3)},
    ),
    "csharp": (
        b"namespace N {\n  class C {\n    int M() { return 1; }\n  }\n}\n",
        {("C", "class", 2), ("M", "method", 3)},
    ),
    "php": (
        b"<?php\nclass C { function m() { return f(); } }\nfunction f() { return 1; }\n",
        {("C", "class", 2), ("m", "method", 2), ("f", "function", 3)},
    ),
}


def test_every_language_with_an_extension_has_working_queries() -> None:
    assert set(EXTENSIONS.values()) == set(tags.DEFINITIONS)
    for language in tags.DEFINITIONS:
        tags.extract(language, b"")  # compiles both queries; a bad node name raises


@pytest.mark.parametrize("language", sorted(SAMPLES))
def test_definitions_per_language(language: str) -> None:
    source, expected = SAMPLES[language]
    found = tags.extract(language, source)
    assert {(d.name, d.kind, d.line) for d in found.definitions} == expected
    assert [d.line for d in found.definitions] == sorted(d.line for d in found.definitions)


def test_references_count_uses_but_not_the_definitions_own_names() -> None:
    source, _ = SAMPLES["python"]
    found = tags.extract("python", source)
    assert found.references["helper"] == 1  # the call; `def helper` is not a use
    assert found.references["X"] == 1 and found.references["A"] == 1
    definition = next(d for d in found.definitions if d.name == "A")
    assert (definition.end, definition.signature) == (4, "class A(Base):")


def test_language_of_by_extension() -> None:
    assert language_of("src/app.tsx") == "tsx" and language_of("a/B.PY") == "python"
    assert language_of("README.md") is None and language_of("Makefile") is None


@pytest.mark.parametrize(
    ("path", "source", "line", "message"),
    [
        ("a.py", "def f(x):\n    return (x + 1\n\ndef g():\n    pass\n", 2, "was never closed"),
        ("b.js", "function f() {\n  return 1;\n", 2, "missing `}`"),
        ("c.go", "package main\nfunc f() int { return 1 \n", 3, "missing `}`"),
        ("d.rs", "fn main() { let x = ; }\n", 1, "unexpected `=`"),
    ],
)
def test_the_first_syntax_error_is_located(path: str, source: str, line: int, message: str) -> None:
    problem = syntax.check(path, source.encode())
    assert problem is not None and problem.line == line and message in problem.message
    shown = syntax.show(source, problem)
    assert f"{line:>5}| " in shown and f"^ {problem.message}" in shown


def test_valid_files_and_unknown_languages_have_no_error() -> None:
    assert syntax.check("a.py", b"def f(x):\n    return x\n") is None
    assert syntax.check("notes.md", b"((((") is None  # no grammar: never refused
    assert syntax.check("a.py", b"x = '\\d'\n") is None  # a warning, not an error


def test_python_counts_only_when_its_own_parser_agrees() -> None:
    # Python 3.12 syntax the running 3.11 cannot compile, but which tree-sitter reads: not an
    # error (a grammar or interpreter that lags the project never refuses valid code).
    assert syntax.check("new.py", b"type Alias = int | None\n") is None


@pytest.mark.parametrize(
    ("path", "source", "line"),
    [
        ("data.json", '{\n  "a": 1,\n  "b": [1, 2\n}\n', 4),
        ("config.yaml", "a: 1\nb: [1, 2\nc: 3\n", 3),
        ("pyproject.toml", '[project]\nname = "x"\nversion = \n', 3),
        ("run.sh", "if true; then\n  echo hi\n", 3),
    ],
)
def test_data_files_and_scripts_are_checked(path: str, source: str, line: int) -> None:
    problem = syntax.check(path, source.encode())
    assert problem is not None and abs(problem.line - line) <= 1, problem


@pytest.mark.parametrize(
    ("path", "source"),
    [
        ("tsconfig.json", '{\n  // comments are fine in tsconfig\n  "strict": true\n}\n'),
        ("template.yaml", "Resources:\n  Bucket:\n    Name: !Ref BucketName\n"),
        ("Cargo.toml", '[package]\nname = "x"\nedition = "2021"\n'),
        ("run.sh", 'for f in *.txt; do\n  echo "$f"\ndone\n'),
    ],
)
def test_valid_data_files_and_dialects_are_never_refused(path: str, source: str) -> None:
    """JSON with comments parses for tree-sitter but not for `json`; a YAML tag is unknown to
    a safe loader but fine to the parser: an error counts only when both parsers agree."""
    assert syntax.check(path, source.encode()) is None
