"""kopf handlers: decorators and a few lines each; conversion and I/O live in gpuforge.k8s."""
