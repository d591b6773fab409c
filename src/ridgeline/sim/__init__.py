"""Serving simulator: ridgeline's own Scheduler, block manager and prefix cache under a virtual clock.

No forward pass runs: a step-time model (roofline over the catalogue, or a least-squares fit of this machine's
measured steps) says how long each scheduled step takes, and sampled tokens are synthetic. Never imports server/.
"""
