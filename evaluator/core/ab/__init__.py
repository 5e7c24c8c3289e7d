"""A/B statistics: always-valid intervals, the sample-ratio test, and the readout of one
experiment."""
