"""`epycctl export kube`: an approved or current `Plan` as Kubernetes objects (plain dicts),
the KubeletConfiguration fragment the nodes need, and notes (docs/fleet.md).

Nothing is invented: the image, `vllm serve`'s arguments, the environment, the sizing and
the start budget are the plan's; each constant added here is named with its reason. What
the host does that Kubernetes has no field for (the exact CPUs and NUMA nodes, the memory
binding, the OpenMP bind list, rlimits, the supervisor's watchdog, systemd's restart policy,
the approval check) is said in `notes`, never dropped silently.

- A CPU endpoint: a Deployment of one replica and a ClusterIP Service on the plan's port.
  Guaranteed QoS (requests == limits): `cpu` the instance's cores times the planned host's
  threads per core (`cpu_request`), `memory` the plan's server footprint
  (`memory.process_gb`) rounded up to whole GiB plus `MEMORY_MARGIN_GIB`. With the kubelet
  of `nodes.kubelet_config` such a pod gets whole cores and memory of one NUMA node, so an
  instance the plan spread over several nodes is refused (its fix: one instance per node,
  `instances = "auto"`).
- An instance set: `replicas` = the set's count, each pod sized like its largest member,
  a PodDisruptionBudget of `min_ready`; the Service spreads the requests (HAProxy's
  leastconn is not kept).
- An Instinct endpoint: `amd.com/gpu` = its GPU count, the recipe's env and args.
- `kserve=True`: a KServe InferenceService (serving.kserve.io/v1beta1) instead of the
  Deployment and Service (and PodDisruptionBudget).

An endpoint's `chat_template` file is read at export into a ConfigMap
(`epyc-llm-NAME-chat-template`), mounted read-only where `--chat-template` points.

Secrets are references (`secretKeyRef`) to Secrets the admin creates; their values never
appear. A local model folder needs a PersistentVolumeClaim (`model_volume`); a hub id is
downloaded into the HF cache (that claim, or an emptyDir).
"""

from __future__ import annotations

import math
from typing import Any

from epycd.engines.vllm.export.nodes import generation_affinity, node_selector
from epycd.engines.vllm.export.volumes import (
    CHAT_TEMPLATE,
    HF_CACHE_IN_CONTAINER,
    SHM_PATH,
    SHM_VOLUME,
    chat_template_map,
    chat_template_mount,
    model_mount,
    pod_volumes,
    shm_quantity,
)
from epycd.engines.vllm.plan.model import (
    AnyVllmServer,
    VllmCpuServer,
    VllmInstinctServer,
    vllm_processes,
)
from epycd.engines.vllm.render.gpu import GPU_CAPABILITY
from epycd.engines.vllm.render.quadlet import HEALTH_INTERVAL, HEALTH_RETRIES, HEALTH_TIMEOUT
from epycd.errors import InputError, Refusal
from epycd.export import KubeExport, KubeExporter
from epycd.export.kubelet import kubelet_config
from epycd.host.cpulist import parse_cpulist
from epycd.host.facts import HostFacts
from epycd.names import unit_name
from epycd.plan.endpoint import Endpoint, InstanceSet, Plan
from epycd.stack import Stack

MEMORY_MARGIN_GIB = 2
"""Added to the plan's server footprint for the memory request and limit: the pod's cgroup
is also charged the page cache of the weights it reads and its tmpfs (/dev/shm), which the
plan's `process_gb` (weights + KV pool + vLLM's processes) does not count; at the limit the
kernel kills the container, where the host only had its OS headroom to share."""
PROBE_PERIOD_S = int(HEALTH_INTERVAL.removesuffix("s"))
PROBE_TIMEOUT_S = int(HEALTH_TIMEOUT.removesuffix("s"))
PROBE_FAILURES = int(HEALTH_RETRIES)
"""The probes' period, timeout and failures: those of the Quadlet unit's podman health
check (epycd.engines.vllm.render.quadlet), so a pod is judged as the host's container is."""
HEALTH_PATH = "/health"
POD_LISTEN = "0.0.0.0"
"""A pod is reached on its own IP (by the Service): vLLM listens on every address of the
pod's network namespace, which is the pod's alone."""
CONTAINER = "vllm"
PORT_NAME = "http"
HF_HOME = "HF_HOME"
"""Set by the plan of a host endpoint to the host's cache folder (epycd.plan.service.hfcache)."""
API_KEY_ENV = "VLLM_API_KEY"
HF_TOKEN_ENV = "HF_TOKEN"
API_KEY_SECRET_KEY = "api-key"
HF_TOKEN_SECRET_KEY = "hf-token"
LEFT_TO_THE_POD = ("VLLM_CPU_OMP_THREADS_BIND", "HIP_VISIBLE_DEVICES")
"""Plan env naming host CPU or GPU numbers: in a pod vLLM binds to the container's own CPU
set, and the device plugin hands the pod its GPUs (numbered from 0 inside it)."""
RESERVED_CPUS_ENV = "VLLM_CPU_NUM_OF_RESERVED_CPU"
"""vLLM's count of the cores its auto bind leaves out of the OpenMP threads."""
MAX_NAME = 63
"""Kubernetes' limit on a Service's (DNS-1035 label) and a pod template's names."""
APP = "epyc-llm"


class VllmKubeExporter(KubeExporter):
    """vLLM's export: a Deployment and Service (or an InferenceService) per endpoint, one
    replica per instance of a set."""

    def export(
        self, plan: Plan, host: HostFacts, stack: Stack, *, kserve: bool, model_volume: str | None
    ) -> KubeExport:
        return export_vllm(plan, host, stack, kserve=kserve, model_volume=model_volume)


def export_vllm(
    plan: Plan, host: HostFacts, stack: Stack, *, kserve: bool, model_volume: str | None
) -> KubeExport:
    decisions = plan.decisions
    notes: list[str] = []
    check_name(decisions.unit_name, decisions.config_file)
    process = pod_process(decisions, notes)
    container = vllm_container(decisions, process, host, stack, model_volume, notes)
    volumes = pod_volumes(decisions, process, stack, model_volume)
    template = chat_template_map(decisions, process, labels(decisions), notes)
    if template is not None:
        volumes.append({"name": CHAT_TEMPLATE, "configMap": {"name": template["metadata"]["name"]}})
        container["volumeMounts"].append(chat_template_mount(decisions, process))
    pod: dict[str, Any] = {"nodeSelector": node_selector(decisions)}
    affinity = generation_affinity(decisions, host, stack, notes)
    if affinity is not None:
        pod["affinity"] = affinity
    replicas = decisions.instances.count if decisions.instances is not None else 1
    notes += host_notes(decisions, process, host, stack)
    objects: list[dict[str, Any]] = [] if template is None else [template]
    if kserve:
        objects.append(inference_service(decisions, container, pod, volumes, replicas, notes))
    else:
        objects += [
            deployment(decisions, container, pod | {"volumes": volumes}, replicas),
            service(decisions),
        ]
        if decisions.instances is not None:
            objects.append(disruption_budget(decisions, decisions.instances))
    return KubeExport(objects, kubelet_config(host), notes)


def check_name(name: str, config_file: str) -> None:
    longest = f"{name}-{CHAT_TEMPLATE}"
    if len(name) > MAX_NAME or name.endswith("-") or len(longest) > 253:
        raise InputError(
            f"{name} is not a Kubernetes object name (at most {MAX_NAME} characters, not "
            "ending in '-')",
            file=config_file,
            fix="rename the endpoint file to a shorter name ending in a letter or digit",
        )


def labels(decisions: Endpoint) -> dict[str, str]:
    return {"app.kubernetes.io/name": APP, "app.kubernetes.io/instance": decisions.endpoint}


def metadata(decisions: Endpoint) -> dict[str, Any]:
    return {"name": decisions.unit_name, "labels": labels(decisions)}


def cpu_count(process: AnyVllmServer) -> int:
    return len(parse_cpulist(process.cpus))


def cpu_request(process: AnyVllmServer, host: HostFacts) -> int:
    """The pod's `cpu`: the plan pins N physical cores, one logical CPU each (its `cpus`);
    the static CPU Manager counts logical CPUs, so N cores are N x the host's threads per
    core, which `full-pcpus-only` (nodes.kubelet_config) hands out as whole cores."""
    return cpu_count(process) * host.threads_per_core


def pod_process(decisions: Endpoint, notes: list[str]) -> AnyVllmServer:
    """The one vLLM process every pod runs: the endpoint's, or a set's largest member
    (most CPUs, then most memory), refused when it spans NUMA nodes."""
    processes = vllm_processes(decisions)
    process = processes[0]
    if decisions.instances is not None:
        process = max(processes, key=lambda m: (cpu_count(m), _process_gb(m)))
        if any(m.vllm_args != process.vllm_args or m.env != process.env for m in processes):
            notes.append(
                f"every replica runs instance {process.instance}'s arguments and env (the "
                "largest); the plan's members differ in sizing or port"
            )
    if isinstance(process, VllmCpuServer) and len(process.numa_nodes) > 1:
        raise Refusal(
            f"{decisions.endpoint}'s instance spans NUMA nodes "
            f"{','.join(map(str, process.numa_nodes))}: a Guaranteed pod under the "
            "single-numa-node Topology Manager gets one node's CPUs and memory",
            file=decisions.config_file,
            fix='set instances = "auto" (one instance per NUMA node) in the endpoint file, '
            "then epycctl export kube again",
        )
    return process


def _process_gb(process: AnyVllmServer) -> float:
    return process.memory.process_gb if isinstance(process, VllmCpuServer) else 0.0


def serve_args(process: AnyVllmServer, notes: list[str]) -> list[str]:
    """`vllm serve`'s arguments as planned, listening on every address of the pod."""
    args = list(process.vllm_args)
    for index, arg in enumerate(args[:-1]):
        if arg == "--host" and args[index + 1] != POD_LISTEN:
            notes.append(
                f"vLLM listens on {POD_LISTEN} in the pod (the plan: {args[index + 1]}); the "
                "Service reaches it on the pod's IP"
            )
            args[index + 1] = POD_LISTEN
    return args


def image_of(
    decisions: Endpoint,
    stack: Stack,
    notes: list[str],
) -> tuple[str, bool]:
    """The image and whether its entrypoint is `vllm serve`: the plan's, or on the host path
    (no image) the stack's CPU image for the plan's backend."""
    route = vllm_processes(decisions)[0]
    if route.image is not None:
        return route.image, route.image_entrypoint_is_vllm_serve
    if route.backend == "zentorch":
        image, entry = stack.image, stack.image_entrypoint_is_vllm_serve
    else:
        image, entry = stack.stock_image_pinned, stack.stock_image.entrypoint_is_vllm_serve
    notes.append(
        f"the plan runs the host vLLM {route.vllm_executable} ({route.vllm_version}); "
        f"the pod runs the stack's {route.backend} image {image} (vLLM "
        f"{stack.vllm_version})"
    )
    return image, entry


def env_of(process: AnyVllmServer, notes: list[str]) -> list[dict[str, Any]]:
    env: list[dict[str, Any]] = []
    for key, value in sorted(pod_env(process).items()):
        if key in LEFT_TO_THE_POD:
            notes.append(f"{key}={value} is not set: {left_to_the_pod(key)}")
            continue
        if key == HF_HOME and value != HF_CACHE_IN_CONTAINER:
            notes.append(f"{HF_HOME} is the pod's volume {HF_CACHE_IN_CONTAINER}, not {value}")
            value = HF_CACHE_IN_CONTAINER
        env.append({"name": key, "value": value})
    if process.api_key_file:
        env.append(secret_env(API_KEY_ENV, process, API_KEY_SECRET_KEY))
        notes.append(secret_note(process, process.api_key_file, API_KEY_SECRET_KEY))
    if process.hf_token_file:
        env.append(secret_env(HF_TOKEN_ENV, process, HF_TOKEN_SECRET_KEY))
        notes.append(secret_note(process, process.hf_token_file, HF_TOKEN_SECRET_KEY))
    return env


def pod_env(process: AnyVllmServer) -> dict[str, str]:
    """The plan's env, and for a CPU instance the front end's share of its cores: the plan
    binds OpenMP to all but the first core(s) (`omp_cpus`), vLLM's own bind in the pod
    keeps `RESERVED_CPUS_ENV` of its cores out (its default is one; none for an embedder
    or a reranker whose plan binds every core, docs/tuning.md rule 1)."""
    env = dict(process.env)
    if isinstance(process, VllmCpuServer):
        reserved = cpu_count(process) - len(parse_cpulist(process.omp_cpus))
        if reserved > 0 or process.pooling:
            env.setdefault(RESERVED_CPUS_ENV, str(reserved))
    return env


def left_to_the_pod(key: str) -> str:
    if key == "HIP_VISIBLE_DEVICES":
        return "the device plugin gives the pod its GPUs, numbered from 0 inside it"
    return (
        "vLLM's OpenMP threads bind to one thread per core of the container's own CPU set "
        f"(the CPU Manager's), without the {RESERVED_CPUS_ENV} core(s) the plan leaves to "
        "its front end"
    )


def secret_name(process: AnyVllmServer, key: str) -> str:
    """`epyc-llm-NAME-KEY`: the endpoint's (a set's members share it)."""
    return f"{unit_name(process.endpoint)}-{key}"


def secret_env(variable: str, process: AnyVllmServer, key: str) -> dict[str, Any]:
    reference = {"name": secret_name(process, key), "key": key}
    return {"name": variable, "valueFrom": {"secretKeyRef": reference}}


def secret_note(process: AnyVllmServer, path: str, key: str) -> str:
    return (
        f"create the Secret {secret_name(process, key)} (key {key}) from the root-only file "
        f"{path}: kubectl create secret generic {secret_name(process, key)} "
        f"--from-file={key}={path}"
    )


def vllm_container(
    decisions: Endpoint,
    process: AnyVllmServer,
    host: HostFacts,
    stack: Stack,
    model_volume: str | None,
    notes: list[str],
) -> dict[str, Any]:
    image, entry_is_serve = image_of(decisions, stack, notes)
    mount_path, read_only = model_mount(decisions, process, model_volume)
    container: dict[str, Any] = {"name": CONTAINER, "image": image}
    container["imagePullPolicy"] = "IfNotPresent"
    if not entry_is_serve:
        container["command"] = ["vllm", "serve"]
    container["args"] = serve_args(process, notes)
    container["env"] = env_of(process, notes)
    container["ports"] = [{"name": PORT_NAME, "containerPort": process.port, "protocol": "TCP"}]
    container["resources"] = resources(process, host)
    container.update(probes(process))
    mount = {"name": "model", "mountPath": mount_path, "readOnly": read_only}
    container["volumeMounts"] = [mount, {"name": SHM_VOLUME, "mountPath": SHM_PATH}]
    container["securityContext"] = security_context(process)
    return container


def resources(process: AnyVllmServer, host: HostFacts) -> dict[str, Any]:
    """Requests == limits (Guaranteed QoS): the cores' logical CPUs (`cpu_request`) and
    whole GiB for a CPU instance; the GPUs of an Instinct endpoint (its plan sizes VRAM, not
    host memory)."""
    if isinstance(process, VllmInstinctServer):
        wanted: dict[str, str] = {"amd.com/gpu": str(len(process.gpus))}
    else:
        cpu = str(cpu_request(process, host))
        wanted = {"cpu": cpu, "memory": f"{memory_gib(process)}Gi"}
    return {"requests": dict(wanted), "limits": dict(wanted)}


def memory_gib(process: VllmCpuServer) -> int:
    return math.ceil(process.memory.process_gb) + MEMORY_MARGIN_GIB


def probes(process: AnyVllmServer) -> dict[str, Any]:
    """Startup on /health for the plan's whole start budget, then readiness and liveness."""
    startup = math.ceil(process.start_timeout_s / PROBE_PERIOD_S)
    return {
        "startupProbe": health_probe(startup),
        "readinessProbe": health_probe(PROBE_FAILURES),
        "livenessProbe": health_probe(PROBE_FAILURES),
    }


def health_probe(failures: int) -> dict[str, Any]:
    return {
        "httpGet": {"path": HEALTH_PATH, "port": PORT_NAME},
        "periodSeconds": PROBE_PERIOD_S,
        "timeoutSeconds": PROBE_TIMEOUT_S,
        "failureThreshold": failures,
    }


def security_context(process: AnyVllmServer) -> dict[str, Any]:
    """The units' confinement (CONTAINER_CONFINEMENT, vLLM's render/commands.py): every
    capability dropped but SYS_NICE (and SYS_PTRACE on Instinct, the recipe's), no new
    privileges; an Instinct container runs without a seccomp filter, as its unit does."""
    add = ["SYS_NICE", GPU_CAPABILITY] if isinstance(process, VllmInstinctServer) else ["SYS_NICE"]
    context: dict[str, Any] = {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"], "add": add},
    }
    if isinstance(process, VllmInstinctServer):
        context["seccompProfile"] = {"type": "Unconfined"}
    return context


def deployment(
    decisions: Endpoint,
    container: dict[str, Any],
    pod: dict[str, Any],
    replicas: int,
) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": metadata(decisions),
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": labels(decisions)},
            "template": {
                "metadata": {"labels": labels(decisions)},
                "spec": {"containers": [container], **pod},
            },
        },
    }


def service(decisions: Endpoint) -> dict[str, Any]:
    port = {"name": PORT_NAME, "port": decisions.port, "targetPort": PORT_NAME, "protocol": "TCP"}
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata(decisions),
        "spec": {"type": "ClusterIP", "selector": labels(decisions), "ports": [port]},
    }


def disruption_budget(decisions: Endpoint, instances: InstanceSet) -> dict[str, Any]:
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": metadata(decisions),
        "spec": {
            "minAvailable": instances.min_ready,
            "selector": {"matchLabels": labels(decisions)},
        },
    }


KSERVE_OWNS = ("--host", "--port", "--served-model-name")
"""Flags the KServe HuggingFace runtime sets itself (its listen address and model name)."""


def inference_service(
    decisions: Endpoint,
    container: dict[str, Any],
    pod: dict[str, Any],
    volumes: list[dict[str, Any]],
    replicas: int,
    notes: list[str],
) -> dict[str, Any]:
    """A KServe InferenceService on its HuggingFace runtime (vLLM inside): the model id and
    served name as the runtime's flags, the rest of the plan's `vllm serve` flags after."""
    args = list(container["args"][1:])
    kept: list[str] = []
    skip = False
    for arg in args:
        if skip:
            skip = False
            continue
        if arg in KSERVE_OWNS:
            skip = True
            continue
        kept.append(arg)
    model = {
        "modelFormat": {"name": "huggingface"},
        "args": [
            f"--model_name={decisions.served_model_name}",
            f"--model_id={container['args'][0]}",
            *kept,
        ],
        "env": container["env"],
        "resources": container["resources"],
        "volumeMounts": container["volumeMounts"],
    }
    notes.append(
        "KServe: the HuggingFace runtime's image (the cluster's ServingRuntime) runs, not "
        f"{container['image']}; it listens on its own port and sets --host, --port and "
        "--served-model-name itself; probes are KServe's"
    )
    predictor = {"minReplicas": replicas, "maxReplicas": replicas, **pod, "volumes": volumes}
    return {
        "apiVersion": "serving.kserve.io/v1beta1",
        "kind": "InferenceService",
        "metadata": metadata(decisions),
        "spec": {"predictor": predictor | {"model": model}},
    }


def shm_note(process: AnyVllmServer, stack: Stack) -> str:
    size = shm_quantity(stack.isolated_ipc_shm_size)
    where = (
        "are the node's memory (the pod has no memory limit: it is not Guaranteed)"
        if isinstance(process, VllmInstinctServer)
        else f"count against the pod's memory limit ({memory_gib(process)}Gi), which is not "
        "raised for them"
    )
    return (
        f"--ipc=host is not kept: the pod has its own IPC namespace, and {SHM_PATH} is a "
        f"memory-backed emptyDir of {size} (the stack's isolated_ipc_shm_size, "
        f"{stack.isolated_ipc_shm_size}) instead of the runtime's 64 MiB; its pages {where}"
    )


def host_notes(
    decisions: Endpoint,
    process: AnyVllmServer,
    host: HostFacts,
    stack: Stack,
) -> list[str]:
    """Each host decision with no Kubernetes field, in words."""
    nodes = ",".join(map(str, process.numa_nodes))
    notes = [
        f"the plan pins {process.cpus} (socket {process.socket}) and binds memory to NUMA "
        f"node(s) {nodes}: in a cluster the CPU, Memory and Topology Managers choose the CPUs "
        "and the node (the kubelet fragment)",
        f"LimitMEMLOCK={decisions.limit_memlock} and LimitNOFILE={decisions.limit_nofile} "
        "have no pod field: the container runtime's limits apply",
        shm_note(process, stack),
        "the boot-time approval check (ExecCondition=) has no equivalent: review these "
        "manifests as you review the plan; the cluster runs what it is given",
        "the health gate's model list and one request are not probes: readiness is /health",
    ]
    if isinstance(process, VllmCpuServer):
        cores, threads = cpu_count(process), host.threads_per_core
        notes.append(
            f"the plan pins {cores} cores, one thread each; the pod asks for cpu "
            f"{cpu_request(process, host)} ({cores} cores x {threads} threads per core, this "
            "host's SMT), which the static CPU Manager with full-pcpus-only gives as whole "
            "cores: their SMT siblings stay idle as on the host, and vLLM's auto bind "
            "(VLLM_CPU_OMP_THREADS_BIND unset) runs one OpenMP thread per core of the pod's CPUs"
        )
        node_cpus = [len(n.cpus) for n in host.nodes if n.node in process.numa_nodes]
        if node_cpus and cpu_request(process, host) >= sum(node_cpus):
            notes.append(
                f"the pod asks for every CPU of its NUMA node ({sum(node_cpus)}): the kubelet "
                "admits it only on a node whose reservedSystemCPUs lie on another NUMA node"
            )
    healing = decisions.healing
    if healing is not None:
        notes.append(
            f"systemd's Restart={healing.restart} (RestartSec={healing.restart_sec}, crash "
            f"loop after {healing.start_limit_burst} failed runs) is the kubelet's restart "
            "policy Always with its own back-off (CrashLoopBackOff)"
        )
        if healing.watchdog_s is not None:
            notes.append(
                f"the supervisor's watchdog (WatchdogSec={healing.watchdog_s}) is the "
                "liveness probe on /health"
            )
        notes.append(
            f"a stalled engine (requests running, no token for {healing.stall_s} s) is not "
            "detected: the liveness probe sees /health only"
        )
    if decisions.instances is not None:
        notes.append(
            "HAProxy's leastconn is replaced by the Service's spreading over the ready pods"
        )
    if isinstance(gpu := decisions.first, VllmInstinctServer):
        notes.append(
            f"the plan's GPUs {','.join(map(str, gpu.gpus))} ({gpu.gfx_version}) "
            "are the device plugin's choice in a cluster; the pod asks for no host CPUs or "
            "memory (the plan sizes VRAM), so it is not Guaranteed"
        )
    notes += [f"the plan needed consent: {reason}" for reason in decisions.confirmation_reasons]
    return notes


EXPORTER = VllmKubeExporter()
