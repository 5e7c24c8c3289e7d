"""I/O at the edges: one adapter per technology (Kafka, Redis, the embedded store, files,
Prometheus, HTTP)."""
