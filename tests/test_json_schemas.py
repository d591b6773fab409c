"""json_schemas/: schemas read strictly (objects closed unless they say otherwise) and bounded in size."""

import pytest

from ridgeline.engine.structured import StructuredOutputsParams
from ridgeline.errors import InvalidParameterError
from ridgeline.json_schemas import DEFAULT_BOUNDS, MAX_DEPTH, MAX_PROPERTIES, bound_schema, schema_too_large


def closed_objects(schema):
    return bound_schema(schema, DEFAULT_BOUNDS)


def test_objects_that_list_properties_are_closed_everywhere_they_occur():
    schema = {"type": "object", "properties": {"a": {"type": "object", "properties": {"b": {}}},
                                               "c": {"type": "array", "items": {"properties": {"d": {}}}}},
              "$defs": {"e": {"properties": {}}}, "anyOf": [{"properties": {"f": {}}}]}
    closed = closed_objects(schema)
    assert closed["additionalProperties"] is False
    assert closed["properties"]["a"]["additionalProperties"] is False
    assert closed["properties"]["c"]["items"]["additionalProperties"] is False
    assert closed["$defs"]["e"]["additionalProperties"] is False
    assert closed["anyOf"][0]["additionalProperties"] is False
    assert "additionalProperties" not in schema  # a copy: the request's own schema is untouched


def test_what_a_schema_states_about_other_properties_stands():
    assert closed_objects({"properties": {"a": {}}, "additionalProperties": True})["additionalProperties"] is True
    assert "additionalProperties" not in closed_objects({"properties": {}, "patternProperties": {"^x": {}}})
    merged = closed_objects({"allOf": [{"properties": {"a": {}}}, {"properties": {"b": {}}}], "properties": {"c": {}}})
    assert "additionalProperties" not in merged["allOf"][0]  # members of an allOf stay open
    assert closed_objects({"type": "object"})["additionalProperties"] is False  # a free-form object: a bounded map
    assert closed_objects({"type": "object"})["maxProperties"] == DEFAULT_BOUNDS.max_properties


def test_size_limits_are_found_without_recursion():
    deep: dict = {"type": "string"}
    for _ in range(5000):  # far past Python's recursion limit
        deep = {"type": "object", "properties": {"a": deep}}
    assert "deeper" in schema_too_large(deep)
    assert schema_too_large({"properties": {f"p{i}": {} for i in range(MAX_PROPERTIES + 1)}}) is not None
    assert schema_too_large({"properties": {f"p{i}": {} for i in range(MAX_PROPERTIES)}}) is None
    with pytest.raises(InvalidParameterError) as refused:
        StructuredOutputsParams(json=deep, source="response_format").validate()
    assert refused.value.param == "response_format"
    assert MAX_DEPTH >= 64  # a 32-level nesting of objects (64 levels of JSON) is served
