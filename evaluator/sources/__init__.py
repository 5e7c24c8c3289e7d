"""Event sources: JSON Lines files (and, in later modules, Kafka and the simulator)."""
