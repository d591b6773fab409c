"""Bounds a JSON schema gets where it gives none, so that a constrained answer ends.

A grammar with no bound on a number's digits, a string's length, an array's items or a recursion's depth lets a
model keep going forever: small models do (a 270M model under `{"type": "integer"}` writes 1000000000... until
max_tokens; under `{"type": "string"}` it repeats a sentence; under a recursive `$ref` it nests without end). Every
token of such an answer is valid, yet the answer never is: it is cut at max_tokens, unfinished. vLLM, llama.cpp and
OpenAI leave the schema as it is; ridgeline adds bounds to the schema before compiling it, only where the schema
sets none, so a schema's own bounds always win and every answer still validates against the schema as sent:

    integer / number    |value| < 10**15 (an absent minimum or maximum; exclusive ones count as given)
    number              at most 6 decimals (as multipleOf 1e-6; none where a multipleOf is given), no exponent
    string              maxLength 256 (also with a pattern or a format); format date and date-time as patterns
                        of real dates (below)
    array               maxItems 16
    object with listed  no keys beyond them where additionalProperties is absent (xgrammar's reading, so vLLM's
    properties          default: a key the schema does not name is open-ended text a model can loop in)
    map (no listed      keys of 1-64 characters (as patternProperties: llguidance has no propertyNames), at most 16
    properties)         of them; values as additionalProperties says, or any JSON value where it says nothing
    any JSON value      ({} , json_object's values): null, a boolean, or a number, string, array or object bounded as
                        above, arrays and objects 2 levels deep at most
    recursive $ref      6 levels deep: a definition that refers to itself is unrolled into 6 copies, the innermost
                        with its recursive references replaced by `false` (its anyOf alternatives, optional
                        properties and empty arrays remain; a schema whose every instance must recurse deeper
                        keeps the original definition instead)

Nothing under an allOf is touched: llguidance intersects the branches, and a default in one branch would override
a looser bound the user gave in another. enum and const need none. Turn all of it off with
`GrammarCompiler.json_bounds = None` (the engine's default is DEFAULT_BOUNDS).
"""

import copy
from dataclasses import dataclass
from typing import Any

Schema = dict | bool


@dataclass(frozen=True)
class JsonBounds:
    integer_digits: int = 15
    fraction_digits: int = 6
    max_string_length: int = 256
    max_items: int = 16
    max_properties: int = 16
    recursion_depth: int = 6

    def key(self) -> str:
        return repr(self)


DEFAULT_BOUNDS = JsonBounds()
MAP_KEY_PATTERN = "^.{1,64}$"
ANY_VALUE_DEPTH = 2
# format date and date-time as patterns of real dates only: llguidance's formats take 0000-02-31, which no date
# parser does (years 0001-9999; February to the 28th, every year, rather than a leap-year rule in a regex).
_DATE = ("(?:[0-9]{3}[1-9]|[0-9]{2}[1-9][0-9]|[0-9][1-9][0-9]{2}|[1-9][0-9]{3})-"
         "(?:(?:0[13578]|1[02])-(?:0[1-9]|[12][0-9]|3[01])|(?:0[469]|11)-(?:0[1-9]|[12][0-9]|30)|02-(?:0[1-9]|1[0-9]|2[0-8]))")
_TIME = "(?:[01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](?:\\.[0-9]{1,6})?(?:Z|[+-](?:[01][0-9]|2[0-3]):[0-5][0-9])"
_DATE_PATTERNS = {"date": f"^{_DATE}$", "date-time": f"^{_DATE}T{_TIME}$"}
_ANNOTATIONS = {"title", "description", "default", "examples", "$comment", "deprecated", "readOnly", "writeOnly"}


def _any_value(bounds: JsonBounds, depth: int = ANY_VALUE_DEPTH) -> dict:
    """Any JSON value, bounded (a schema of its own rather than a $def: it may sit anywhere in the schema)."""
    limit = 10 ** bounds.integer_digits - 1
    kinds = [{"type": "null"}, {"type": "boolean"},
             {"type": "number", "minimum": -limit, "maximum": limit, "multipleOf": 10.0 ** -bounds.fraction_digits},
             {"type": "string", "maxLength": bounds.max_string_length}]
    if depth > 0:
        inner = _any_value(bounds, depth - 1)
        kinds += [{"type": "array", "items": inner, "maxItems": bounds.max_items},
                  {"type": "object", "patternProperties": {MAP_KEY_PATTERN: inner}, "additionalProperties": False,
                   "maxProperties": bounds.max_properties}]
    return {"anyOf": kinds}

_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_SCHEMA_VALUES = ("additionalProperties", "items", "additionalItems", "contains", "not", "if", "then", "else",
                  "propertyNames", "unevaluatedItems", "unevaluatedProperties")
_SCHEMA_LISTS = ("anyOf", "oneOf", "prefixItems")


def bound_schema(schema: Schema, bounds: JsonBounds) -> Schema:
    """A bounded copy of `schema` (the caller's object is never changed)."""
    if not isinstance(schema, dict):
        return schema
    schema = _unroll_recursion(copy.deepcopy(schema), bounds.recursion_depth)
    return _bound(schema, bounds, in_all_of=False)


def _bound(node: Any, bounds: JsonBounds, in_all_of: bool) -> Any:
    if not isinstance(node, dict):
        return node
    for key in _SCHEMA_MAPS:
        if isinstance(node.get(key), dict):
            node[key] = {name: _bound(value, bounds, in_all_of) for name, value in node[key].items()}
    for key in _SCHEMA_VALUES:
        if isinstance(node.get(key), dict):
            node[key] = _bound(node[key], bounds, in_all_of)
    for key in _SCHEMA_LISTS:
        if isinstance(node.get(key), list):
            node[key] = [_bound(value, bounds, in_all_of) for value in node[key]]
    if isinstance(node.get("items"), list):  # draft-4 tuples
        node["items"] = [_bound(value, bounds, in_all_of) for value in node["items"]]
    if isinstance(node.get("allOf"), list):
        node["allOf"] = [_bound(value, bounds, in_all_of=True) for value in node["allOf"]]
    if in_all_of or "enum" in node or "const" in node or "$ref" in node:
        return node
    if set(node) <= _ANNOTATIONS:  # {}: any value at all
        return {**node, **_any_value(bounds)}
    types = node.get("type")
    types = {types} if isinstance(types, str) else set(types) if isinstance(types, list) else set()
    if not types and "properties" in node:
        types = {"object"}
    if "string" in types and node.get("format") in _DATE_PATTERNS and "pattern" not in node:
        node["pattern"] = _DATE_PATTERNS[node.pop("format")]
    if "string" in types and "maxLength" not in node:
        node["maxLength"] = max(bounds.max_string_length, _int(node.get("minLength")))
    if types & {"integer", "number"}:
        limit = 10 ** bounds.integer_digits - 1
        low = node.get("minimum", node.get("exclusiveMinimum"))
        high = node.get("maximum", node.get("exclusiveMaximum"))
        if low is None and _number(high, -limit) >= -limit:
            node["minimum"] = -limit
        if high is None and _number(low, limit) <= limit:
            node["maximum"] = limit
        if "number" in types and "multipleOf" not in node:
            node["multipleOf"] = 10.0 ** -bounds.fraction_digits
    if "array" in types and "maxItems" not in node and node.get("items") is not False:
        node["maxItems"] = max(bounds.max_items, _int(node.get("minItems")))
    if "object" in types:
        if node.get("properties") or node.get("patternProperties"):
            if node.get("properties") and "additionalProperties" not in node and "patternProperties" not in node:
                node["additionalProperties"] = False
        else:
            values = node.get("additionalProperties", True)
            if values is not False:
                node["patternProperties"] = {MAP_KEY_PATTERN: _any_value(bounds) if values is True else values}
                node["additionalProperties"] = False
        if ("maxProperties" not in node and not node.get("properties")
                and (node.get("patternProperties") or node.get("additionalProperties", True) is not False)):
            node["maxProperties"] = max(bounds.max_properties, _int(node.get("minProperties")))
    return node


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _number(value: Any, default: float) -> float:
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else default


# ---- recursion ------------------------------------------------------------------------------------------------------
def _local_refs(node: Any) -> set[str]:
    """The definitions (as "$defs/name" or "definitions/name") that `node` refers to, anywhere inside it."""
    found = set()
    if isinstance(node, dict):
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith("#/"):
            found.add(ref[2:])
        for value in node.values():
            found |= _local_refs(value)
    elif isinstance(node, list):
        for value in node:
            found |= _local_refs(value)
    return found


def _unroll_recursion(schema: dict, depth: int) -> dict:
    """Definitions that reach themselves through $refs unrolled `depth` levels deep (see the module's docstring).
    Only refs of the form #/$defs/name and #/definitions/name are followed; anything else is left as it is."""
    definitions = {f"{section}/{name}": value for section in ("$defs", "definitions")
                   if isinstance(schema.get(section), dict) for name, value in schema[section].items()}
    if not definitions or depth < 1:
        return schema
    edges = {name: _local_refs(value) & definitions.keys() for name, value in definitions.items()}

    def reaches(start: str) -> set[str]:
        seen, stack = set(), list(edges[start])
        while stack:
            name = stack.pop()
            if name not in seen:
                seen.add(name)
                stack.extend(edges[name])
        return seen

    recursive = {name for name in definitions if name in reaches(name)}
    if not recursive:
        return schema
    # Level k of every recursive definition refers to level k+1 of the recursive ones; the deepest level refers to
    # none (its recursive refs become `false`). The root and the non-recursive definitions refer to level 1.
    copies: dict[str, Any] = {}

    def level_name(name: str, level: int) -> str:
        return f"{name.replace('/', '__')}__level{level}"

    def rewrite(node: Any, level: int) -> Any:
        if isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str) and ref.startswith("#/") and ref[2:] in recursive:
                if level > depth:
                    return False
                rest = {key: rewrite(value, level) for key, value in node.items() if key != "$ref"}
                return {"$ref": f"#/$defs/{level_name(ref[2:], level)}", **rest}
            return {key: rewrite(value, level) for key, value in node.items()}
        if isinstance(node, list):
            return [rewrite(value, level) for value in node]
        return node

    for name in recursive:
        for level in range(1, depth + 1):
            copies[level_name(name, level)] = rewrite(definitions[name], level + 1)
    unrolled = rewrite({key: value for key, value in schema.items() if key not in ("$defs", "definitions")}, 1)
    for section in ("$defs", "definitions"):
        if isinstance(schema.get(section), dict):
            kept = {name: rewrite(value, 1) for name, value in schema[section].items() if f"{section}/{name}" not in recursive}
            if section == "$defs":
                kept.update(copies)
            if kept:
                unrolled[section] = kept
    if "$defs" not in unrolled:
        unrolled["$defs"] = copies
    return unrolled
