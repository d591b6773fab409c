"""The live dashboard: where each engine step sits on this machine's roofline, the two phases' clocks and the KV
cache, one panel per worker. Data shapes and the page's static assets live here; server/dashboard.py serves them."""
