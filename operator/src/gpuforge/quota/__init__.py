"""Pure core of the hierarchical GPU quota: quantities, usage of workloads, tree rules, admission
decisions and budget accrual. Functions of typed inputs only; no I/O, no Kubernetes client.
"""
