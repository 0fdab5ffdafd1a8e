"""How the model reaches vLLM: hub ids through the mounted HF cache, local folders mounted
read-only at their own path, chat templates, tokens, gated and unservable models."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from epycd.host.facts import HostFacts, HostVllmFacts
from epycd.model.check import inspect_model
from epycd.model.facts import ModelFacts
from tests.model.gguf_files import GgufShape, write_gguf
from tests.plan.conftest import PlanWorkspace, cpu, write_model
from tests.secrets import root_folder, write_secret

HostOf = Callable[..., HostFacts]


def hub_from(folder: Path, *, gated: bool | None = False) -> Callable[..., ModelFacts]:
    """The model hub cannot be reached here: facts for a hub id read from a local folder."""

    def inspect(model: str, **kwargs: object) -> ModelFacts:
        template = kwargs.get("chat_template_override")
        assert template is None or isinstance(template, str)
        facts = inspect_model(str(folder), chat_template_override=template)
        return facts.model_copy(update={"model": model, "revision": "c0ffee", "gated": gated})

    return inspect


def test_hub_id_in_a_container_mounts_the_resolved_hf_cache(
    ws: PlanWorkspace, host_of: HostOf, tmp_path: Path
) -> None:
    real = tmp_path / "scratch" / "hf"
    real.mkdir(parents=True)
    link = tmp_path / "hf-link"
    link.symlink_to(real)
    ws.endpoint("qwen", 'model = "Qwen/Qwen3-0.6B"\n')
    plan = cpu(
        ws.plan(
            host_of("genoa-9654-2s-nps1"),
            inspect=hub_from(ws.model),
            environ={"HF_HOME": str(link)},
        )["qwen"].plan
    )
    assert plan.hf_cache is not None and plan.hf_cache.host_path == str(real)
    assert plan.hf_cache.container_path == "/root/.cache/huggingface"
    assert plan.vllm_args[0] == "Qwen/Qwen3-0.6B"
    assert plan.served_model_name == "Qwen/Qwen3-0.6B" and plan.model_revision == "c0ffee"
    assert plan.extra_mounts == []


def test_hf_cache_on_nfs_is_flagged(ws: PlanWorkspace, host_of: HostOf, tmp_path: Path) -> None:
    host = host_of("genoa-9654-2s-nps1")
    cache = tmp_path / "home" / "hf"
    cache.mkdir(parents=True)
    (ws.settings.host_root / "proc").mkdir(exist_ok=True)
    (ws.settings.host_root / "proc" / "mounts").write_text(
        f"/dev/sda1 / ext4 rw 0 0\nfiler:/export/home {tmp_path / 'home'} nfs4 rw,relatime 0 0\n"
    )
    ws.endpoint("qwen", 'model = "Qwen/Qwen3-0.6B"\n')
    plan = cpu(
        ws.plan(host, inspect=hub_from(ws.model), environ={"HF_HOME": str(cache)})["qwen"].plan
    )
    assert plan.hf_cache is not None and plan.hf_cache.on_nfs
    assert any("network filesystem" in w for w in plan.warnings)


def test_hub_id_on_the_host_path_sets_hf_home(ws: PlanWorkspace, host_of: HostOf) -> None:
    ws.endpoint("qwen", 'model = "Qwen/Qwen3-0.6B"\nruntime = "host"\nvllm = "/opt/zen/bin/vllm"\n')

    def zen(executable: str) -> HostVllmFacts:
        return HostVllmFacts(
            path=executable, present=True, version="0.25.1", platform="ZenCpuPlatform"
        )

    plan = cpu(
        ws.plan(host_of("genoa-9654-2s-nps1"), inspect=hub_from(ws.model), probe=zen)["qwen"].plan
    )
    assert plan.env["HF_HOME"] == str(ws.hf_home)


def test_local_folder_in_a_container_is_mounted_read_only_at_its_path(
    ws: PlanWorkspace, host_of: HostOf, tmp_path: Path
) -> None:
    link = tmp_path / "current-model"
    link.symlink_to(ws.model)
    ws.endpoint("local", f'model = "{link}"\n')
    whole_plan = ws.plan(host_of("genoa-9654-2s-nps1"))["local"].plan
    assert whole_plan is not None
    plan = cpu(whole_plan)
    real = os.path.realpath(link)
    assert [(m.host_path, m.container_path, m.read_only) for m in plan.extra_mounts] == [
        (real, real, True)
    ]
    assert plan.vllm_args[0] == real and plan.hf_cache is None
    assert plan.served_model_name == "local"
    assert f"{real}:{real}" in whole_plan.units["epyc-llm-local.container"]


def test_base_model_without_template_serves_completions(
    ws: PlanWorkspace, host_of: HostOf, tmp_path: Path
) -> None:
    base = write_model(tmp_path / "models" / "base", chat=False)
    ws.endpoint("base", f'model = "{base}"\n')
    plan = cpu(ws.plan(host_of("genoa-9654-2s-nps1"))["base"].plan)
    assert plan.primary_endpoint == "completions"


def test_chat_template_file_is_passed_and_mounted(
    ws: PlanWorkspace, host_of: HostOf, tmp_path: Path
) -> None:
    base = write_model(tmp_path / "models" / "base", chat=False)
    template = tmp_path / "chatml.jinja"
    template.write_text("{{ messages }}")
    ws.endpoint("chat", f'model = "{base}"\nchat_template = "{template}"\n')
    plan = cpu(ws.plan(host_of("genoa-9654-2s-nps1"))["chat"].plan)
    assert plan.primary_endpoint == "chat_completions"
    at = plan.vllm_args.index("--chat-template")
    assert plan.vllm_args[at + 1] == str(template)
    assert str(template) in [m.container_path for m in plan.extra_mounts]


def test_a_gguf_file_is_refused_with_vllms_reason(
    ws: PlanWorkspace, host_of: HostOf, tmp_path: Path
) -> None:
    gguf = tmp_path / "models" / "chat-Q8_0.gguf"
    gguf.parent.mkdir(parents=True, exist_ok=True)
    write_gguf(gguf, GgufShape())
    path = ws.endpoint("chat", f'model = "{gguf}"\n')
    result = ws.plan(host_of("genoa-9654-2s-nps1"))["chat"]
    assert result.exit_code == 1 and result.plan is None
    [error] = result.errors
    assert (error.file, error.key) == (str(path), "model")
    assert "loads no GGUF" in error.message


@pytest.fixture
def secrets() -> Iterator[Path]:
    """A folder only root controls: a token file is accepted only in such a folder."""
    with root_folder() as folder:
        yield folder


def test_gated_model_needs_a_token_file(ws: PlanWorkspace, host_of: HostOf, secrets: Path) -> None:
    ws.endpoint("llama", 'model = "meta-llama/Llama-3.2-1B"\n')
    host = host_of("genoa-9654-2s-nps1")
    result = ws.plan(host, inspect=hub_from(ws.model, gated=True))["llama"]
    assert result.exit_code == 1 and result.errors[0].key == "hf_token_file"

    token = write_secret(secrets / "hf-token", "hf_secret_value\n", 0o644)
    ws.endpoint("llama", f'model = "meta-llama/Llama-3.2-1B"\nhf_token_file = "{token}"\n')
    loose = ws.plan(host, inspect=hub_from(ws.model, gated=True))["llama"]
    assert loose.exit_code == 2 and "chmod 600" in (loose.errors[0].fix or "")

    token.chmod(0o600)
    seen: list[object] = []

    def recording(model: str, **kwargs: object) -> ModelFacts:
        seen.append(kwargs["token"])
        return hub_from(ws.model, gated=True)(model, **kwargs)

    whole_plan = ws.plan(host, inspect=recording)["llama"].plan
    assert whole_plan is not None
    plan = cpu(whole_plan)
    assert seen == ["hf_secret_value"]
    assert plan.hf_token_file == str(token)
    for text in whole_plan.units.values():
        assert "hf_secret_value" not in text
    assert "hf_secret_value" not in whole_plan.model_dump_json()


def test_unknown_gating_of_a_gated_family_warns(ws: PlanWorkspace, host_of: HostOf) -> None:
    ws.endpoint("llama", 'model = "meta-llama/Llama-3.2-1B"\n')
    plan = cpu(
        ws.plan(host_of("genoa-9654-2s-nps1"), inspect=hub_from(ws.model, gated=None))["llama"].plan
    )
    assert any("Llama" in w for w in plan.warnings)


def test_a_token_file_holding_an_assignment_is_refused(
    ws: PlanWorkspace, host_of: HostOf, secrets: Path
) -> None:
    """vLLM reads the whole file as the token (HF_TOKEN_PATH): `HF_TOKEN=...` would be sent
    as the token. Refused with the fix, and the secret is not echoed."""
    token = secrets / "hf-token"
    ws.endpoint("llama", f'model = "meta-llama/Llama-3.2-1B"\nhf_token_file = "{token}"\n')
    host = host_of("genoa-9654-2s-nps1")
    for text in ("HF_TOKEN=hf_secret_value\n", 'export HF_TOKEN="hf_secret_value"\n'):
        token.write_text(text)
        token.chmod(0o600)
        result = ws.plan(host, inspect=hub_from(ws.model, gated=True))["llama"]
        assert result.exit_code == 2 and result.plan is None
        [error] = result.errors
        assert error.key == "hf_token_file" and "only the token" in (error.fix or "")
        assert "hf_secret_value" not in str(error)
    token.write_text("  hf_secret_value\n")
    assert ws.plan(host, inspect=hub_from(ws.model, gated=True))["llama"].plan is not None
