"""Moving a prefilled request's KV pages from a prefill engine to a decode engine.

One small interface (`KVTransport.fetch`) over two transports: in-process (tests, one process) and TCP through
ZeroMQ (real use, across hosts). The decode side pulls: it reserves pages, asks for the ones its prefix cache lacks,
checks every page against its sha256 digest, writes them and says `Done`, which lets the prefill side free them.
Every fetch ends in pages or a `TransferFailed(reason)` -- a refused handshake, a lapsed lease, a peer that went
away -- never in a silent wait. The prefill side holds pages under a lease (kv_transfer/source.py), so pages of a
decode side that never comes are freed too.

messages.py (the typed wire messages) · source.py (the prefill side: leases over an engine's held pages) ·
inprocess.py · zmq_transport.py.
"""
