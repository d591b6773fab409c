"""This machine: its roofline measured (bandwidth, matmul FLOP/s), cached per thread count with its provenance."""
