"""The HTTP server (/metrics, health) and the built-in dashboard page."""
