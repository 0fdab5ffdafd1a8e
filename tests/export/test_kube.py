"""`epycctl export kube` from the real planner (docs/fleet.md): goldens for a CPU
endpoint (stock on Milan, docker; zentorch from a host vLLM), an instance set (Genoa NPS4,
podman) and an Instinct endpoint (MI300X), and KServe for the first; every object valid
against the Kubernetes schemas of several minor versions; Guaranteed QoS and the
single-NUMA-node condition on every fake host shape; no secret value in any output; every
InferenceService valid against KServe's schema (tests/export/kserve/generate.py says how it
is made and why it is closed where the CRD's is open).

`tests/golden/CASE/kube.yaml` (and `kserve.yaml`) are what stdout gets, `@TMP@` for the
test's folder. `UPDATE_GOLDEN=1` writes them anew: review the diff before committing it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from epycd.cli.export import stdout_text
from epycd.engines.vllm.export.volumes import shm_quantity
from epycd.engines.vllm.plan.model import VllmCpuServer, vllm_processes
from epycd.errors import InputError, Refusal
from epycd.export import KubeExport, export_kube
from epycd.host.cpulist import parse_cpulist
from epycd.host.facts import HostFacts
from epycd.plan.endpoint import EndpointDecisions, Plan
from epycd.sizes import GIB
from epycd.stack import shipped_stack
from tests.hosts import CATALOGUE
from tests.plan.conftest import PlanWorkspace, fake_host
from tests.render.test_golden import GOLDEN, PLACEHOLDER, case_folder, plan_results
from tests.render.test_golden_outputs import check_golden

VERSIONS = ("1.29", "1.31", "1.33", kubernetes_validate.utils.latest_version())
"""Kubernetes minor versions the objects must validate against (strict: no unknown field);
the last is the newest the installed kubernetes-validate knows."""
GOLDEN_CASES = {
    "milan-docker": "olmo",
    "host-vllm": "host-qwen",
    "instances-podman-nps4": "qwen",
    "instinct-mi300x-podman": "gpu",
    "pooling-podman": "embed",
}
"""Golden case -> the endpoint exported: a CPU endpoint on the stock path, one on a host
vLLM (the stack's image instead), an instance set, an Instinct endpoint and an embedder."""
KUBE_KINDS = {"Deployment", "Service", "PodDisruptionBudget"}
KSERVE_SCHEMA = Path(__file__).parent / "kserve" / "inferenceservice-v1beta1.schema.json"


def exported(case: str, tmp: Path, monkeypatch: pytest.MonkeyPatch, **options: Any) -> str:
    """stdout of `export kube` for the case's endpoint, the folder as the placeholder."""
    done, folder = export_case(case, tmp, monkeypatch, **options)
    return stdout_text(GOLDEN_CASES[case], done).replace(folder, PLACEHOLDER)


def export_case(
    case: str, tmp: Path, monkeypatch: pytest.MonkeyPatch, **options: Any
) -> tuple[KubeExport, str]:
    import tomllib

    from tests.render.test_golden import GoldenCase

    tmp.mkdir(exist_ok=True)
    with case_folder(case, tmp) as folder:
        results = plan_results(case, folder, monkeypatch)
        plan = results[GOLDEN_CASES[case]].plan
        assert plan is not None
        spec = GoldenCase.model_validate(tomllib.loads((GOLDEN / case / "case.toml").read_text()))
        host = fake_host(folder / "export-host", spec.host, spec.runtimes)
        return export_kube(plan, host, shipped_stack(), **options), str(folder)


@pytest.mark.parametrize("case", sorted(GOLDEN_CASES))
def test_golden(case: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    check_golden(GOLDEN / case / "kube.yaml", exported(case, tmp_path, monkeypatch))


def test_golden_kserve(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    text = exported("instances-podman-nps4", tmp_path, monkeypatch, kserve=True)
    check_golden(GOLDEN / "instances-podman-nps4" / "kserve.yaml", text)


def validate(objects: list[dict[str, Any]]) -> None:
    for obj in objects:
        for version in VERSIONS:
            kubernetes_validate.validate(obj, version, strict=True)


@pytest.mark.parametrize("case", sorted(GOLDEN_CASES))
def test_every_object_validates(case: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    done, _ = export_case(case, tmp_path, monkeypatch)
    assert {obj["kind"] for obj in done.objects} <= KUBE_KINDS
    validate(done.objects)
    # and stdout is the same objects, as YAML documents
    text = stdout_text(GOLDEN_CASES[case], done)
    documents = list(yaml.safe_load_all(text))
    assert documents[:-1] == done.objects and documents[-1] == done.kubelet_config


def test_a_broken_object_does_not_validate(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The validation is strict: an unknown field is an error."""
    done, _ = export_case("milan-docker", tmp_path, monkeypatch)
    broken = json.loads(json.dumps(done.objects[0]))
    broken["spec"]["template"]["spec"]["containers"][0]["cpuset"] = "0-63"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, VERSIONS[-1], strict=True)


def kserve_errors(isvc: dict[str, Any]) -> list[str]:
    validator = jsonschema.Draft202012Validator(json.loads(KSERVE_SCHEMA.read_text()))
    return [
        f"{'/'.join(map(str, error.absolute_path))}: {error.message}"
        for error in validator.iter_errors(isvc)
    ]


def inference_service(done: KubeExport) -> dict[str, Any]:
    [isvc] = [obj for obj in done.objects if obj["kind"] == "InferenceService"]
    return isvc


@pytest.mark.parametrize("case", sorted(GOLDEN_CASES))
def test_every_inference_service_validates(
    case: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    done, _ = export_case(case, tmp_path, monkeypatch, kserve=True)
    assert kserve_errors(inference_service(done)) == []
    validate([obj for obj in done.objects if obj["kind"] != "InferenceService"])


@pytest.mark.parametrize(
    ("where", "value"),
    [
        (("spec", "predictor", "model", "cpuset"), "0-63"),
        (("spec", "predictor", "model", "resources", "limits"), [{"cpu": "4"}]),
        (("spec", "predictor", "model", "resources", "limits", "memory"), "85 GiB"),
        (("spec", "predictor", "minReplicas"), "4"),
        (("spec", "predictor", "model", "modelFormat"), "huggingface"),
    ],
)
def test_a_broken_inference_service_does_not_validate(
    where: tuple[str, ...], value: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The schema is closed and typed: an unknown field, a wrong type or a quantity Kubernetes
    would not parse is an error."""
    done, _ = export_case("instances-podman-nps4", tmp_path, monkeypatch, kserve=True)
    broken = json.loads(json.dumps(inference_service(done)))
    parent = broken
    for key in where[:-1]:
        parent = parent[key]
    parent[where[-1]] = value
    assert kserve_errors(broken), broken


def test_kserve_structure(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The InferenceService: the HuggingFace model format, the model id and served name as the
    runtime's flags, the plan's other flags, the pods' resources, env and replicas."""
    plain, _ = export_case("instances-podman-nps4", tmp_path / "a", monkeypatch)
    done, _ = export_case("instances-podman-nps4", tmp_path / "b", monkeypatch, kserve=True)
    isvc = inference_service(done)
    assert isvc["apiVersion"] == "serving.kserve.io/v1beta1"
    assert isvc["kind"] == "InferenceService"
    predictor = isvc["spec"]["predictor"]
    container = plain.objects[0]["spec"]["template"]["spec"]["containers"][0]
    model = predictor["model"]
    assert model["modelFormat"] == {"name": "huggingface"}
    assert model["args"][:2] == ["--model_name=Qwen/Qwen3-0.6B", "--model_id=Qwen/Qwen3-0.6B"]
    assert "--max-num-seqs" in model["args"] and "--host" not in model["args"]
    assert model["resources"] == container["resources"] and model["env"] == container["env"]
    assert predictor["minReplicas"] == predictor["maxReplicas"] == 4
    assert predictor["nodeSelector"] == plain.objects[0]["spec"]["template"]["spec"]["nodeSelector"]


def test_a_set_is_replicas_with_a_disruption_budget(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    done, _ = export_case("instances-podman-nps4", tmp_path, monkeypatch)
    deployment, service, budget = done.objects
    assert deployment["spec"]["replicas"] == 4
    assert budget["kind"] == "PodDisruptionBudget" and budget["spec"]["minAvailable"] == 3
    assert service["spec"]["ports"][0]["port"] == 8000
    assert any("leastconn" in note for note in done.notes)


def test_the_instinct_pod_asks_for_its_gpus(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    done, _ = export_case("instinct-mi300x-podman", tmp_path, monkeypatch)
    pod = done.objects[0]["spec"]["template"]["spec"]
    [container] = pod["containers"]
    assert container["resources"]["limits"] == {"amd.com/gpu": "1"}
    assert container["resources"]["requests"] == {"amd.com/gpu": "1"}
    assert {"name": "VLLM_ROCM_USE_AITER_FP4BMM", "value": "0"} in container["env"]
    assert not any(e["name"] == "HIP_VISIBLE_DEVICES" for e in container["env"])
    assert pod["nodeSelector"] == {"feature.node.kubernetes.io/amd-gpu": "true"}


@pytest.mark.parametrize("case", ["milan-docker", "host-vllm", "instances-podman-nps4"])
def test_the_front_end_keeps_the_plans_cores(
    case: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The plan's OpenMP bind leaves its first core(s) to vLLM's front end; the pod's auto
    bind is told to leave as many (VLLM_CPU_NUM_OF_RESERVED_CPU), not its default of one."""
    from epycd.host.cpulist import parse_cpulist

    with case_folder(case, tmp_path) as folder:
        plan = plan_results(case, folder, monkeypatch)[GOLDEN_CASES[case]].plan
    assert plan is not None
    members = [m for m in vllm_processes(plan.decisions) if isinstance(m, VllmCpuServer)]
    largest = max(members, key=lambda m: (len(parse_cpulist(m.cpus)), m.memory.process_gb))
    reserved = len(parse_cpulist(largest.cpus)) - len(parse_cpulist(largest.omp_cpus))
    assert reserved >= 1, largest
    done, _ = export_case(case, tmp_path / "export", monkeypatch)
    [deployment] = [obj for obj in done.objects if obj["kind"] == "Deployment"]
    env = deployment["spec"]["template"]["spec"]["containers"][0]["env"]
    assert {"name": "VLLM_CPU_NUM_OF_RESERVED_CPU", "value": str(reserved)} in env, env
    assert all(item["name"] != "VLLM_CPU_OMP_THREADS_BIND" for item in env), env


def test_the_host_path_gets_the_stacks_image(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    done, _ = export_case("host-vllm", tmp_path, monkeypatch)
    [container] = done.objects[0]["spec"]["template"]["spec"]["containers"]
    assert container["image"] == shipped_stack().image
    assert container["command"] == ["vllm", "serve"]
    assert any("the stack's zentorch image" in note for note in done.notes)


@pytest.mark.parametrize("case", sorted(GOLDEN_CASES))
def test_dev_shm_is_a_memory_volume_of_the_stacks_size(
    case: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--ipc=host becomes a memory-backed /dev/shm of the stack's isolated_ipc_shm_size, not
    added to the memory request (a note says its pages count against the limit)."""
    done, _ = export_case(case, tmp_path, monkeypatch)
    pod = done.objects[0]["spec"]["template"]["spec"]
    [container] = pod["containers"]
    shm = {"medium": "Memory", "sizeLimit": "16Gi"}
    assert {"name": "dshm", "emptyDir": shm} in pod["volumes"]
    assert {"name": "dshm", "mountPath": "/dev/shm"} in container["volumeMounts"]
    [note] = [note for note in done.notes if "/dev/shm" in note]
    assert "16Gi" in note and "--ipc=host" in note
    if "memory" in container["resources"]["limits"]:
        assert f"memory limit ({container['resources']['limits']['memory']})" in note


def test_dev_shm_in_kserve(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    done, _ = export_case("instances-podman-nps4", tmp_path, monkeypatch, kserve=True)
    predictor = done.objects[0]["spec"]["predictor"]
    assert {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "16Gi"}} in predictor[
        "volumes"
    ]
    assert {"name": "dshm", "mountPath": "/dev/shm"} in predictor["model"]["volumeMounts"]


@pytest.mark.parametrize(
    ("size", "quantity"), [("16g", "16Gi"), ("512m", "512Mi"), ("64K", "64Ki"), ("1024", "1024")]
)
def test_shm_quantity(size: str, quantity: str) -> None:
    assert shm_quantity(size) == quantity


def test_shm_quantity_refuses_what_is_not_a_shm_size() -> None:
    with pytest.raises(ValueError, match="isolated_ipc_shm_size"):
        shm_quantity("16GiB")


TEMPLATE_TEXT = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}\n"


def template_plan(tmp: Path, text: str) -> tuple[Plan, HostFacts, Path]:
    """A plan of an endpoint with a chat_template file (`instances` from `text`)."""
    template = tmp / "templates" / "chat.jinja"
    template.parent.mkdir(parents=True)
    template.write_text(TEMPLATE_TEXT, encoding="utf-8")
    plan, reason, host = plan_on(
        tmp / "ws", "genoa-9654-2s-nps1", f'chat_template = "{template}"\n' + text
    )
    assert plan is not None, reason
    return plan, host, template


@pytest.mark.parametrize("kserve", [False, True])
def test_the_chat_template_is_a_config_map(tmp_path: Path, kserve: bool) -> None:
    """The file's content in ConfigMap epyc-llm-llm-chat-template (before the workload),
    mounted read-only by subPath at the path --chat-template gives vLLM, the arg kept."""
    plan, host, template = template_plan(tmp_path, "")
    done = export_kube(plan, host, shipped_stack(), model_volume="models", kserve=kserve)
    validate([obj for obj in done.objects if obj["kind"] != "InferenceService"])  # no CRD schema
    config_map = done.objects[0]
    assert config_map["kind"] == "ConfigMap"
    assert config_map["metadata"]["name"] == "epyc-llm-llm-chat-template"
    assert config_map["data"] == {"chat-template.jinja": TEMPLATE_TEXT}
    if kserve:
        [_, isvc] = done.objects
        pod = isvc["spec"]["predictor"]
        container = pod["model"]
    else:
        kinds = [obj["kind"] for obj in done.objects]
        assert kinds == ["ConfigMap", "Deployment", "Service"]
        pod = done.objects[1]["spec"]["template"]["spec"]
        [container] = pod["containers"]
    args = container["args"]
    assert args[args.index("--chat-template") + 1] == str(template)
    volume = {"name": "chat-template", "configMap": {"name": "epyc-llm-llm-chat-template"}}
    assert volume in pod["volumes"]
    mount = {
        "name": "chat-template",
        "mountPath": str(template),
        "subPath": "chat-template.jinja",
        "readOnly": True,
    }
    assert mount in container["volumeMounts"]
    assert any("epyc-llm-llm-chat-template" in note for note in done.notes)
    text = stdout_text("llm", done)  # the template as a literal block, read back the same
    assert "chat-template.jinja: |" in text
    assert list(yaml.safe_load_all(text))[:-1] == done.objects


def test_a_set_shares_one_chat_template_map(tmp_path: Path) -> None:
    plan, host, _ = template_plan(tmp_path, 'instances = "auto"\n')
    assert plan.decisions.kind == "set"
    done = export_kube(plan, host, shipped_stack(), model_volume="models")
    kinds = [obj["kind"] for obj in done.objects]
    assert kinds == ["ConfigMap", "Deployment", "Service", "PodDisruptionBudget"]
    validate(done.objects)


@pytest.mark.parametrize("broken", ["missing", "folder", "too-large", "not-utf8", "empty"])
def test_an_unreadable_chat_template_is_an_input_error(tmp_path: Path, broken: str) -> None:
    """The file as it is at export: gone, a folder, over a ConfigMap's 1 MiB, not UTF-8 or
    empty is an InputError naming it, the endpoint file, chat_template and the fix."""
    plan, host, template = template_plan(tmp_path, "")
    template.unlink()
    if broken == "folder":
        template.mkdir()
    elif broken == "too-large":
        template.write_bytes(b"x" * (1024 * 1024 + 1))
    elif broken == "not-utf8":
        template.write_bytes(b"\xff\xfe{{ messages }}")
    elif broken == "empty":
        template.write_text("\n")
    with pytest.raises(InputError) as caught:
        export_kube(plan, host, shipped_stack(), model_volume="models")
    error = caught.value
    text = str(error)
    assert str(template) in text and "chat_template" in text, text
    assert plan.decisions.config_file in text and "export again" in text, text


# --- every fake host shape -------------------------------------------------------------


def quantity_gib(value: str) -> int:
    assert value.endswith("Gi"), value
    return int(value.removesuffix("Gi"))


def planned_cores(decisions: EndpointDecisions) -> int:
    """The physical cores the plan pins for one pod's process (a set's largest member)."""
    return max(len(parse_cpulist(server.cpus)) for server in decisions.servers)


def assert_fits_one_node(
    objects: list[dict[str, Any]], host: HostFacts, decisions: EndpointDecisions
) -> None:
    """Guaranteed QoS (requests == limits) with cpu = the plan's N cores x the host's threads
    per core (whole cores under full-pcpus-only), no more logical CPUs and memory than one
    NUMA node has: the single-numa-node Topology Manager can place it."""
    logical = min(len(node.cpus) for node in host.nodes if node.cpus)
    memory = min(node.memory_total_bytes for node in host.nodes if node.cpus) / GIB
    wanted = planned_cores(decisions) * host.threads_per_core
    checked = 0
    for obj in objects:
        if obj["kind"] != "Deployment":
            continue
        for container in obj["spec"]["template"]["spec"]["containers"]:
            requests, limits = container["resources"]["requests"], container["resources"]["limits"]
            assert requests == limits, container["resources"]
            assert requests["cpu"] == str(wanted), (requests, wanted)
            assert wanted <= logical, (wanted, logical)
            assert quantity_gib(requests["memory"]) <= memory, (requests, memory)
            checked += 1
    assert checked, "no Deployment container to check"


def plan_on(tmp: Path, shape: str, text: str) -> tuple[Plan | None, str, HostFacts]:
    tmp.mkdir()
    ws = PlanWorkspace(tmp)
    ws.endpoint("llm", text)
    host = fake_host(tmp, shape)
    result = ws.plan(host)["llm"]
    reason = "; ".join(problem.text for problem in result.errors)
    return result.plan, reason, host


@pytest.mark.parametrize("shape", sorted(CATALOGUE))
def test_guaranteed_and_one_numa_node_on_every_shape(shape: str, tmp_path: Path) -> None:
    """A set of instances = "auto" and one instance, on every catalogue shape the planner
    serves: the set's pods always fit one node; the one instance's too, or the export refuses
    it because the plan spread it over several nodes."""
    refused, exported = [], []
    for kind, text in (("set", 'instances = "auto"\n'), ("one", "")):
        plan, reason, host = plan_on(tmp_path / kind, shape, text)
        if plan is None:
            refused.append(f"{kind}: {reason}")
            continue
        decisions = plan.decisions
        try:
            done = export_kube(plan, host, shipped_stack(), model_volume="models")
        except Refusal as error:
            assert decisions.kind == "cpu" and len(decisions.numa_nodes) > 1, error
            assert 'instances = "auto"' in str(error) and decisions.config_file in str(error)
            continue
        if decisions.instances is not None:
            assert done.objects[0]["spec"]["replicas"] == decisions.instances.count
        assert decisions.kind in ("cpu", "set"), decisions
        assert_fits_one_node(done.objects, host, decisions)
        validate(done.objects)
        exported.append(kind)
    print(shape, "exported:", exported, "planner refused:", refused)
    assert "set" in exported or refused, f"{shape}: the set was neither exported nor refused"
    if len(refused) == 2:  # a host the planner serves on no endpoint: its reason is its CPU
        assert all("not an AMD EPYC CPU" in reason for reason in refused), refused
