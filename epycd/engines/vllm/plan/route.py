"""Which runtime runs an endpoint, and which backend and image (docs/sources.md, "Routing by
CPU and stack").

Routing by the CPU: not an EPYC is refused; no AVX-512 BF16 gets the stock vLLM CPU path
with consent; AVX-512 BF16 outside Genoa/Turin/Venice gets unvalidated zentorch (or stock)
with consent; Genoa/Turin/Venice get the validated zentorch stack. Then the stack gate on
what will really run: a probed host vLLM running stock `CpuPlatform` on a zentorch-capable
host is the stock path with consent (zentorch off, and how to get it), and Venice off the
pinned vLLM needs consent. A host vLLM elsewhere is warned about only when it is none of the
validated vLLM + zentorch pairs (`Stack.validated_stacks`: the recipe's image, the embedded
runtime); the warning names them.

An Instinct GPU endpoint (docs/instinct.md) runs the ROCm vLLM image in podman or docker
(`gpu_route`); a model the recipe data lists as no LLM endpoint is refused before anything
is fetched (`refuse_not_llm`).

vLLM's route (`VllmRoute`) subclasses every engine's `EngineRoute` (`epycd.plan.route`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypedDict

from epycd.engines.vllm.plan.model import Backend
from epycd.errors import InputError, Refusal
from epycd.host.facts import (
    DockerFacts,
    HostFacts,
    HostVllmFacts,
    PodmanFacts,
)
from epycd.model.instinct import floats, recipe_for, shipped_gpus, shipped_recipes
from epycd.plan.isa import avx2_vllm_warning, instruction_set
from epycd.plan.model import Runtime
from epycd.plan.route import EngineRoute, container_runtime, refuse_non_epyc
from epycd.spec import EndpointSpec
from epycd.stack import Stack, qualified_image, release

RUNTIME_FIX = (
    "install podman >= 4.4 (Quadlet) or docker, or set vllm = the vllm executable of a "
    'venv/conda env and runtime = "host"'
)


class VllmRoute(EngineRoute):
    """A vLLM endpoint's route: its backend, and its image or host vLLM."""

    backend: Backend
    image: str | None
    image_entrypoint_is_vllm_serve: bool = False
    vllm_executable: str | None = None
    vllm_version: str

    def json_keys(self) -> dict[str, Any]:
        return super().json_keys() | {
            "backend": self.backend,
            "image": self.image,
            "vllm_executable": self.vllm_executable,
            "vllm_version": self.vllm_version,
        }

    def path_row(self) -> tuple[str, str]:
        where = self.image or self.vllm_executable
        return ("Backend / path", f"{self.backend}, {self.runtime} ({where})")


def _refuse_unusable_podman(podman: PodmanFacts, file: Path) -> None:
    if not podman.present:
        raise Refusal("podman is not installed", file=file, key="runtime", fix=RUNTIME_FIX)
    if not podman.quadlet:
        raise Refusal(
            f"podman {podman.version or '(unknown version)'} has no Quadlet (needs >= 4.4)",
            file=file,
            key="runtime",
            fix=RUNTIME_FIX,
        )


def _refuse_unusable_docker(docker: DockerFacts, file: Path) -> None:
    if not docker.present:
        raise Refusal("docker is not installed", file=file, key="runtime", fix=RUNTIME_FIX)
    if not docker.daemon_reachable:
        raise Refusal(
            "the docker daemon does not answer",
            file=file,
            key="runtime",
            fix="start docker (systemctl start docker), or " + RUNTIME_FIX,
        )


def _refuse_unusable_host_vllm(
    spec: EndpointSpec, host_vllm: HostVllmFacts | None, file: Path
) -> None:
    """Refused (1) when the host has no usable vLLM of its own; bad input (2) when the
    endpoint file's `vllm` key names one that is missing or cannot import vllm."""
    wanted = spec.runtime
    if host_vllm is None:
        raise Refusal(
            "no container runtime and no host vLLM" if wanted == "auto" else "no vllm given",
            file=file,
            key="vllm" if wanted == "host" else "runtime",
            fix=RUNTIME_FIX,
        )
    if not host_vllm.present:
        error = InputError if spec.vllm else Refusal
        raise error(
            f"the host vLLM {host_vllm.path} cannot be used: {host_vllm.error}",
            file=file,
            key="vllm",
            fix="point vllm at the vllm executable of a working venv/conda env",
        )


def choose_runtime(
    spec: EndpointSpec, host: HostFacts, file: Path, host_vllm: HostVllmFacts | None
) -> tuple[Runtime, list[str]]:
    """auto: podman with Quadlet, else a reachable docker, else a host vLLM."""
    podman, docker = host.runtimes.podman, host.runtimes.docker
    wanted = spec.runtime
    auto = container_runtime(host.runtimes) if wanted == "auto" else None
    notes: list[str] = []
    if wanted == "podman" or auto == "podman":
        _refuse_unusable_podman(podman, file)
        return "podman", notes
    if podman.present and not podman.quadlet:
        notes.append(f"podman {podman.version} has no Quadlet (needs >= 4.4): not used")
    if wanted == "docker" or auto == "docker":
        _refuse_unusable_docker(docker, file)
        return "docker", notes
    if docker.present and not docker.daemon_reachable:
        notes.append("docker is installed but its daemon does not answer: not used")
    if wanted in ("host", "auto"):
        _refuse_unusable_host_vllm(spec, host_vllm, file)
        return "host", notes
    raise InputError(f"unknown runtime {wanted!r}", file=file, key="runtime")


def _cpu_route(host: HostFacts, stack: Stack) -> tuple[Backend, list[str]]:
    """The backend the CPU allows, and the consent it needs."""
    generation = f"{host.epyc_generation} ({host.zen_arch or 'unknown Zen'})"
    if not host.avx512_bf16:
        return "stock", [
            f"{generation} has no AVX-512 BF16: zentorch cannot run; the stock vLLM CPU "
            f"path (no zentorch acceleration, slower; verified on {stack.stock_image.verified_on})"
            " needs your consent"
        ]
    if host.epyc_generation not in stack.validated_generations:
        return "zentorch", [
            f"zentorch is not validated on {generation}: running it needs your consent "
            "(or choose the stock vLLM CPU image)"
        ]
    return "zentorch", []


def _given_image_backend(
    image: str, backend: Backend, reasons: list[str], host: HostFacts, stack: Stack, file: Path
) -> tuple[Backend, list[str]]:
    """The backend an image the endpoint file names runs, and the consent it needs: the
    stock vLLM image is refused on a supported EPYC; the validated zentorch image is refused
    where zentorch cannot run; an image the product does not know runs vLLM's stock platform
    where zentorch cannot run, unvalidated (consent), else the zentorch path it asks for."""
    if stack.is_stock_image(image):
        if host.is_supported_epyc:
            raise Refusal(
                f"the stock vLLM image {image} runs vLLM's plain CpuPlatform on a "
                f"{host.epyc_generation}: zentorch acceleration would be off (blocked)",
                file=file,
                key="image",
                fix=f"remove image to use the validated stack {stack.image}",
            )
        if backend == "zentorch":
            reasons = [
                f"the stock vLLM CPU path on {host.epyc_generation} (no zentorch) needs your "
                "consent"
            ]
        return "stock", reasons
    if backend == "stock":
        if image == stack.image:
            raise Refusal(
                f"the validated image {image} is built for zentorch, which cannot run "
                f"without AVX-512 BF16 ({host.epyc_generation} has none)",
                file=file,
                key="image",
                fix=f"remove image to use the stock vLLM CPU image {stack.stock_image_pinned}",
            )
        return "stock", [*reasons, _own_image_without_bf16(image, host, stack)]
    if image != stack.image:
        reasons = [*reasons, f"image {image} is not the validated image {stack.image}"]
    return backend, reasons


def _own_image_without_bf16(image: str, host: HostFacts, stack: Stack) -> str:
    """Why an image the product does not know needs consent on a CPU without AVX-512 BF16:
    an admin's own vLLM CPU build is a normal thing to run there, but nothing vouches for
    it, and any zentorch inside it stays off."""
    return (
        f"image {image} is not one the product knows (validated: {stack.image}; stock: "
        f"{stack.stock_image_pinned}): on {host.epyc_generation} without AVX-512 BF16 any "
        "zentorch in it cannot run and vLLM runs its stock CpuPlatform; serving an "
        "unvalidated image needs your consent"
    )


def _container_route(
    spec: EndpointSpec, host: HostFacts, stack: Stack, runtime: Runtime, file: Path
) -> VllmRoute:
    backend, reasons = _cpu_route(host, stack)
    warnings: list[str] = []
    image = qualified_image(spec.image) if spec.image else None
    if image is None:
        image = stack.image if backend == "zentorch" else stack.stock_image_pinned
    else:
        backend, reasons = _given_image_backend(image, backend, reasons, host, stack, file)
    stock = backend == "stock"
    if stock and image != stack.stock_image_pinned:
        warnings.append(f"image {image} is not pinned to vLLM {stack.vllm_version}")
    return VllmRoute(
        backend=backend,
        runtime=runtime,
        image=image,
        # the stock image's entrypoint is `vllm serve`; any other image (the validated one,
        # an admin's own on either path) is given `vllm serve` as its command
        image_entrypoint_is_vllm_serve=(
            stack.stock_image.entrypoint_is_vllm_serve
            if stack.is_stock_image(image)
            else stack.image_entrypoint_is_vllm_serve
        ),
        vllm_version=stack.vllm_version,
        confirmation_reasons=reasons,
        warnings=warnings,
    )


def stock_host_vllm_consent(
    host: HostFacts, stack: Stack, vllm: HostVllmFacts, platform: str
) -> str:
    """Why a host vLLM on vLLM's plain platform needs consent on a zentorch-capable EPYC,
    what it costs and how to get zentorch instead: an admin may choose it on purpose."""
    return (
        f"the host vLLM {vllm.path} runs {platform}, not the Zen platform: zentorch "
        f"acceleration is off on this {host.epyc_generation} (AMD reports the zentorch path "
        "faster for bf16 matrix work); serving on the stock path needs your consent. To get "
        f"zentorch: install zentorch {stack.zentorch_version} (or the build matching the env's "
        f"torch) into that env, or use the validated image {stack.image}"
    )


def unvalidated_host_vllm(stack: Stack, vllm: HostVllmFacts, zen_active: bool) -> str | None:
    """Why a host vLLM (a venv, conda env or the embedded runtime) off the validated pairs
    warrants a warning, or None when it is one of them. The zentorch of a pair counts where
    the Zen platform is active; a probe that did not say which zentorch it has (one cached
    before the probe asked) is judged by the image's pin alone, as before."""
    version = vllm.version or "unknown"
    if zen_active and vllm.zentorch_version is None:
        if release(version) == stack.vllm_version:
            return None
        return f"host vLLM {version} is not the pinned vLLM {stack.vllm_version}"
    zentorch = vllm.zentorch_version if zen_active else None
    if stack.validated_stack(version, zentorch) is not None:
        return None
    running = f"host vLLM {version}" + (f" with zentorch {zentorch}" if zentorch else "")
    return f"{running} is not a validated stack; validated: {stack.validated_text()}"


def _host_route(host: HostFacts, stack: Stack, vllm: HostVllmFacts, file: Path) -> VllmRoute:
    cpu_backend, reasons = _cpu_route(host, stack)
    platform = vllm.platform or "unknown platform"
    zen_active = stack.zen_platform_marker in platform
    warnings: list[str] = []
    backend: Backend = "zentorch" if zen_active and cpu_backend == "zentorch" else "stock"
    if backend == "stock" and cpu_backend == "zentorch":
        reasons = [stock_host_vllm_consent(host, stack, vllm, platform)]
    version = vllm.version or "unknown"
    if host.epyc_generation == "Venice":
        if release(version) != stack.vllm_version:
            text = f"host vLLM {version} is not the pinned vLLM {stack.vllm_version}"
            reasons = [*reasons, f"{text}: not validated on Venice; the pinned image is advised"]
    else:
        warning = unvalidated_host_vllm(stack, vllm, zen_active)
        if warning is not None:
            warnings.append(warning)
    return VllmRoute(
        backend=backend,
        runtime="host",
        image=None,
        vllm_executable=vllm.path,
        vllm_version=version,
        confirmation_reasons=reasons,
        warnings=warnings,
    )


def route_endpoint(
    spec: EndpointSpec,
    host: HostFacts,
    stack: Stack,
    file: Path,
    host_vllm: HostVllmFacts | None,
) -> VllmRoute:
    """Runtime, backend, image and the consent they need; raises `Refusal` when refused."""
    refuse_non_epyc(host)
    runtime, notes = choose_runtime(spec, host, file, host_vllm)
    if runtime == "host":
        assert host_vllm is not None
        route = _host_route(host, stack, host_vllm, file)
    else:
        route = _container_route(spec, host, stack, runtime, file)
        if host.epyc_generation == "Venice" and route.image != stack.image:
            route.confirmation_reasons.append(
                f"Venice is validated with vLLM {stack.vllm_version} only ({stack.image})"
            )
    route.warnings[:0] = notes
    if instruction_set(host) == "avx2":
        route.warnings.append(avx2_vllm_warning(host))
    return route


def refuse_not_llm(model: str, file: Path) -> None:
    """The recipe's list of models that are not LLM endpoints: the reason and an alternative."""
    entry = shipped_gpus().not_llm_endpoints.get(model)
    if entry is not None:
        raise Refusal(
            f"{model} is not an LLM endpoint: {entry.reason}",
            file=file,
            key="model",
            fix=entry.alternative,
        )


def gpu_route(spec: EndpointSpec, host: HostFacts, stack: Stack, file: Path) -> VllmRoute:
    """podman with Quadlet or a reachable docker (auto takes them in that order), the image
    of the file, else the model's recipe, else the recipe data's ROCm vLLM image."""
    runtime = container_runtime(host.runtimes) if spec.runtime == "auto" else spec.runtime
    ready = {
        "podman": host.runtimes.podman.quadlet,
        "docker": host.runtimes.docker.daemon_reachable,
    }
    if runtime not in ready or not ready[runtime]:
        raise Refusal(
            "an Instinct endpoint runs in a container: "
            + (f"{runtime} is not usable here" if runtime else "no podman with Quadlet, no docker"),
            file=file,
            key="runtime",
            fix=RUNTIME_FIX,
        )
    recipes = shipped_recipes()
    found = recipe_for(spec.model or stack.default_model, recipes)
    image = spec.image or (found[1].docker_image if found else None) or recipes.docker_image
    warnings = []
    if floats(image):
        warnings.append(
            f"{image} is not pinned: approve pulls it once and records its digest; later "
            "starts keep that image, a later pull may change it"
        )
    return VllmRoute(
        backend="rocm",
        runtime=runtime,
        image=image,
        image_entrypoint_is_vllm_serve=True,
        vllm_version=stack.vllm_version,
        warnings=warnings,
    )


class VllmRouteFields(TypedDict):
    """Which vLLM build serves a vLLM endpoint, from its route (`vllm_route_fields`)."""

    image: str | None
    image_entrypoint_is_vllm_serve: bool
    vllm_version: str


def vllm_route_fields(route: VllmRoute) -> VllmRouteFields:
    return VllmRouteFields(
        image=route.image,
        image_entrypoint_is_vllm_serve=route.image_entrypoint_is_vllm_serve,
        vllm_version=route.vllm_version,
    )
