"""Every architecture of a sample of the pinned llama.cpp's (16 the measured formulas do not
cover, tests/llama/tiny_architectures.py) plans as a llama.cpp endpoint with this machine's
llama-server: none is refused for want of a measurement; the plan's terms are llama.cpp's own
(its pass at the same words: KV and compute as it printed them, raised by its 1 MiB
resolution), the weights the file's tensors. With the published Gemma (gemma3,
test_published_gemma.py) and the four the formulas cover (llama, qwen2, qwen3, bert:
test_fit_params.py), 21 architectures."""

from __future__ import annotations

from pathlib import Path

import pytest

from epycd.engines.llama_cpp.model.gguf import read_gguf
from epycd.engines.llama_cpp.model.memory import UnmeasuredModel, llama_memory
from epycd.engines.llama_cpp.plan.fit import RESOLUTION_BYTES, llama_server_memory
from tests.health.realvllm import free_port
from tests.llama.planned import planned_with_real_llama
from tests.llama.realllama import llama_server
from tests.llama.test_fit_params import server_words
from tests.llama.tiny_architectures import ARCHITECTURES, write_tiny
from tests.machine import real_cpu

pytestmark = pytest.mark.llama


def test_the_sample_is_a_dozen_and_more() -> None:
    assert len(ARCHITECTURES) >= 12


@pytest.mark.parametrize("name", sorted(ARCHITECTURES))
def test_each_architecture_plans_from_llama_cpps_own_pass(tmp_path: Path, name: str) -> None:
    model = write_tiny(name, tmp_path / f"tiny-{name}.gguf")
    gguf = read_gguf(model)
    assert gguf.architecture == name
    with pytest.raises(UnmeasuredModel):  # the formulas do not cover it
        llama_memory(gguf, context=1024, slots=1, cpu_flags=real_cpu().flags, shared_pool=True)

    data = planned_with_real_llama(tmp_path, "tiny", model)
    assert data["memory"]["fits"] is True
    memory = data["memory"]["memory"]
    assert memory["weights_bytes"] == gguf.tensors_bytes
    words = server_words(model, memory["cells"], memory["slots"], memory["ubatch"], free_port())
    told = llama_server_memory(str(llama_server()), model, words)
    assert memory["kv_bytes"] == told.context_bytes + RESOLUTION_BYTES
    assert memory["compute_bytes"] == told.compute_bytes + RESOLUTION_BYTES
    assert told.context_bytes > 0 and told.compute_bytes > 0
