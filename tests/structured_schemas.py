"""A corpus of JSON schemas of the shapes people send as structured outputs (OpenAI function parameters, pydantic
models, extraction forms), and of schemas llguidance refuses, each with the keyword a refusal must name.

Used by tests/test_structured_outputs_engine.py, tests/test_structured_validity.py (a subset, in CI) and
benchmarks/structured_outputs.py (all of it, on the default model). Every schema here is written for this corpus.
Each case has a prompt: what a user would ask for with that schema, so the model's answer is the kind it would
really give.
"""

from dataclasses import dataclass, field


@dataclass(frozen=True)
class SchemaCase:
    name: str
    schema: dict
    prompt: str
    # Features the case exercises (documentation; the validity report groups by them).
    features: tuple[str, ...] = field(default=())


def _obj(properties: dict, required: list[str] | None = None, additional: bool | None = False, **extra) -> dict:
    schema = {"type": "object", "properties": properties, "required": list(properties) if required is None else required}
    if additional is not None:
        schema["additionalProperties"] = additional
    schema.update(extra)
    return schema


STR, INT, NUM, BOOL = {"type": "string"}, {"type": "integer"}, {"type": "number"}, {"type": "boolean"}

SCHEMAS: list[SchemaCase] = [
    # --- OpenAI function parameters ------------------------------------------------------------------------------
    SchemaCase("get_weather", _obj({"location": {"type": "string", "description": "City and country, e.g. Paris, France"},
                                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}, ["location"]),
               "What's the weather like in Paris? Call get_weather.", ("function", "enum", "required subset")),
    SchemaCase("search_web", _obj({"query": STR, "max_results": {"type": "integer", "minimum": 1, "maximum": 20}}, ["query"]),
               "Search the web for the tallest building in Europe.", ("function", "integer bounds")),
    SchemaCase("send_email", _obj({"to": {"type": "string", "format": "email"}, "subject": {"type": "string", "maxLength": 80},
                                   "body": STR, "cc": {"type": "array", "items": {"type": "string", "format": "email"},
                                                       "maxItems": 3}}, ["to", "subject", "body"]),
               "Email alice@example.com that the meeting moved to 3pm.", ("function", "format email", "maxLength", "maxItems")),
    SchemaCase("create_event", _obj({"title": STR, "date": {"type": "string", "format": "date"},
                                     "start_time": {"type": "string", "pattern": "^([01][0-9]|2[0-3]):[0-5][0-9]$"},
                                     "duration_minutes": {"type": "integer", "minimum": 5, "maximum": 480},
                                     "attendees": {"type": "array", "items": STR, "maxItems": 5}},
                                    ["title", "date", "start_time"]),
               "Schedule a team lunch next Friday at noon for an hour.", ("function", "format date", "pattern")),
    SchemaCase("run_sql", _obj({"sql": {"type": "string", "maxLength": 300}, "read_only": BOOL}),
               "Count the users who signed up in 2024, as a SQL query.", ("function", "boolean")),
    SchemaCase("get_stock_price", _obj({"ticker": {"type": "string", "pattern": "^[A-Z]{1,5}$"},
                                        "exchange": {"type": "string", "enum": ["NYSE", "NASDAQ", "LSE"]}}, ["ticker"]),
               "What is Apple's stock price?", ("function", "pattern", "enum")),
    SchemaCase("set_thermostat", _obj({"temperature": {"type": "number", "minimum": 10, "maximum": 30},
                                       "mode": {"type": "string", "enum": ["heat", "cool", "auto", "off"]}}),
               "Set the heating to 21.5 degrees.", ("function", "number bounds")),
    SchemaCase("translate", _obj({"text": {"type": "string", "maxLength": 200},
                                  "target_language": {"type": "string", "pattern": "^[a-z]{2}$"}}),
               "Translate 'good morning' into German.", ("function", "pattern")),
    SchemaCase("no_arguments", _obj({}), "Call the function that lists all open tickets.", ("function", "empty object")),
    SchemaCase("book_flight", _obj({"origin": {"type": "string", "pattern": "^[A-Z]{3}$"},
                                    "destination": {"type": "string", "pattern": "^[A-Z]{3}$"},
                                    "departure": {"type": "string", "format": "date"},
                                    "passengers": {"type": "integer", "minimum": 1, "maximum": 9},
                                    "cabin": {"type": "string", "enum": ["economy", "premium", "business", "first"]}},
                                   ["origin", "destination", "departure"]),
               "Book a flight from London Heathrow to New York JFK on 2025-03-14 for two.", ("function", "pattern", "format date")),

    # --- extraction and typed answers ----------------------------------------------------------------------------
    SchemaCase("person", _obj({"name": STR, "age": INT}), "Describe a person with a name and an age.", ("unbounded integer",)),
    SchemaCase("person_bounded", _obj({"name": {"type": "string", "maxLength": 40},
                                       "age": {"type": "integer", "minimum": 0, "maximum": 130}}),
               "Describe a person with a name and an age.", ("integer bounds", "maxLength")),
    SchemaCase("sentiment", _obj({"sentiment": {"type": "string", "enum": ["positive", "negative", "neutral"]},
                                  "confidence": {"type": "number", "minimum": 0, "maximum": 1}}),
               "Classify the sentiment of: 'I loved this film, the ending was perfect.'", ("enum", "number bounds")),
    SchemaCase("entities", _obj({"entities": {"type": "array", "items": _obj({
        "text": STR, "type": {"type": "string", "enum": ["PERSON", "ORG", "LOCATION", "DATE"]}}), "maxItems": 6}}),
               "Extract the entities from: 'Marie Curie moved to Paris in 1891 to study at the Sorbonne.'",
               ("array of objects", "enum")),
    SchemaCase("recipe", _obj({"title": STR, "servings": {"type": "integer", "minimum": 1, "maximum": 12},
                               "ingredients": {"type": "array", "items": _obj({"item": STR, "quantity": STR}),
                                               "minItems": 1, "maxItems": 8},
                               "steps": {"type": "array", "items": STR, "minItems": 1, "maxItems": 6}}),
               "Give me a recipe for pancakes.", ("nested", "minItems", "maxItems")),
    SchemaCase("address", _obj({"street": STR, "city": STR, "postal_code": {"type": "string", "pattern": "^[0-9]{5}$"},
                                "country": {"type": "string", "enum": ["US", "DE", "FR"]}}),
               "Write the address of a bakery in Berlin.", ("pattern", "enum")),
    SchemaCase("invoice", _obj({"invoice_number": {"type": "string", "pattern": "^INV-[0-9]{4}$"},
                                "issued": {"type": "string", "format": "date"},
                                "lines": {"type": "array", "minItems": 1, "maxItems": 4, "items": _obj({
                                    "description": STR, "quantity": {"type": "integer", "minimum": 1, "maximum": 100},
                                    "unit_price": {"type": "number", "minimum": 0, "maximum": 10000}})},
                                "total": NUM}),
               "Write an invoice for three hours of consulting at 120 dollars an hour.",
               ("nested", "pattern", "unbounded number")),
    SchemaCase("product", _obj({"id": {"type": "string", "format": "uuid"}, "name": STR,
                                "price": {"type": "number", "exclusiveMinimum": 0},
                                "tags": {"type": "array", "items": STR, "maxItems": 4},
                                "in_stock": BOOL}, ["id", "name", "price"]),
               "Describe a product in an online shop.", ("format uuid", "exclusiveMinimum", "required subset")),
    SchemaCase("user_profile", _obj({"username": {"type": "string", "pattern": "^[a-z][a-z0-9_]{2,15}$"},
                                     "email": {"type": "string", "format": "email"},
                                     "birthday": {"type": "string", "format": "date"},
                                     "bio": {"type": ["string", "null"], "maxLength": 120}}),
               "Create a user profile for a new member.", ("format email", "format date", "nullable")),
    SchemaCase("meeting_summary", _obj({"summary": {"type": "string", "maxLength": 200},
                                        "decisions": {"type": "array", "items": STR, "maxItems": 3},
                                        "action_items": {"type": "array", "maxItems": 3, "items": _obj({
                                            "owner": STR, "task": STR, "due": {"type": "string", "format": "date"}})}}),
               "Summarise a meeting where the team agreed to ship on Monday.", ("nested", "format date")),
    SchemaCase("classification", _obj({"label": {"type": "string", "enum": ["bug", "feature", "question", "docs"]},
                                       "priority": {"type": "integer", "enum": [1, 2, 3]}}),
               "Label this issue: 'The app crashes when I click save.'", ("enum", "integer enum")),
    SchemaCase("coordinates", _obj({"latitude": {"type": "number", "minimum": -90, "maximum": 90},
                                    "longitude": {"type": "number", "minimum": -180, "maximum": 180}}),
               "Where is the Eiffel Tower?", ("number bounds",)),
    SchemaCase("scores", _obj({"scores": {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 100},
                                          "minItems": 3, "maxItems": 3}}),
               "Give three exam scores.", ("minItems", "maxItems", "integer bounds")),
    SchemaCase("measurement", _obj({"value": NUM, "unit": {"type": "string", "enum": ["m", "kg", "s"]}}),
               "How tall is an average door, in metres?", ("unbounded number",)),
    SchemaCase("pi_digits", _obj({"pi": NUM}), "Write the number pi with many digits.", ("unbounded number",)),
    SchemaCase("big_count", _obj({"count": INT}), "How many stars are in the Milky Way?", ("unbounded integer",)),
    SchemaCase("free_text", _obj({"answer": STR}), "Explain photosynthesis.", ("unbounded string",)),
    SchemaCase("story", _obj({"title": STR, "story": STR}), "Tell me a long story about a dragon.", ("unbounded string",)),
    SchemaCase("yes_no", _obj({"answer": BOOL, "reason": {"type": "string", "maxLength": 100}}),
               "Is the earth round?", ("boolean",)),
    SchemaCase("const_version", _obj({"version": {"const": "1.0"}, "status": {"type": "string", "enum": ["ok", "error"]}}),
               "Report the service status.", ("const",)),
    SchemaCase("const_type_tag", _obj({"type": {"const": "circle"}, "radius": {"type": "number", "minimum": 0, "maximum": 100}}),
               "Describe a circle.", ("const", "number bounds")),

    # --- unions, nullables, optional fields -----------------------------------------------------------------------
    SchemaCase("nullable_fields", _obj({"name": STR, "nickname": {"type": ["string", "null"], "maxLength": 30},
                                        "age": {"anyOf": [{"type": "integer", "minimum": 0, "maximum": 150},
                                                          {"type": "null"}]}}),
               "Describe someone whose age you don't know.", ("nullable", "anyOf")),
    SchemaCase("shape_anyof", _obj({"shape": {"anyOf": [
        _obj({"kind": {"const": "circle"}, "radius": {"type": "number", "minimum": 0, "maximum": 100}}),
        _obj({"kind": {"const": "rect"}, "width": {"type": "integer", "minimum": 0, "maximum": 100},
              "height": {"type": "integer", "minimum": 0, "maximum": 100}})]}}),
               "Describe a shape.", ("anyOf", "const")),
    SchemaCase("payment_oneof", _obj({"payment": {"oneOf": [
        _obj({"method": {"const": "card"}, "last4": {"type": "string", "pattern": "^[0-9]{4}$"}}),
        _obj({"method": {"const": "iban"}, "iban": {"type": "string", "pattern": "^[A-Z]{2}[0-9]{2}[A-Z0-9]{10,20}$"}})]}}),
               "How did the customer pay?", ("oneOf", "pattern")),
    SchemaCase("string_or_list", _obj({"value": {"oneOf": [{"type": "string", "maxLength": 30},
                                                           {"type": "array", "items": {"type": "string", "maxLength": 20},
                                                            "maxItems": 4}]}}),
               "Give one or more colours.", ("oneOf",)),
    SchemaCase("optional_fields", _obj({"title": STR, "subtitle": {"type": "string", "maxLength": 50},
                                        "year": {"type": "integer", "minimum": 1900, "maximum": 2100},
                                        "rating": {"type": "number", "minimum": 0, "maximum": 5}}, ["title"]),
               "Describe a film.", ("required subset", "number bounds")),
    SchemaCase("allof_merge", {"allOf": [_obj({"id": {"type": "integer", "minimum": 1, "maximum": 9999}}, additional=None),
                                         {"type": "object", "properties": {"label": {"type": "string", "maxLength": 20}},
                                          "required": ["label"]}]},
               "Give an item with an id and a label.", ("allOf",)),
    SchemaCase("top_level_array", {"type": "array", "items": _obj({"name": {"type": "string", "maxLength": 30},
                                                                   "done": BOOL}), "minItems": 1, "maxItems": 4},
               "List three tasks for today.", ("top-level array",)),
    SchemaCase("top_level_enum", {"type": "string", "enum": ["red", "green", "blue"]},
               "What colour is the sky?", ("top-level enum",)),
    SchemaCase("top_level_integer", {"type": "integer", "minimum": 0, "maximum": 1000}, "How many days in a year?",
               ("top-level integer",)),
    SchemaCase("additional_properties_typed", {"type": "object", "additionalProperties": {"type": "integer", "minimum": 0,
                                                                                          "maximum": 1000},
                                               "maxProperties": 4},
               "Count the fruit in a basket, by kind.", ("additionalProperties schema", "maxProperties")),
    SchemaCase("pattern_properties", {"type": "object", "patternProperties": {"^x-[a-z]+$": {"type": "string", "maxLength": 20}},
                                      "additionalProperties": False, "maxProperties": 3},
               "Give some HTTP extension headers.", ("patternProperties",)),
    SchemaCase("prefix_items", _obj({"point": {"type": "array", "prefixItems": [
        {"type": "number", "minimum": -100, "maximum": 100}, {"type": "number", "minimum": -100, "maximum": 100}],
        "items": False}}),
               "Give a point in the plane.", ("prefixItems",)),

    # --- $ref / $defs, recursion ------------------------------------------------------------------------------------
    SchemaCase("defs_ref", {"$defs": {"money": _obj({"amount": {"type": "number", "minimum": 0, "maximum": 1e6},
                                                     "currency": {"type": "string", "enum": ["USD", "EUR"]}})},
                            **_obj({"price": {"$ref": "#/$defs/money"}, "discount": {"$ref": "#/$defs/money"}})},
               "Give a price and a discount.", ("$ref",)),
    SchemaCase("definitions_ref", {"definitions": {"tag": {"type": "string", "pattern": "^#[a-z]{1,10}$"}},
                                   **_obj({"tags": {"type": "array", "items": {"$ref": "#/definitions/tag"},
                                                    "maxItems": 3}})},
               "Give hashtags for a beach photo.", ("$ref", "definitions")),
    SchemaCase("pydantic_nested", {"$defs": {
        "Address": {"title": "Address", "type": "object", "properties": {"city": {"title": "City", "type": "string"},
                                                                         "zip": {"title": "Zip", "type": "string",
                                                                                 "pattern": "^[0-9]{5}$"}},
                    "required": ["city", "zip"], "additionalProperties": False},
        "Role": {"title": "Role", "enum": ["admin", "user", "guest"], "type": "string"}},
        "title": "Employee", "type": "object",
        "properties": {"name": {"title": "Name", "type": "string"}, "role": {"$ref": "#/$defs/Role"},
                       "address": {"$ref": "#/$defs/Address"},
                       "manager": {"anyOf": [{"type": "string"}, {"type": "null"}], "default": None, "title": "Manager"}},
        "required": ["name", "role", "address", "manager"], "additionalProperties": False},
               "Describe an employee.", ("$ref", "pydantic", "nullable")),
    SchemaCase("tree_recursive", {"$defs": {"node": _obj({"name": {"type": "string", "maxLength": 20},
                                                          "children": {"type": "array", "items": {"$ref": "#/$defs/node"},
                                                                       "maxItems": 3}})},
                                  "$ref": "#/$defs/node"},
               "Describe a small family tree.", ("recursive $ref",)),
    SchemaCase("linked_list", {"$defs": {"item": _obj({"value": {"type": "integer", "minimum": 0, "maximum": 99},
                                                       "next": {"anyOf": [{"$ref": "#/$defs/item"}, {"type": "null"}]}})},
                               "$ref": "#/$defs/item"},
               "Write a linked list of three numbers.", ("recursive $ref", "nullable")),
    SchemaCase("comment_thread", {"$defs": {"comment": _obj({"author": STR, "text": STR,
                                                             "replies": {"type": "array", "items": {"$ref": "#/$defs/comment"}}})},
                                  "$ref": "#/$defs/comment"},
               "Write a comment thread with replies.", ("recursive $ref", "unbounded string", "unbounded array")),
    SchemaCase("expression_tree", {"$defs": {"expr": {"anyOf": [
        {"type": "integer", "minimum": 0, "maximum": 9},
        _obj({"op": {"type": "string", "enum": ["+", "-", "*"]}, "left": {"$ref": "#/$defs/expr"},
              "right": {"$ref": "#/$defs/expr"}})]}}, "$ref": "#/$defs/expr"},
               "Write (1 + 2) * 3 as an expression tree.", ("recursive $ref", "anyOf")),
    SchemaCase("menu_recursive", {"$defs": {"entry": _obj({"label": STR, "submenu": {"type": "array",
                                                                                     "items": {"$ref": "#/$defs/entry"}}},
                                                          ["label"])},
                                  "type": "array", "items": {"$ref": "#/$defs/entry"}},
               "Write the menu of a text editor.", ("recursive $ref", "unbounded array")),

    # --- formats and patterns -------------------------------------------------------------------------------------
    SchemaCase("formats", _obj({"id": {"type": "string", "format": "uuid"}, "created": {"type": "string", "format": "date-time"},
                                "contact": {"type": "string", "format": "email"}, "day": {"type": "string", "format": "date"}}),
               "Write a record with an id, a timestamp, an email and a date.", ("format uuid", "format date-time")),
    SchemaCase("format_time_ipv4", _obj({"server": {"type": "string", "format": "ipv4"},
                                         "at": {"type": "string", "format": "time"}}),
               "Which server rebooted, and when?", ("format ipv4", "format time")),
    SchemaCase("phone_pattern", _obj({"phone": {"type": "string", "pattern": "^\\+[1-9][0-9]{7,12}$"}}),
               "What is the phone number of the office?", ("pattern",)),
    SchemaCase("hex_colour", _obj({"colour": {"type": "string", "pattern": "^#[0-9a-fA-F]{6}$"}}),
               "What colour is a ripe tomato, as hex?", ("pattern",)),
    SchemaCase("semver", _obj({"version": {"type": "string", "pattern": "^[0-9]+\\.[0-9]+\\.[0-9]+$"}}),
               "What version of Python is current?", ("pattern with +",)),
    SchemaCase("string_lengths", _obj({"code": {"type": "string", "minLength": 4, "maxLength": 4},
                                       "note": {"type": "string", "minLength": 1, "maxLength": 60}}),
               "Give a four-character code and a note.", ("minLength", "maxLength")),

    # --- numbers ----------------------------------------------------------------------------------------------------
    SchemaCase("number_exclusive", _obj({"ratio": {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1}}),
               "What fraction of the earth is covered by water?", ("exclusive bounds",)),
    SchemaCase("integer_multiple", _obj({"minutes": {"type": "integer", "multipleOf": 15, "minimum": 0, "maximum": 240}}),
               "How long is a typical meeting, in minutes?", ("multipleOf",)),
    SchemaCase("negative_numbers", _obj({"temperature": {"type": "integer", "minimum": -90, "maximum": 60},
                                         "depth": {"type": "number", "maximum": 0, "minimum": -11000}}),
               "Give the coldest temperature and the deepest point of the ocean.", ("negative bounds",)),
    SchemaCase("money_multiple", _obj({"price": {"type": "number", "multipleOf": 0.01, "minimum": 0, "maximum": 1000}}),
               "What does a coffee cost?", ("multipleOf decimal",)),

    # --- bigger objects -----------------------------------------------------------------------------------------------
    SchemaCase("config_file", _obj({"server": _obj({"host": {"type": "string", "format": "hostname"},
                                                    "port": {"type": "integer", "minimum": 1, "maximum": 65535},
                                                    "tls": BOOL}),
                                    "logging": _obj({"level": {"type": "string", "enum": ["debug", "info", "warning", "error"]},
                                                     "file": {"type": ["string", "null"], "maxLength": 60}}),
                                    "workers": {"type": "integer", "minimum": 1, "maximum": 64}}),
               "Write the configuration of a web server.", ("nested", "format hostname")),
    SchemaCase("wide_object", _obj({f"field_{i}": {"type": "integer", "minimum": 0, "maximum": 9} for i in range(12)}),
               "Fill in twelve digit fields.", ("12 properties",)),
    SchemaCase("deep_nesting", _obj({"a": _obj({"b": _obj({"c": _obj({"d": _obj({"e": {"type": "string", "maxLength": 10}})})})})}),
               "Fill in a deeply nested record.", ("5 levels",)),
    SchemaCase("matrix", _obj({"rows": {"type": "array", "minItems": 2, "maxItems": 2, "items": {
        "type": "array", "minItems": 2, "maxItems": 2, "items": {"type": "integer", "minimum": -9, "maximum": 9}}}}),
               "Write a 2x2 matrix.", ("nested arrays",)),
    SchemaCase("unbounded_list", _obj({"items": {"type": "array", "items": STR}}), "List every country in the world.",
               ("unbounded array", "unbounded string")),
    SchemaCase("numbers_list", _obj({"values": {"type": "array", "items": NUM}}), "List the first prime numbers.",
               ("unbounded array", "unbounded number")),
]


@dataclass(frozen=True)
class UnsupportedCase:
    name: str
    schema: dict
    keyword: str  # what the 400 must name


UNSUPPORTED: list[UnsupportedCase] = [
    UnsupportedCase("if_then_else", {"type": "object", "properties": {"kind": STR},
                                     "if": {"properties": {"kind": {"const": "a"}}}, "then": {"required": ["x"]},
                                     "else": {"required": ["y"]}}, "if"),
    UnsupportedCase("not", {"type": "object", "properties": {"x": {"not": {"type": "string"}}}}, "not"),
    UnsupportedCase("dependent_required", {"type": "object", "properties": {"card": STR, "billing": STR},
                                           "dependentRequired": {"card": ["billing"]}}, "dependentRequired"),
    UnsupportedCase("dependent_schemas", {"type": "object", "properties": {"card": STR},
                                          "dependentSchemas": {"card": {"required": ["billing"]}}}, "dependentSchemas"),
    UnsupportedCase("contains", {"type": "array", "items": INT, "contains": {"const": 3}}, "contains"),
    UnsupportedCase("min_contains", {"type": "array", "contains": INT, "minContains": 2}, "contains"),
    UnsupportedCase("unique_items", {"type": "array", "items": STR, "uniqueItems": True}, "uniqueItems"),
    UnsupportedCase("unevaluated_properties", {"type": "object", "properties": {"a": STR},
                                               "unevaluatedProperties": False}, "unevaluatedProperties"),
    UnsupportedCase("unevaluated_items", {"type": "array", "prefixItems": [STR], "unevaluatedItems": False},
                    "unevaluatedItems"),
    UnsupportedCase("property_names", {"type": "object", "propertyNames": {"pattern": "^[a-z]+$"}}, "propertyNames"),
    UnsupportedCase("dynamic_ref", {"$dynamicAnchor": "node", "type": "object",
                                    "properties": {"next": {"$dynamicRef": "#node"}}}, "$dynamic"),
    UnsupportedCase("remote_ref", {"type": "object", "properties": {"a": {"$ref": "https://example.com/schemas/a.json"}}},
                    "$ref"),
    UnsupportedCase("lookahead_pattern", {"type": "string", "pattern": "^(?=.*[0-9])[a-z0-9]{8}$"}, "look-around"),
    UnsupportedCase("lookbehind_pattern", {"type": "string", "pattern": "(?<!x)y"}, "look-around"),
    UnsupportedCase("backreference_pattern", {"type": "string", "pattern": "^(a)\\1$"}, "backreference"),
    UnsupportedCase("min_properties_optional", {"type": "object", "properties": {"a": STR, "b": STR}, "minProperties": 1},
                    "min/maxProperties"),
    UnsupportedCase("overlapping_one_of", {"oneOf": [INT, NUM]}, "oneOf"),
]

# The CI subset of SCHEMAS (tests/test_structured_validity.py): one of each kind of shape, the loop-prone ones
# (unbounded numbers, strings, arrays, recursion) included.
CI_SUBSET = ["get_weather", "send_email", "recipe", "person", "invoice", "nullable_fields", "payment_oneof",
             "pydantic_nested", "tree_recursive", "comment_thread", "formats", "pi_digits", "free_text", "numbers_list"]


def case(name: str) -> SchemaCase:
    return next(c for c in SCHEMAS if c.name == name)


# ---- running the corpus -------------------------------------------------------------------------------------------
@dataclass
class Answer:
    case: str
    temperature: float
    text: str
    finish_reason: str | None
    num_tokens: int
    valid: bool | None  # None: not finished (no complete JSON to check)
    problem: str = ""  # why it is invalid


def chat_prompt(tokenizer, case: SchemaCase) -> str:
    return tokenizer.apply_chat_template([{"role": "user", "content": case.prompt + " Reply in JSON."}])


def run_corpus(llm, cases: list[SchemaCase], temperatures=(0.0, 1.0), max_tokens: int = 96, seed: int = 0) -> list[Answer]:
    """Every case at every temperature (seeded), all in one batched generate; each finished answer checked against
    its schema with the jsonschema package (formats checked too: date, email, uuid, ...)."""
    import json

    import jsonschema

    from ridgeline.engine.sampling_params import SamplingParams
    from ridgeline.engine.structured import StructuredOutputsParams

    jobs = [(c, t) for t in temperatures for c in cases]
    params = [SamplingParams(temperature=t, seed=seed, max_tokens=max_tokens,
                             structured_outputs=StructuredOutputsParams(json=c.schema)) for c, t in jobs]
    outputs = llm.generate([chat_prompt(llm.tokenizer, c) for c, _ in jobs], params, use_tqdm=False)
    answers = []
    for (c, t), out in zip(jobs, outputs):
        valid, problem = None, ""
        if out.finish_reason == "stop":
            try:
                value = json.loads(out.text)
                validator = jsonschema.Draft202012Validator(c.schema, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER)
                errors = list(validator.iter_errors(value))
                valid, problem = not errors, "; ".join(e.message for e in errors[:3])
            except json.JSONDecodeError as error:
                valid, problem = False, f"not JSON: {error}"
        answers.append(Answer(c.name, t, out.text, out.finish_reason, len(out.output_token_ids), valid, problem))
    return answers
