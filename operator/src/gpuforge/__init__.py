"""gpuforge: GPU nodes on Kubernetes."""

__version__ = "0.1.0"
