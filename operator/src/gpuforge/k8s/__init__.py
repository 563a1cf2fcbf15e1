"""The only package that talks to the Kubernetes API (see `client.Kube`)."""
