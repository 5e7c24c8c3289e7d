"""Prometheus collectors: the window metrics (global) and the pipeline's process counters."""
