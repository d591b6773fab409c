"""The engine core in a process of its own (`ridgeline serve --engine-core process`): scheduler, model and sampler
step in a child process, which the API process (HTTP, tokenisation, chat templates, admission) drives over ZeroMQ
with the typed messages of messages.py. docs/engine_core.md has the design and what it measured.

  messages.py  what crosses the process boundary, and how it is encoded
  core.py      the child: the engine thread (engine/engine_thread.py) fed from, and reporting to, its sockets
  process.py   the child's life seen from the API process: start, wait for ready, stop, kill, restart
  client.py    the API process's driver of the core, with the engine thread's interface, under EngineFront
"""
