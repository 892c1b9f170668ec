"""Definitions and references of one source file, read with tree-sitter queries.

A definition is a named function, method, class, type, module or top-level constant: its name,
kind, first and last line (1-based) and its first line of text (the signature shown in the repo
map). A reference is any identifier-like token of the file; the repo map keeps those that name
a definition of another file, which is what makes the reference graph. Queries run in C inside
tree-sitter, so a large file costs milliseconds.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from coder.context.languages import grammar, parse_tree
from coder.redact import redact

if TYPE_CHECKING:
    from tree_sitter import Query

MAX_SIGNATURE = 120  # characters of a definition's first line kept for the map

# Each pattern captures the whole definition as @def.KIND and its name as @name.
DEFINITIONS: dict[str, str] = {
    "python": """
        (class_definition name: (identifier) @name) @def.class
        (function_definition name: (identifier) @name) @def.function
        (module (expression_statement (assignment left: (identifier) @name)) @def.constant)
    """,
    "javascript": """
        (class_declaration name: (identifier) @name) @def.class
        (function_declaration name: (identifier) @name) @def.function
        (generator_function_declaration name: (identifier) @name) @def.function
        (method_definition name: (property_identifier) @name) @def.method
        (program (lexical_declaration (variable_declarator name: (identifier) @name)) @def.constant)
        (program (export_statement (lexical_declaration
            (variable_declarator name: (identifier) @name))) @def.constant)
    """,
    "typescript": """
        (class_declaration name: (type_identifier) @name) @def.class
        (abstract_class_declaration name: (type_identifier) @name) @def.class
        (interface_declaration name: (type_identifier) @name) @def.interface
        (type_alias_declaration name: (type_identifier) @name) @def.type
        (enum_declaration name: (identifier) @name) @def.enum
        (function_declaration name: (identifier) @name) @def.function
        (method_definition name: (property_identifier) @name) @def.method
        (program (lexical_declaration (variable_declarator name: (identifier) @name)) @def.constant)
        (program (export_statement (lexical_declaration
            (variable_declarator name: (identifier) @name))) @def.constant)
    """,
    "go": """
        (function_declaration name: (identifier) @name) @def.function
        (method_declaration name: (field_identifier) @name) @def.method
        (type_declaration (type_spec name: (type_identifier) @name)) @def.type
        (source_file (const_declaration (const_spec name: (identifier) @name)) @def.constant)
        (source_file (var_declaration (var_spec name: (identifier) @name)) @def.constant)
    """,
    "rust": """
        (function_item name: (identifier) @name) @def.function
        (function_signature_item name: (identifier) @name) @def.function
        (struct_item name: (type_identifier) @name) @def.struct
        (enum_item name: (type_identifier) @name) @def.enum
        (union_item name: (type_identifier) @name) @def.struct
        (trait_item name: (type_identifier) @name) @def.trait
        (type_item name: (type_identifier) @name) @def.type
        (mod_item name: (identifier) @name) @def.module
        (const_item name: (identifier) @name) @def.constant
        (static_item name: (identifier) @name) @def.constant
        (macro_definition name: (identifier) @name) @def.macro
    """,
    "java": """
        (class_declaration name: (identifier) @name) @def.class
        (interface_declaration name: (identifier) @name) @def.interface
        (enum_declaration name: (identifier) @name) @def.enum
        (record_declaration name: (identifier) @name) @def.class
        (method_declaration name: (identifier) @name) @def.method
        (constructor_declaration name: (identifier) @name) @def.method
    """,
    "c": """
        (function_definition declarator: (function_declarator
            declarator: (identifier) @name)) @def.function
        (function_definition declarator: (pointer_declarator declarator: (function_declarator
            declarator: (identifier) @name))) @def.function
        (struct_specifier name: (type_identifier) @name body: (_)) @def.struct
        (enum_specifier name: (type_identifier) @name body: (_)) @def.enum
        (union_specifier name: (type_identifier) @name body: (_)) @def.struct
        (type_definition declarator: (type_identifier) @name) @def.type
        (preproc_def name: (identifier) @name) @def.macro
        (preproc_function_def name: (identifier) @name) @def.macro
    """,
    "cpp": """
        (function_definition declarator: (function_declarator
            declarator: [(identifier) (field_identifier)] @name)) @def.function
        (function_definition declarator: (function_declarator
            declarator: (qualified_identifier name: (identifier) @name))) @def.function
        (function_definition declarator: (function_declarator declarator: (qualified_identifier
            name: (qualified_identifier name: (identifier) @name)))) @def.function
        (function_definition declarator: (pointer_declarator declarator: (function_declarator
            declarator: (identifier) @name))) @def.function
        (function_definition declarator: (reference_declarator (function_declarator
            declarator: [(identifier) (field_identifier)] @name))) @def.function
        (class_specifier name: (type_identifier) @name body: (_)) @def.class
        (struct_specifier name: (type_identifier) @name body: (_)) @def.struct
        (enum_specifier name: (type_identifier) @name body: (_)) @def.enum
        (union_specifier name: (type_identifier) @name body: (_)) @def.struct
        (type_definition declarator: (type_identifier) @name) @def.type
        (namespace_definition name: (namespace_identifier) @name) @def.module
        (preproc_def name: (identifier) @name) @def.macro
        (preproc_function_def name: (identifier) @name) @def.macro
    """,
    "ruby": """
        (class name: [(constant) (scope_resolution name: (_))] @name) @def.class
        (module name: [(constant) (scope_resolution name: (_))] @name) @def.module
        (method name: (_) @name) @def.method
        (singleton_method name: (_) @name) @def.method
    """,
    "csharp": """
        (class_declaration name: (identifier) @name) @def.class
        (interface_declaration name: (identifier) @name) @def.interface
        (struct_declaration name: (identifier) @name) @def.struct
        (enum_declaration name: (identifier) @name) @def.enum
        (record_declaration name: (identifier) @name) @def.class
        (method_declaration name: (identifier) @name) @def.method
        (constructor_declaration name: (identifier) @name) @def.method
    """,
    "php": """
        (class_declaration name: (name) @name) @def.class
        (interface_declaration name: (name) @name) @def.interface
        (trait_declaration name: (name) @name) @def.trait
        (enum_declaration name: (name) @name) @def.enum
        (function_definition name: (name) @name) @def.function
        (method_declaration name: (name) @name) @def.method
    """,
}

# Identifier-like node kinds per grammar: the references.
_IDENTIFIERS: dict[str, tuple[str, ...]] = {
    "python": ("identifier",),
    "javascript": ("identifier", "property_identifier"),
    "typescript": ("identifier", "property_identifier", "type_identifier"),
    "go": ("identifier", "type_identifier", "field_identifier"),
    "rust": ("identifier", "type_identifier", "field_identifier"),
    "java": ("identifier", "type_identifier"),
    "c": ("identifier", "type_identifier", "field_identifier"),
    "cpp": ("identifier", "type_identifier", "field_identifier", "namespace_identifier"),
    "ruby": ("identifier", "constant"),
    "csharp": ("identifier",),
    "php": ("name",),
}
_IDENTIFIERS["tsx"] = _IDENTIFIERS["typescript"]
DEFINITIONS["tsx"] = DEFINITIONS["typescript"]


@dataclass(frozen=True)
class Definition:
    name: str
    kind: str  # class, function, method, type, constant, ...
    line: int  # 1-based, first line
    end: int  # 1-based, last line
    signature: str  # the first line, right-stripped and capped

    def as_list(self) -> list[Any]:
        return [self.name, self.kind, self.line, self.end, self.signature]

    @classmethod
    def from_list(cls, item: list[Any]) -> Definition:
        return cls(str(item[0]), str(item[1]), int(item[2]), int(item[3]), str(item[4]))


@dataclass(frozen=True)
class FileTags:
    definitions: tuple[Definition, ...]
    references: dict[str, int]  # identifier -> occurrences (definitions' own names excluded)


@functools.cache
def _queries(language: str) -> tuple[Query, Query]:
    from tree_sitter import Query

    lang = grammar(language)
    if lang is None:  # callers ask only for languages `language_of` found installed
        raise LookupError(f"no tree-sitter grammar for {language} is installed")
    idents = " ".join(f"({kind})" for kind in _IDENTIFIERS[language])
    return Query(lang, DEFINITIONS[language]), Query(lang, f"[{idents}] @ref")


def extract(language: str, source: bytes) -> FileTags:
    """The definitions (in file order) and references of `source`."""
    from tree_sitter import QueryCursor

    tree = parse_tree(language, source)
    definitions_query, references_query = _queries(language)
    lines = source.split(b"\n")
    found: dict[tuple[int, str], Definition] = {}
    name_nodes: set[tuple[int, int]] = set()
    for _, match in QueryCursor(definitions_query).matches(tree.root_node):
        names = match.get("name") or []
        whole = next((nodes for key, nodes in match.items() if key.startswith("def.")), None)
        kind = next((key[4:] for key in match if key.startswith("def.")), "")
        if not names or not whole:
            continue
        name_node, node = names[0], whole[0]
        name = _text(name_node)
        row = node.start_point.row
        if not name or (row, name) in found:
            continue
        name_nodes.add((name_node.start_byte, name_node.end_byte))
        first = redact(lines[row].decode("utf-8", errors="replace").rstrip())  # shown, cached
        end = node.end_point.row + (0 if node.end_point.column == 0 else 1)
        found[(row, name)] = Definition(
            name=name,
            kind=kind,
            line=row + 1,
            end=max(row + 1, end),
            signature=first[:MAX_SIGNATURE],
        )
    references: dict[str, int] = {}
    for node in QueryCursor(references_query).captures(tree.root_node).get("ref", []):
        if (node.start_byte, node.end_byte) in name_nodes:
            continue
        text = _text(node)
        if text:
            references[text] = references.get(text, 0) + 1
    definitions = tuple(sorted(found.values(), key=lambda d: (d.line, d.end, d.name)))
    return FileTags(definitions, references)


def _text(node: Any) -> str:
    data = node.text
    return data.decode("utf-8", errors="replace") if data else ""
