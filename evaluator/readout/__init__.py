"""The read side: one read model (per window, per experiment, propensities), read live
from the store or from a file's rows, and rendered for /metrics, the dashboard and
replay's report."""
