"""What a serving workload is and what it measured: the request trace `bench serve` records and `simulate` replays,
and the per-request figures (TTFT, ITL, goodput) both add up. Plain data: no engine, no server."""
