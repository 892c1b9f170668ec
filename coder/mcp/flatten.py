"""External MCP input schemas -> the registry's flat form, plus validation against the original.

The ollama client keeps only `type`, `description`, `enum` and `items` of each property
(APIS.md §0.2): `$ref`, `anyOf`, nested `properties`, `default` and limits would be dropped
silently and the model would guess. So each property is reduced to those keys and everything
else is written into its description ("an object with fields: x (integer, required): ...;
default: 0; minimum: 1"). The original schema is kept to validate the model's arguments before
they are forwarded, so nothing the flat form loses is lost for checking.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from jsonschema import exceptions as js_exceptions
from jsonschema.validators import validator_for

from coder.schemas import JsonSchema

ALL_TYPES = ["string", "number", "integer", "boolean", "object", "array"]
_SCALARS = ("string", "number", "integer", "boolean", "null")
_NOTED = (
    "default",
    "const",
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
    "minLength",
    "maxLength",
    "pattern",
    "format",
    "minItems",
    "maxItems",
    "uniqueItems",
    "multipleOf",
)
_MAX_DEPTH = 3
_MAX_REFS = 16
_JSON_TYPE = {
    str: "string",
    bool: "boolean",
    int: "integer",
    float: "number",
    type(None): "null",
    list: "array",
    dict: "object",
}


def flatten_schema(schema: Mapping[str, Any] | None) -> JsonSchema:
    """The flat object schema (registry form) for an MCP tool's `inputSchema`."""
    root: Mapping[str, Any] = schema if isinstance(schema, Mapping) else {}
    body = _resolve(root, root)
    found = body.get("properties")
    props: Mapping[str, Any] = found if isinstance(found, Mapping) else {}
    required = [r for r in body.get("required") or [] if isinstance(r, str) and r in props]
    out = {str(key): _flat_property(str(key), spec, root) for key, spec in props.items()}
    flat: JsonSchema = {"type": "object", "properties": out, "required": required}
    if body.get("additionalProperties") is False:
        flat["additionalProperties"] = False
    return flat


def argument_problem(
    schema: Mapping[str, Any], arguments: Mapping[str, Any], tool: str
) -> str | None:
    """Why `arguments` do not fit the tool's original schema (one line), or None.
    A schema that is itself invalid cannot be checked: the server judges the call."""
    try:
        cls = validator_for(schema)
        cls.check_schema(dict(schema))
        error = js_exceptions.best_match(cls(schema).iter_errors(dict(arguments)))
    except Exception:  # noqa: BLE001 - an invalid schema, an unresolvable $ref: the server judges
        return None
    if error is None:
        return None
    where = ".".join(str(p) for p in error.absolute_path)
    return (
        f"argument {where!r} of {tool}: {error.message}"
        if where
        else f"arguments of {tool}: {error.message}"
    )


# --------------------------------------------------------------------------- internals


def _resolve(spec: Any, root: Mapping[str, Any]) -> JsonSchema:
    """Follow local `$ref`s (`#/$defs/X`, `#/definitions/X`) and merge a single `allOf`;
    the referring schema's own keywords (description, default) win over the target's."""
    seen = 0
    spec = dict(spec) if isinstance(spec, Mapping) else {}
    while "$ref" in spec and seen < _MAX_REFS:
        seen += 1
        target = _pointer(root, spec.pop("$ref"))
        spec = {**target, **spec}
    all_of = spec.get("allOf")
    if isinstance(all_of, list) and len(all_of) == 1:
        spec = {**_resolve(all_of[0], root), **{k: v for k, v in spec.items() if k != "allOf"}}
    resolved: JsonSchema = spec
    return resolved


def _pointer(root: Mapping[str, Any], ref: Any) -> JsonSchema:
    if not isinstance(ref, str) or not ref.startswith("#"):
        return {}
    node: Any = root
    for part in [p for p in ref[1:].split("/") if p]:
        part = part.replace("~1", "/").replace("~0", "~")
        if not isinstance(node, Mapping) or part not in node:
            return {}
        node = node[part]
    return dict(node) if isinstance(node, Mapping) else {}


def _variants(spec: JsonSchema, root: Mapping[str, Any]) -> tuple[list[JsonSchema], bool]:
    """The non-null alternatives of an anyOf/oneOf, and whether null was one of them."""
    options = spec.get("anyOf") or spec.get("oneOf")
    if not isinstance(options, list):
        return [], False
    resolved = [_resolve(o, root) for o in options]
    nullable = any(o.get("type") == "null" for o in resolved)
    return [o for o in resolved if o.get("type") != "null"], nullable


def _merged(spec: JsonSchema, root: Mapping[str, Any]) -> tuple[JsonSchema, list[JsonSchema]]:
    """`spec` with a single non-null anyOf alternative merged in; else the alternatives."""
    variants, _ = _variants(spec, root)
    base = {k: v for k, v in spec.items() if k not in ("anyOf", "oneOf")}
    if len(variants) == 1:
        return {**variants[0], **base}, []
    return base, variants


def _types(spec: JsonSchema, variants: list[JsonSchema]) -> list[str]:
    if variants:
        found: list[str] = []
        for v in variants:
            for t in _types(v, []):
                if t not in found:
                    found.append(t)
        return found or list(ALL_TYPES)
    declared = spec.get("type")
    if isinstance(declared, str):
        return [declared] if declared != "null" else ["null"]
    if isinstance(declared, list):
        kept = [t for t in declared if isinstance(t, str) and t != "null"]
        return kept or ["null"]
    if "properties" in spec:
        return ["object"]
    if "items" in spec:
        return ["array"]
    values = (
        spec.get("enum")
        if isinstance(spec.get("enum"), list)
        else ([spec["const"]] if "const" in spec else None)
    )
    if values:
        return sorted({_JSON_TYPE.get(type(v), "string") for v in values})
    return list(ALL_TYPES)


def _type_value(types: list[str]) -> str | list[str]:
    return types[0] if len(types) == 1 else types


def _flat_property(key: str, spec: Any, root: Mapping[str, Any]) -> JsonSchema:
    resolved, variants = _merged(_resolve(spec, root), root)
    types = _types(resolved, variants)
    flat: JsonSchema = {
        "type": _type_value(types),
        "description": _describe(resolved, variants, root, 0, key),
    }
    enum = resolved.get("enum")
    if enum is not None and _scalar_enum(enum):
        flat["enum"] = list(enum)
    if types == ["array"]:
        item, item_variants = _merged(_resolve(resolved.get("items"), root), root)
        item_types = _types(item, item_variants) if item else []
        if item_types == ["object"]:
            flat["items"] = {"type": "object"}  # its fields are in the description
        elif item_types and all(t in _SCALARS for t in item_types):
            flat["items"] = {"type": _type_value(item_types)}
            if _scalar_enum(item.get("enum")):
                flat["items"]["enum"] = list(item["enum"])
    return flat


def _describe(
    spec: JsonSchema,
    variants: list[JsonSchema],
    root: Mapping[str, Any],
    depth: int,
    key: str = "",
) -> str:
    """The property's description with what the flat form cannot carry."""
    parts = []
    text = spec.get("description")
    title = spec.get("title")
    if not text and isinstance(title, str) and _squash(title) != _squash(key):
        text = title  # pydantic titles just repeat the name ("Point" for point): skipped
    first = " ".join(text.split()).rstrip(".") if isinstance(text, str) else ""
    notes = [
        f"{name}: {_short(spec[name])}"
        for name in _NOTED
        if name in spec and not (name == "default" and spec[name] is None)
    ]
    if notes:
        first = (first + " " if first else "") + "(" + "; ".join(notes) + ")"
    if first:
        parts.append(first + ".")
    if variants:
        parts.append("One of: " + " | ".join(_summary(v, root, depth + 1) for v in variants))
    elif isinstance(spec.get("properties"), Mapping):
        parts.append(_object_fields(spec, root, depth + 1))
    elif spec.get("items") is not None:
        item, item_variants = _merged(_resolve(spec["items"], root), root)
        if item_variants or isinstance(item.get("properties"), Mapping):
            parts.append(
                "Each item: "
                + _summary(
                    {**item, "anyOf": item_variants} if item_variants else item, root, depth + 1
                )
            )
    return " ".join(parts)


def _object_fields(spec: JsonSchema, root: Mapping[str, Any], depth: int) -> str:
    props: Mapping[str, Any] = spec["properties"]
    if not props:
        return "An object."
    if depth > _MAX_DEPTH:
        return f"An object with fields {', '.join(map(str, props))}."
    required = set(spec.get("required") or [])
    fields = []
    for key, sub in props.items():
        sub_spec, sub_variants = _merged(_resolve(sub, root), root)
        kind = "|".join(_types(sub_spec, sub_variants))
        flag = ", required" if key in required else ""
        detail = _describe(sub_spec, sub_variants, root, depth, str(key)).rstrip(".")
        enum = sub_spec.get("enum")
        if isinstance(enum, list) and enum:
            detail = (detail + " " if detail else "") + f"(one of {_short(enum)})"
        fields.append(f"{key} ({kind}{flag})" + (f": {detail}" if detail else ""))
    return "An object with fields: " + "; ".join(fields) + "."


def _summary(spec: JsonSchema, root: Mapping[str, Any], depth: int) -> str:
    spec, variants = _merged(spec, root)
    if isinstance(spec.get("properties"), Mapping) and not variants:
        return _object_fields(spec, root, depth)
    kind = "|".join(_types(spec, variants))
    detail = _describe(spec, variants, root, depth)
    return f"{kind}" + (f" ({detail})" if detail else "")


def _scalar_enum(values: Any) -> bool:
    return (
        isinstance(values, list)
        and bool(values)
        and all(isinstance(v, (str, int, float, bool)) for v in values)
    )


def _squash(text: str) -> str:
    return "".join(c for c in text.lower() if c.isalnum())


def _short(value: Any, limit: int = 80) -> str:
    text = json.dumps(value, default=str)
    return text if len(text) <= limit else text[: limit - 1] + "…"
