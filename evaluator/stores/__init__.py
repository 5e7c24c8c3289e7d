"""State stores: the embedded in-memory store and the Redis store, behind one protocol."""
