"""Exporters: Prometheus metrics and the HTTP endpoints that serve them."""
