"""The composition roots: the ``evaluator`` command line and one module per command."""
