"""Which nodes a pod may run on, and what those nodes' kubelet must do for it.

Node selection uses the labels Node Feature Discovery (NFD) publishes by default, for
what the plan relies on and nothing else:

- `feature.node.kubernetes.io/cpu-model.vendor_id: AMD`: the planner refuses a CPU that is
  not an AMD EPYC (epycd.plan.route.refuse_non_epyc).
- `feature.node.kubernetes.io/cpu-cpuid.AVX512BF16: "true"` when the backend is zentorch:
  the route gives zentorch only to a CPU with AVX-512 BF16 (`_cpu_route` in
  epycd.plan.route: "no AVX-512 BF16 gets the stock vLLM CPU path"). The stock path does
  not rely on it (Milan serves bfloat16 there), so it is not asked for then.
- the CPU generation, when the route depends on it: zentorch is validated on the stack's
  `validated_generations` only (Genoa, Turin, Venice; the route asks consent elsewhere).
  NFD's `cpu-model.family` and `cpu-model.id` are CPUID's family and model in decimal;
  the models of the host's generation are the ones epycd.host.generation.from_cpuid maps
  to it, a node affinity `In` that list.

An Instinct endpoint's pod asks for `amd.com/gpu` (the AMD GPU device plugin's resource)
and selects `feature.node.kubernetes.io/amd-gpu: "true"`, the label the AMD GPU Operator's
NodeFeatureRule puts on nodes with AMD GPUs: NFD's own PCI label is named after the device
class and vendor (`pci-0300_1002`, `pci-1200_1002`, ...), which differ between Instinct
parts, while the operator's one label holds for all of them.
"""

from __future__ import annotations

from typing import Any

from epycd.host.facts import HostFacts
from epycd.host.generation import from_cpuid
from epycd.plan.endpoint import Endpoint
from epycd.stack import Stack

NFD = "feature.node.kubernetes.io"
VENDOR_LABEL = f"{NFD}/cpu-model.vendor_id"
AMD_VENDOR_ID = "AMD"
"""NFD's vendor_id value for AuthenticAMD."""
BF16_LABEL = f"{NFD}/cpu-cpuid.AVX512BF16"
FAMILY_LABEL = f"{NFD}/cpu-model.family"
MODEL_LABEL = f"{NFD}/cpu-model.id"
AMD_GPU_LABEL = f"{NFD}/amd-gpu"
CPUID_MODELS = range(256)
"""Every model number of one CPUID family (an 8-bit field with the extended model)."""


def node_selector(decisions: Endpoint) -> dict[str, str]:
    if decisions.device == "instinct":
        return {AMD_GPU_LABEL: "true"}
    selector = {VENDOR_LABEL: AMD_VENDOR_ID}
    if decisions.backend_name == "zentorch":
        selector[BF16_LABEL] = "true"
    return selector


def generation_affinity(
    decisions: Endpoint, host: HostFacts, stack: Stack, notes: list[str]
) -> dict[str, Any] | None:
    """A required node affinity on the host's CPU family and its generation's models, when
    the route relied on the generation (zentorch on a validated one); None otherwise."""
    if decisions.device == "instinct" or decisions.backend_name != "zentorch":
        return None
    if host.epyc_generation not in stack.validated_generations or host.cpu_family is None:
        return None
    family = host.cpu_family
    models = [m for m in CPUID_MODELS if from_cpuid(family, m).generation == host.epyc_generation]
    if not models:
        models = [host.cpu_model_number] if host.cpu_model_number is not None else []
        notes.append(
            f"the node affinity pins CPUID family {family} model {models or '?'} (this "
            f"host's): its generation {host.epyc_generation} has no CPUID model range "
            "in epycd.host.generation"
        )
    expressions = [{"key": FAMILY_LABEL, "operator": "In", "values": [str(family)]}]
    if models:
        expressions.append({"key": MODEL_LABEL, "operator": "In", "values": list(map(str, models))})
    notes.append(
        f"zentorch is validated on {', '.join(stack.validated_generations)}: the pod is kept "
        f"to {host.epyc_generation} nodes (NFD cpu-model.family {family}, cpu-model.id of "
        "that generation)"
    )
    return {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": expressions}]
            }
        }
    }
