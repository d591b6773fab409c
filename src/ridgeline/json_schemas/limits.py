"""How large a JSON schema a request may send: bounded before anything recurses over it."""

from typing import Any


# What one schema may hold: OpenAI's own limit on properties (5,000 in all), and a depth of JSON nesting (objects
# and arrays; an object nested in an object is two: its "properties" map, then itself) beyond any real schema's:
# llguidance's parser stops at 128 levels, and a dict nested some thousands deep crashes the process on its way
# into llguidance (json.dumps raises RecursionError before that).
MAX_PROPERTIES = 5000
MAX_DEPTH = 100


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
