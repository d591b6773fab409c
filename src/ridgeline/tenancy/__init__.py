"""Tenants in front of the engine: who a key belongs to (config.py, keys.py), what it may spend (limiter.py), what
it spent (store.py, shared by every process pointing at one SQLite file), what that cost (pricing.py), and the
one gate the server's admission path asks (gate.py). Nothing here imports the server or the engine."""
