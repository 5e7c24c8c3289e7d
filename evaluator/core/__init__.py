"""The pure domain: events, relevance, join, finalisation, scoring, windows, metrics, A/B
statistics and propensities. No I/O, no settings: plain values in, plain values out."""
