"""What a token costs, in US dollars. Either per-token prices as a provider lists them (dollars per million
tokens), or the machine's hourly price over the tokens it serves an hour: `usd_per_hour` with the prompt and
completion rates it sustains (from `ridgeline bench serve` or `advise`), each token priced at its phase's
share of the hour. Prompt tokens found in the prefix cache may be priced lower, as providers do."""

from dataclasses import dataclass

MILLION = 1_000_000


@dataclass(frozen=True)
class Pricing:
    prompt_usd_per_mtok: float = 0.0
    completion_usd_per_mtok: float = 0.0
    cached_prompt_usd_per_mtok: float | None = None  # None: as any prompt token

    def cost(self, prompt_tokens: int, cached_tokens: int, completion_tokens: int) -> float:
        cached_price = self.prompt_usd_per_mtok if self.cached_prompt_usd_per_mtok is None else self.cached_prompt_usd_per_mtok
        return ((prompt_tokens - cached_tokens) * self.prompt_usd_per_mtok + cached_tokens * cached_price
                + completion_tokens * self.completion_usd_per_mtok) / MILLION


FREE = Pricing()
_FIELDS = {"prompt_usd_per_mtok", "completion_usd_per_mtok", "cached_prompt_usd_per_mtok", "usd_per_hour",
           "prompt_tokens_per_second", "completion_tokens_per_second"}


def pricing_from(table: dict, where: str) -> Pricing:
    """A [pricing] table: per-token prices, or usd_per_hour with the machine's prompt and completion rates."""
    unknown = set(table) - _FIELDS
    if unknown:
        raise ValueError(f"{where}: unknown field(s) {', '.join(sorted(unknown))} (known: {', '.join(sorted(_FIELDS))})")
    for name, value in table.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
            raise ValueError(f"{where}: {name} must be a number >= 0")
    if "usd_per_hour" in table:
        if "prompt_usd_per_mtok" in table or "completion_usd_per_mtok" in table:
            raise ValueError(f"{where}: give per-token prices or usd_per_hour with token rates, not both")
        rates = {name: table.get(name) for name in ("prompt_tokens_per_second", "completion_tokens_per_second")}
        missing = [name for name, rate in rates.items() if not rate]
        if missing:
            raise ValueError(f"{where}: usd_per_hour needs {' and '.join(missing)} (> 0): the tokens the machine serves")
        per_second = table["usd_per_hour"] / 3600
        return Pricing(per_second / rates["prompt_tokens_per_second"] * MILLION,
                       per_second / rates["completion_tokens_per_second"] * MILLION,
                       table.get("cached_prompt_usd_per_mtok"))
    return Pricing(float(table.get("prompt_usd_per_mtok", 0.0)), float(table.get("completion_usd_per_mtok", 0.0)),
                   table.get("cached_prompt_usd_per_mtok"))
