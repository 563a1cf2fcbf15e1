"""gpuforge's lab: the local control plane, simulated GPUs, the demo and the pytest fixtures."""

# Released together with the runtime distribution, whose version it requires exactly.
__version__ = "0.1.0"
