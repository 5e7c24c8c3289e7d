"""The pure partition engine: join, event time and finalisation of one partition."""
