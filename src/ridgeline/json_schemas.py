"""JSON schemas read strictly, by the structured-outputs compiler and the tool-call grammar alike (a leaf module:
neither imports the other): an object schema that lists its properties and says nothing of others takes no
("additionalProperties": false added where it is absent).

JSON Schema itself allows unlisted properties by default, and a small model given that freedom fills it: asked for
`{"city": ...}` it copies the schema it was shown into the arguments (`{"city": "Paris", "type": "object",
"properties": ...}`) until max_tokens. xgrammar's strict mode, which vLLM uses by default, and llama.cpp's schema
converter close objects the same way, so a schema means here what it means there. A schema that states
`additionalProperties` (or `patternProperties`/`unevaluatedProperties`) keeps what it states; members of an
`allOf` are left open, since closing each would forbid the others' properties.
"""

from typing import Any

_OPEN_KEYWORDS = ("additionalProperties", "patternProperties", "unevaluatedProperties", "allOf")
_SCHEMA_LISTS = ("anyOf", "oneOf", "prefixItems")
_SCHEMA_MAPS = ("properties", "$defs", "definitions", "dependentSchemas")
_SCHEMA_VALUES = ("items", "additionalProperties", "contains", "not", "if", "then", "else")


def closed_objects(schema: Any) -> Any:
    """A copy of `schema` with its objects closed; anything that is not a schema object is returned as it is."""
    if not isinstance(schema, dict):
        return schema
    closed = dict(schema)
    for key in _SCHEMA_MAPS:
        if isinstance(schema.get(key), dict):
            closed[key] = {name: closed_objects(sub) for name, sub in schema[key].items()}
    for key in _SCHEMA_LISTS:
        if isinstance(schema.get(key), list):
            closed[key] = [closed_objects(sub) for sub in schema[key]]
    for key in _SCHEMA_VALUES:
        if isinstance(schema.get(key), dict):
            closed[key] = closed_objects(schema[key])
    if isinstance(schema.get("properties"), dict) and not any(k in schema for k in _OPEN_KEYWORDS):
        closed["additionalProperties"] = False
    return closed


# What one schema may hold: OpenAI's own limit on properties (5,000 in all), and a depth of JSON nesting (an
# object nested in an object is two: its "properties" map, then itself) far beyond any real schema's but well
# inside what Python's recursion (json.dumps, the cache key) survives.
MAX_PROPERTIES = 5000
MAX_DEPTH = 256


def schema_too_large(schema: Any) -> str | None:
    """Why `schema` is beyond those limits, or None. Walked with a stack, not recursion, so any depth is safe."""
    properties, stack = 0, [(schema, 1)]
    while stack:
        value, depth = stack.pop()
        if depth > MAX_DEPTH:
            return f"its JSON nests deeper than {MAX_DEPTH} levels"
        if isinstance(value, dict):
            if isinstance(value.get("properties"), dict):
                properties += len(value["properties"])
                if properties > MAX_PROPERTIES:
                    return f"it has more than {MAX_PROPERTIES} properties in all"
            stack.extend((child, depth + 1) for child in value.values())
        elif isinstance(value, list):
            stack.extend((child, depth + 1) for child in value)
    return None
