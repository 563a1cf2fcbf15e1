"""The lab's `gpuforge` subcommands: `dev` and `demo`."""
