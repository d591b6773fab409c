"""A tenant's priority class, on the engine's scale (vLLM's: a lower value is admitted first, 0 the default).

The class is a ceiling: a request may ask to go later than its tenant's class (a batch job inside an
interactive tenant), never earlier, so a key cannot buy its way ahead by writing `priority: -100`."""

PRIORITY_CLASSES = {"interactive": -10, "standard": 0, "batch": 10}


def priority_value(value: object, where: str) -> int:
    """A class name or an integer from the tenants file."""
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise ValueError(f"{where}: priority must be one of {', '.join(PRIORITY_CLASSES)} or an integer")
    if isinstance(value, int):
        return value
    if value not in PRIORITY_CLASSES:
        raise ValueError(f"{where}: unknown priority class {value!r} (choose from {', '.join(PRIORITY_CLASSES)})")
    return PRIORITY_CLASSES[value]


def effective_priority(tenant_priority: int, requested: int | None) -> int:
    """`requested`: the request's own `priority` if it set one (None: it did not)."""
    return tenant_priority if requested is None else max(tenant_priority, requested)
