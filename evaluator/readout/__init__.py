"""The read side: what the stored aggregates say, per window and per experiment, for
/metrics, the dashboard and replay's report."""
