"""The `gpuforge` command: one tool, one subcommand module per area."""
