"""More than one engine. Nothing here imports ridgeline.server: the HTTP fronts (server/) import this package.

Disaggregation: moving KV pages between engines (kv_transfer/) and pools of prefill/decode workers on Ray
(ray_pool.py).

The router (issue #13), one idea a file: messages.py (typed messages between router and workers) · worker.py (an
engine on its own thread: submit / abort / status with prefix-cache events) · ray_worker.py (that worker as a Ray
actor) · replicas.py (the replica interface) · local_replica.py / ray_replica.py / http_replica.py (its three
kinds) · health.py · load.py (load counted at dispatch) · affinity.py (prefix-hash index) · rates.py (measured and
roofline rates) · cost.py (predicted seconds) · replica_policy.py · tier_policy.py (`auto`) · config.py (TOML) ·
placement.py (memory budget) · build.py (config to running router) · router.py (ties them together) · metrics.py.
"""
