"""CLI subcommands: each wires adapters to the core for one job."""
