"""What a node's kubelet must do for an exported pod that the plan pinned: whole cores and
memory of one NUMA node (`kubelet_config`, printed with `KUBELET_COMMENT` for the admin,
never applied), whatever engine the pod runs."""

from __future__ import annotations

from typing import Any

from epycd.host.facts import HostFacts

FULL_PCPUS_ONLY = {"full-pcpus-only": "true"}
"""The static CPU Manager's option that allocates whole physical cores only (a pod's cpu a
multiple of the SMT level, else refused at admission): the plan pins whole cores, one
thread each, and the export asks for every thread of those cores (kube.cpu_request)."""

ADMIN_FILLS = "ADMIN-FILLS-THIS-IN"
"""The placeholder of each KubeletConfiguration value only the node's admin can choose."""


def kubelet_config(host: HostFacts) -> dict[str, Any]:
    """The KubeletConfiguration fragment a node needs so that a Guaranteed pod gets whole
    cores (`FULL_PCPUS_ONLY`) and memory of one NUMA node: printed for the admin, never
    applied. The reserved CPUs and memory are the admin's to choose (`ADMIN_FILLS`); one
    reservedMemory entry per NUMA node of the host the plan was made on."""
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "cpuManagerPolicy": "static",
        "cpuManagerPolicyOptions": dict(FULL_PCPUS_ONLY),
        "topologyManagerPolicy": "single-numa-node",
        "topologyManagerScope": "pod",
        "memoryManagerPolicy": "Static",
        "reservedSystemCPUs": ADMIN_FILLS,
        "reservedMemory": [
            {"numaNode": node.node, "limits": {"memory": ADMIN_FILLS}} for node in host.nodes
        ],
    }


KUBELET_COMMENT = (
    "KubeletConfiguration fragment for the nodes (merge it into each node's kubelet config; "
    "epycctl never applies it).",
    f"{ADMIN_FILLS}: reservedSystemCPUs is the CPU list kept for the system and the kubelet "
    "(the static CPU manager needs some reserved); reservedMemory per NUMA node must add up to "
    "kube-reserved + system-reserved + the hard eviction threshold (memory), or the kubelet "
    "refuses to start with the Static memory manager.",
    "Changing cpuManagerPolicy or memoryManagerPolicy on a node needs its state files removed "
    "(/var/lib/kubelet/cpu_manager_state, memory_manager_state) and the kubelet restarted.",
)
