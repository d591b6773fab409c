"""Measurements that drive the real thing: the model (latency, perplexity), the engine (throughput), a server
(serve), and this machine's bandwidth and FLOP/s. Their figures are set beside the napkin model's (napkin/)."""
