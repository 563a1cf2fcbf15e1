"""The GpuQuota admission webhook: HTTPS server, its certificates and its webhook configurations."""
