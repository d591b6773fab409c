"""JSON schemas as requests send them, made fit to constrain a small model: closed objects and default bounds
where a schema sets none (bounds.py), and limits on what a request may send (limits.py). A leaf package:
the structured-outputs compiler (engine/structured) and the tool-call grammar (tool_calls/) both read schemas
through it, and neither imports the other.
"""

from ridgeline.json_schemas.bounds import DEFAULT_BOUNDS, JsonBounds, bound_schema
from ridgeline.json_schemas.limits import MAX_DEPTH, MAX_PROPERTIES, schema_too_large

__all__ = ["DEFAULT_BOUNDS", "MAX_DEPTH", "MAX_PROPERTIES", "JsonBounds", "bound_schema", "schema_too_large"]
