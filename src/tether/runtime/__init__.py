"""The runtime that drives turns on a replica: not a store, not a model.

The lease and its heartbeats, the fenced writer every producer write goes
through, the recording flusher, the live buffer and the follower of a turn
produced elsewhere. It does no I/O of its own beyond the stores.
"""
