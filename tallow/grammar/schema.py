"""JSON schemas as grammar rules: `response_format` and tool arguments.

The JSON is written in one canonical shape (`", "` and `": "` separators, no free
whitespace): the shape our models write anyway, and it keeps a small model from padding an
answer with newlines until max_tokens. Schemas are compiled strictly (`lenient: false`):
a keyword the engine cannot enforce is an error naming it, never silently dropped.
"""

from __future__ import annotations

import json
from typing import Any

from llguidance import LLMatcher

from .errors import GrammarError, engine_message
from .limits import check_schema_size

SAFE_INT = 2**53 - 1
JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": ", "lenient": False}


def json_rule(schema: dict[str, Any] | bool, param: str) -> str:
    """A Lark right-hand side (`%json {...}`) for values valid under `schema`, checked first."""
    if isinstance(schema, bool):
        schema = {} if schema else {"not": {}}
    if not isinstance(schema, dict):
        raise GrammarError(f"The JSON schema in '{param}' must be an object, not {type(schema).__name__}.", param)
    check_schema_size(schema, param)  # before any recursion, ours or the engine's
    schema = closed_objects(schema)
    schema["x-guidance"] = {**JSON_OPTIONS, **(schema.get("x-guidance") or {})}
    check_schema(schema, param)
    return "%json " + json.dumps(schema, ensure_ascii=False)


def closed_objects(schema: dict[str, Any]) -> dict[str, Any]:
    """A copy where objects that list `properties` but say nothing of extra keys take none.

    JSON Schema allows extra keys by default, and a small model, allowed them, keeps inventing
    keys until max_tokens cuts the JSON off. OpenAI's strict structured outputs close objects
    the same way; `additionalProperties: true` (or a schema) in the request keeps them open.
    Integers the schema leaves unbounded get I-JSON's safe range, ±(2^53 - 1). Every output
    stays valid under the original schema. Inside allOf nothing is changed: there each branch
    sees only its own properties, and closing would make the conjunction unsatisfiable.
    """

    def walk(node: Any, in_all_of: bool = False) -> Any:
        if isinstance(node, list):
            return [walk(x, in_all_of) for x in node]
        if not isinstance(node, dict):
            return node
        out = {}
        for key, value in node.items():
            if key in ("properties", "$defs", "definitions", "patternProperties", "dependentSchemas"):
                out[key] = {k: walk(v) for k, v in value.items()} if isinstance(value, dict) else value
            elif key == "allOf":
                out[key] = walk(value, True)
            elif key in ("items", "prefixItems", "anyOf", "oneOf", "additionalProperties", "contains", "not", "if", "then", "else"):
                out[key] = walk(value)
            else:
                out[key] = value
        if "properties" in out and "additionalProperties" not in out and "patternProperties" not in out and not in_all_of:
            out["additionalProperties"] = False
        if out.get("type") == "integer" and not in_all_of:
            # Unbounded, a small model writes "1000000…" until max_tokens (measured on gemma3):
            # bound integers to I-JSON's interoperable range (RFC 7493) unless the schema bounds them.
            if not {"maximum", "exclusiveMaximum"} & out.keys():
                out["maximum"] = SAFE_INT
            if not {"minimum", "exclusiveMinimum"} & out.keys():
                out["minimum"] = -SAFE_INT
        return out

    return walk(schema)


def check_schema(schema: dict[str, Any], param: str) -> None:
    """A GrammarError naming what the engine cannot enforce ('Unimplemented keys: ["if"]')."""
    try:
        grammar = LLMatcher.grammar_from_json_schema(schema)
    except (ValueError, TypeError) as exc:
        raise GrammarError(f"The JSON schema in '{param}' is not valid: {engine_message(exc)}.", param) from None
    error = LLMatcher.validate_grammar(grammar)
    if error:
        raise GrammarError(f"The JSON schema in '{param}' cannot be enforced by constrained decoding: {engine_message(error)}.", param)


def response_format_rule(rf: Any) -> str | None:
    """The Lark rule for OpenAI's `response_format`, or None for plain text."""
    if rf is None:
        return None
    if not isinstance(rf, dict) or not isinstance(rf.get("type"), str):
        raise GrammarError("'response_format' must be an object with a 'type'.", "response_format")
    kind = rf["type"]
    if kind == "text":
        return None
    if kind == "json_object":
        return json_rule({"type": "object"}, "response_format")
    if kind == "json_schema":
        spec = rf.get("json_schema")
        if not isinstance(spec, dict):
            raise GrammarError("'response_format' of type json_schema needs a 'json_schema' object.", "response_format.json_schema")
        schema = spec.get("schema", {})
        return json_rule(schema, "response_format.json_schema.schema")
    raise GrammarError(f"'response_format' type {kind!r} is not supported; use text, json_object or json_schema.", "response_format.type")
