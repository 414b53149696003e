"""Pydantic JSON Schema -> a structural OpenAPI v3 schema, as apiextensions.k8s.io/v1 wants.

Pydantic writes JSON Schema 2020-12: `$ref`s into `$defs`, `anyOf [X, null]` for optional
fields, titles. A CRD needs a *structural* schema: every node typed and inlined, no
`$ref`, no `anyOf` carrying types, no `additionalProperties` beside `properties`. The
conversion is strict: a keyword it does not know is an error, so a new kind of field can
not slip into the CRD in a form the API server rejects or silently ignores.

Integers get `format: int64` (Kubernetes' convention for byte counts; one rule for all).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import GenerateJsonSchema

from controller.estimator import Choice

# Keywords copied as they are (after their sub-schemas are converted).
_KEPT = {
    "type",
    "description",
    "default",
    "enum",
    "format",
    "minimum",
    "maximum",
    "minLength",
    "maxLength",
    "minItems",
    "maxItems",
    "pattern",
    "required",
    "properties",
    "items",
    "additionalProperties",
    "x-kubernetes-preserve-unknown-fields",
    "x-kubernetes-validations",
    "x-kubernetes-list-type",
    "x-kubernetes-list-map-keys",
}
_DROPPED = {"title"}


class SchemaError(ValueError):
    """A model uses a JSON Schema feature that has no structural equivalent."""


class _WireDefaults(GenerateJsonSchema):
    """Defaults as the wire spells them: pydantic encodes a default by its own type, which for
    an estimator enum member is its lower-case token, not the API spelling the field takes."""

    def encode_default(self, dft: Any) -> Any:
        return dft.api if isinstance(dft, Choice) else super().encode_default(dft)


def structural_schema(model: type[BaseModel]) -> dict[str, Any]:
    """The structural OpenAPI v3 schema of `model`'s wire form (camelCase names)."""
    raw = model.model_json_schema(by_alias=True, schema_generator=_WireDefaults)
    defs = raw.pop("$defs", {})
    return _convert(raw, defs, model.__name__)


def _convert(node: dict[str, Any], defs: dict[str, Any], where: str) -> dict[str, Any]:
    if "$ref" in node:
        name = node["$ref"].rsplit("/", 1)[-1]
        # A definition's docstring is for Python readers; the field's description is the API's.
        target = {k: v for k, v in defs[name].items() if k != "description"}
        siblings = {k: v for k, v in node.items() if k != "$ref"}
        return _convert({**target, **siblings}, defs, where)
    if "anyOf" in node:
        branches = [b for b in node["anyOf"] if b != {"type": "null"}]
        if len(branches) != 1:
            raise SchemaError(f"{where}: anyOf of several types has no structural form")
        rest = {k: v for k, v in node.items() if k != "anyOf"}
        return _convert({**branches[0], **rest}, defs, where)

    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in _DROPPED or (key == "default" and value is None):
            continue
        if key not in _KEPT:
            raise SchemaError(f"{where}: JSON Schema keyword {key!r} is not supported in a CRD")
        if key == "properties":
            out[key] = {name: _convert(sub, defs, f"{where}.{name}") for name, sub in value.items()}
        elif key == "items":
            out[key] = _convert(value, defs, f"{where}[]")
        elif key == "additionalProperties":
            if isinstance(value, dict):
                out[key] = _convert(value, defs, f"{where}{{}}")
            elif value is True and not node.get("x-kubernetes-preserve-unknown-fields"):
                raise SchemaError(
                    f"{where}: free-form objects need x-kubernetes-preserve-unknown-fields"
                )
            # `false` is the structural default (unknown fields are pruned); `true` is
            # expressed by x-kubernetes-preserve-unknown-fields instead.
        else:
            out[key] = value
    if out.get("type") == "integer":
        out.setdefault("format", "int64")
    if "type" not in out and not out.get("x-kubernetes-preserve-unknown-fields"):
        raise SchemaError(f"{where}: every node of a structural schema needs a type")
    return _ordered(out)


_ORDER = ("description", "type", "format")


def _ordered(schema: dict[str, Any]) -> dict[str, Any]:
    """Description and type first, then the rest sorted: stable, readable YAML diffs."""
    head = {k: schema[k] for k in _ORDER if k in schema}
    tail = {k: schema[k] for k in sorted(schema) if k not in head}
    return head | tail
