"""vLLM's decisions (`DECISIONS`): one instance on CPUs, one on Instinct GPUs, or a set of
CPU instances behind one balancer. Their types are still `epycd.plan.model`'s."""

from __future__ import annotations

from epycd.plan.model import CpuEndpoint, InstanceSetEndpoint, InstinctEndpoint

DECISIONS = (CpuEndpoint, InstinctEndpoint, InstanceSetEndpoint)
