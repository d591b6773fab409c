"""More than one engine: moving KV pages between engines (kv_transfer/). Nothing here imports ridgeline.server."""
