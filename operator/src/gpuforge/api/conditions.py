"""Condition types and reasons a GpuStack reports in its status, and the event reasons. No I/O.

Each reason says when it is set; reasons are CamelCase as Kubernetes conventions ask.
"""

from __future__ import annotations

from typing import Final

# --- Condition types -------------------------------------------------------------------------------
READY: Final = "Ready"  # every node the stack serves has its plugin Ready and advertising GPUs
PROGRESSING: Final = "Progressing"  # nodes are being labelled, switched or waiting for their plugin
DEGRADED: Final = "Degraded"  # part of the spec cannot be carried out; the message names the nodes

# --- Reasons ---------------------------------------------------------------------------------------
# Ready=True: all served nodes advertise GPUs through the stack's operand.
ALL_NODES_READY: Final = "AllNodesReady"
# Ready=True: the selector matches no node (nothing to do is not a failure).
NO_NODES_SELECTED: Final = "NoNodesSelected"
# Ready=False / Progressing=True: some served nodes wait for their plugin pod or advertisement.
NODES_PENDING: Final = "NodesPending"
# Progressing=True: some nodes are moving from one mode to the other.
MODE_SWITCH: Final = "ModeSwitch"
# Progressing=True: the upgrade engine is moving nodes to the stack's mode/version, a few at a time.
UPGRADING: Final = "Upgrading"
# Degraded=True: nodes failed a step of the upgrade (the message names them and says why).
UPGRADE_FAILED: Final = "UpgradeFailed"
# Progressing=False: nothing left to do.
RECONCILED: Final = "Reconciled"
# Degraded=True: another, older GpuStack holds some selected nodes.
NODE_CONFLICT: Final = "NodeConflict"
# Degraded=True: the chosen operand cannot work with some nodes' kubelets.
INCOMPATIBLE_KUBELET: Final = "IncompatibleKubelet"
# Degraded=True: mode dra, but the API server serves no resource.k8s.io version the driver can use.
DRA_API_NOT_SERVED: Final = "DraApiNotServed"
# Degraded=True: another stack (NVIDIA's GPU Operator) already serves some selected nodes' GPUs.
SERVED_ELSEWHERE: Final = "ServedElsewhere"
# Event: the upgrade moves nodes to a DRA driver release they cannot be rolled back from.
FORWARD_ONLY_UPGRADE: Final = "ForwardOnlyUpgrade"
# Degraded=True: the operand version is not in the compatibility data (gpuforge/compat/compat.yaml).
UNKNOWN_RELEASE: Final = "UnknownRelease"
# Degraded=True: spec.dra.deviceClasses names a class the chosen DRA driver release cannot serve.
UNSUPPORTED_DEVICE_CLASS: Final = "UnsupportedDeviceClass"
# Degraded=True: applying manifests or labels failed; the message carries the API error.
RECONCILE_FAILED: Final = "ReconcileFailed"
# Degraded=False: nothing wrong.
AS_EXPECTED: Final = "AsExpected"

# --- Event reasons (beyond the condition reasons above) ---------------------------------------------
NODE_LABELLED: Final = "NodeLabelled"
NODE_RELEASED: Final = "NodeReleased"
OBJECTS_PRUNED: Final = "ObjectsPruned"
CLEANUP_WAITING: Final = "CleanupWaiting"
