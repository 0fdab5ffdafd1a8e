"""`engine = "auto"` (docs/tuning.md rule 12) and a safetensors model served by llama.cpp
through its conversion (docs/conversion.md), in the real planner: which engine each profile
gets and why, the engines passed over with their reasons, the conversion approve must make
first, the converted file bound to the plan by its hash. The llama-server is an executable
that answers `--version` as it does; the converted file is a GGUF written here with its
record. The real conversion is tests/llama/test_convert.py's; approve's is
tests/llama/test_approve_converted.py's."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import get_args

import pytest

from epycd.cli.plan import confirmation_table, plan_json
from epycd.engines.llama_cpp.approval import prerequisite_token
from epycd.engines.llama_cpp.model.format import pinned_version
from epycd.engines.llama_cpp.model.source import read_converted_source
from epycd.engines.llama_cpp.plan.converted import (
    ConvertedRecord,
    converted_path,
    record_path,
    write_refused,
)
from epycd.engines.llama_cpp.plan.model import LlamaServer
from epycd.engines.llama_cpp.plan.planner import DEFAULT_WEIGHTS_NOTE
from epycd.host.facts import HostFacts
from epycd.plan.isa import InstructionSet
from epycd.plan.pipeline.choose import POOLING, PREFERRED, WHY, engine_order
from epycd.plan.pipeline.result import EndpointResult
from epycd.plan.tuning import Profile
from tests.model.gguf_files import GgufShape, write_gguf
from tests.model.models import BGE_SMALL_EN_V1_5
from tests.plan.conftest import PlanWorkspace, write_model
from tests.plan.test_llama_plan import fake_llama_server, gguf_model
from tests.secrets import root_folder, write_secret


class AutoWorkspace:
    """A plan workspace with a built llama.cpp runtime and the converter's Python."""

    def __init__(self, ws: PlanWorkspace, host: HostFacts) -> None:
        self.ws, self.host = ws, host
        self.runtime = ws.tmp / "llama-runtime"
        fake_llama_server(self.runtime / "bin")
        (self.runtime / ".epyc-stamp").write_text("llama-cpp-python==0.3.36\n")
        converter = self.runtime / "converter"  # as the recipe installs it (not run to plan)
        converter.mkdir()
        (converter / "convert_hf_to_gguf.py").write_text("")
        self.vllm_runtime = ws.tmp / "vllm-runtime"
        (self.vllm_runtime / "bin").mkdir(parents=True)
        (self.vllm_runtime / "bin" / "python").symlink_to(sys.executable)
        self.converted = ws.tmp / "converted"
        ws.settings = ws.settings.model_copy(
            update={
                "llama_runtime_dir": self.runtime,
                "runtime_dir": self.vllm_runtime,
                "llama_converted_dir": self.converted,
            }
        )

    def plan(self) -> dict[str, EndpointResult]:
        return self.ws.plan(self.host)

    def convert(
        self, quantize: str = "q8_0", model: Path | None = None, extra: dict[str, int] | None = None
    ) -> Path:
        """The converted file and its record, as approve leaves them; `extra`: more of the
        file's metadata (an embedder's pooling type)."""
        source = model or self.ws.model
        gguf = converted_path(self.converted, str(source), None, quantize)  # type: ignore[arg-type]
        gguf.parent.mkdir(parents=True, exist_ok=True)
        write_gguf(
            gguf,
            GgufShape(layers=2, embedding=128, heads=4, kv_heads=2, feed_forward=512, vocab=300,
                      extra=extra or {}),
        )  # fmt: skip
        stat = gguf.stat()
        record = ConvertedRecord(
            source=str(source),
            source_revision=None,
            quantize=quantize,
            sha256=hashlib.sha256(gguf.read_bytes()).hexdigest(),
            bytes=stat.st_size,
            mtime_ns=stat.st_mtime_ns,
            llama_cpp="0.3.36",
            converted_from=read_converted_source(str(source), source, None),
        )
        record_path(gguf).write_text(record.model_dump_json())
        return gguf


@pytest.fixture
def aw(ws: PlanWorkspace, host_of: Callable[..., HostFacts]) -> AutoWorkspace:
    return AutoWorkspace(ws, host_of("genoa-9654-2s-nps1"))


def test_balanced_waits_for_its_conversion_and_names_it(aw: AutoWorkspace) -> None:
    aw.ws.endpoint("chat", 'engine = "auto"\n')
    result = aw.plan()["chat"]
    assert result.plan is None and result.prerequisite is not None
    first = result.prerequisite
    assert (first.engine, first.model, first.quantize) == ("llama.cpp", str(aw.ws.model), "q8_0")
    assert first.output == str(converted_path(aw.converted, str(aw.ws.model), None, "q8_0"))
    text = result.errors[0].text
    assert 'engine = "auto" chose llama.cpp: profile balanced' in text
    assert "epycctl approve chat converts it first" in text
    assert plan_json(result)["prerequisite"]["output"] == first.output
    assert "Approve first" in confirmation_table(result, aw.host)
    assert not aw.converted.exists(), "planning converts nothing"


def test_balanced_serves_the_converted_file_with_llama_cpp(aw: AutoWorkspace) -> None:
    gguf = aw.convert()
    aw.ws.endpoint("chat", 'engine = "auto"\n')
    result = aw.plan()["chat"]
    assert result.plan is not None, [e.text for e in result.errors]
    decided = result.plan.decisions
    server = decided.first
    assert isinstance(server, LlamaServer) and decided.engine == "llama.cpp"
    assert server.invocation.model_path == os.path.realpath(gguf)
    assert decided.model == str(aw.ws.model), "the endpoint serves the model the file names"
    choice = decided.engine_choice
    assert choice is not None and choice.asked == "auto"
    assert choice.reasons[0].startswith("llama.cpp: profile balanced")
    assert choice.converted is not None and choice.converted.quantize == "q8_0"
    assert choice.reasons[-1] == DEFAULT_WEIGHTS_NOTE, "the default's trade, told"
    record = json.loads(record_path(gguf).read_text())
    assert choice.converted.sha256 == record["sha256"]
    data = plan_json(result)
    assert data["engine"] == "llama.cpp" and data["engine_choice"]["asked"] == "auto"
    assert data["prerequisite"] is None
    table = confirmation_table(result, aw.host)
    assert 'llama.cpp (engine = "auto")' in table and "sha256" in table


def test_another_converted_file_is_another_plan(aw: AutoWorkspace) -> None:
    gguf = aw.convert()
    aw.ws.endpoint("chat", 'engine = "auto"\n')
    before = aw.plan()["chat"].plan
    assert before is not None
    data = bytearray(gguf.read_bytes())
    aw.convert()  # converted again: the same bytes, the same hash, the same plan
    again = aw.plan()["chat"].plan
    assert again is not None and again.fingerprint == before.fingerprint
    gguf.write_bytes(bytes(data) + b"\0" * 32)  # the file changed since its record
    changed = aw.plan()["chat"]
    assert changed.plan is None and changed.prerequisite is not None


def test_throughput_is_served_by_vllm(aw: AutoWorkspace) -> None:
    aw.ws.endpoint("batch", 'engine = "auto"\nprofile = "throughput"\n')
    result = aw.plan()["batch"]
    assert result.plan is not None, [e.text for e in result.errors]
    decided = result.plan.decisions
    assert decided.engine == "vllm" and decided.engine_choice is not None
    assert decided.engine_choice.reasons[0].startswith("vllm: profile throughput")
    assert plan_json(result)["vllm_args"]
    assert not aw.converted.exists()


def test_without_llama_cpp_balanced_is_served_by_vllm_and_says_why(
    ws: PlanWorkspace, host_of: Callable[..., HostFacts]
) -> None:
    ws.settings = ws.settings.model_copy(update={"llama_runtime_dir": ws.tmp / "none"})
    ws.endpoint("chat", 'engine = "auto"\n')
    result = ws.plan(host_of("genoa-9654-2s-nps1"))["chat"]
    assert result.plan is not None, [e.text for e in result.errors]
    choice = result.plan.decisions.engine_choice
    assert result.plan.decisions.engine == "vllm" and choice is not None
    assert choice.reasons[0].startswith("vllm: profile balanced")
    assert any(r.startswith("not llama.cpp: no llama-server") for r in choice.reasons)


def test_a_runtime_without_its_converter_leaves_balanced_to_vllm(aw: AutoWorkspace) -> None:
    """A llama.cpp runtime built before its recipe installed the converter: auto serves the
    safetensors model with vLLM and names the recipe to run again."""
    shutil.rmtree(aw.runtime / "converter")
    aw.ws.endpoint("chat", 'engine = "auto"\n')
    result = aw.plan()["chat"]
    assert result.plan is not None and result.prerequisite is None
    choice = result.plan.decisions.engine_choice
    assert result.plan.decisions.engine == "vllm" and choice is not None
    why = next(r for r in choice.reasons if r.startswith("not llama.cpp:"))
    assert "needs llama.cpp's converter" in why and "install.sh --engine llama.cpp" in why, why


def test_a_gguf_model_goes_to_llama_cpp_whatever_the_profile(aw: AutoWorkspace) -> None:
    gguf = gguf_model(aw.ws.tmp)
    aw.ws.endpoint("g", f'engine = "auto"\nprofile = "throughput"\nmodel = "{gguf}"\n')
    result = aw.plan()["g"]
    assert result.plan is not None, [e.text for e in result.errors]
    choice = result.plan.decisions.engine_choice
    assert result.plan.decisions.engine == "llama.cpp" and choice is not None
    assert choice.reasons[0].startswith("llama.cpp: profile throughput")
    assert any(r.startswith("not vllm:") for r in choice.reasons)
    assert choice.converted is None


def test_an_explicit_llama_cpp_endpoint_of_a_safetensors_model_is_converted(
    aw: AutoWorkspace,
) -> None:
    aw.ws.endpoint("l", 'engine = "llama.cpp"\nquantize = "q4_k_m"\n')
    waiting = aw.plan()["l"]
    assert waiting.prerequisite is not None and waiting.prerequisite.quantize == "q4_k_m"
    assert waiting.prerequisite.output.endswith("-Q4_K_M.gguf")
    aw.convert("q4_k_m")
    result = aw.plan()["l"]
    assert result.plan is not None, [e.text for e in result.errors]
    choice = result.plan.decisions.engine_choice
    assert choice is not None and choice.asked == "llama.cpp" and choice.converted is not None


def test_an_architecture_the_converter_lacks_is_refused_for_llama_cpp(aw: AutoWorkspace) -> None:
    config = json.loads((aw.ws.model / "config.json").read_text())
    (aw.ws.model / "config.json").write_text(json.dumps({**config, "architectures": ["NoSuchLM"]}))
    aw.ws.endpoint("l", 'engine = "llama.cpp"\n')
    result = aw.plan()["l"]
    assert result.prerequisite is None
    assert "does not take the architecture NoSuchLM" in result.errors[0].text
    assert 'serve it with engine = "vllm"' in result.errors[0].text


def test_one_endpoint_waiting_for_its_conversion_stops_no_other(aw: AutoWorkspace) -> None:
    aw.ws.endpoint("chat", 'engine = "auto"\n')
    aw.ws.endpoint("other", 'engine = "vllm"\n')
    results = aw.plan()
    assert results["chat"].prerequisite is not None
    assert results["other"].plan is not None, [e.text for e in results["other"].errors]


@pytest.mark.parametrize(
    ("text", "key", "fix"),
    [
        ('engine = "vllm"\nquantize = "q8_0"\n', "quantize", "remove quantize"),
        ('engine = "auto"\ndtype = "float32"\n', "dtype", 'set engine = "vllm"'),
        ('engine = "auto"\nquantize = "q5"\n', "quantize", "q4_k_m"),
    ],
)
def test_keys_auto_does_not_take_are_refused_with_the_fix(
    aw: AutoWorkspace, text: str, key: str, fix: str
) -> None:
    aw.ws.endpoint("bad", text)
    errors = [e.text for e in aw.plan()["bad"].errors]
    assert any(key in e and fix in e for e in errors), errors


def test_quantize_asks_for_llama_cpp_whatever_the_profile(aw: AutoWorkspace) -> None:
    """`quantize` is read by llama.cpp alone: a throughput file that sets it is served on
    those weights, not by vLLM on the weights as they are."""
    aw.ws.endpoint("batch", 'engine = "auto"\nprofile = "throughput"\nquantize = "q4_k_m"\n')
    waiting = aw.plan()["batch"]
    assert waiting.prerequisite is not None and waiting.prerequisite.quantize == "q4_k_m"
    aw.convert("q4_k_m")
    result = aw.plan()["batch"]
    assert result.plan is not None, [e.text for e in result.errors]
    choice = result.plan.decisions.engine_choice
    assert result.plan.decisions.engine == "llama.cpp" and choice is not None
    assert choice.reasons[0] == "llama.cpp: the file sets quantize, which llama.cpp reads"
    assert DEFAULT_WEIGHTS_NOTE not in choice.reasons, "the admin chose the weights"


def test_quantize_without_llama_cpp_says_vllm_does_not_read_it(
    ws: PlanWorkspace, host_of: Callable[..., HostFacts]
) -> None:
    ws.settings = ws.settings.model_copy(update={"llama_runtime_dir": ws.tmp / "none"})
    ws.endpoint("chat", 'engine = "auto"\nquantize = "q4_k_m"\n')
    result = ws.plan(host_of("genoa-9654-2s-nps1"))["chat"]
    assert result.plan is not None, [e.text for e in result.errors]
    choice = result.plan.decisions.engine_choice
    assert result.plan.decisions.engine == "vllm" and choice is not None
    assert choice.reasons[0].startswith("vllm: profile balanced")
    assert choice.reasons[0].endswith("(it does not read quantize)")


def test_a_model_the_converter_refused_is_passed_over_until_llama_cpp_changes(
    aw: AutoWorkspace,
) -> None:
    """approve records the converter's lasting failure beside the file it would have
    written; the planner reads it for that llama.cpp version only."""
    aw.ws.endpoint("chat", 'engine = "auto"\n')
    aw.ws.endpoint("named", 'engine = "llama.cpp"\n')
    waiting = aw.plan()["chat"]
    assert waiting.prerequisite is not None
    gguf = Path(waiting.prerequisite.output)
    refused = write_refused(
        gguf, str(aw.ws.model), None, "q8_0", pinned_version(), "tokenizer unknown"
    )
    planned = aw.plan()
    chat = planned["chat"]
    assert chat.plan is not None and chat.prerequisite is None
    assert chat.plan.decisions.engine == "vllm"
    assert chat.plan.decisions.engine_choice is not None
    why = next(r for r in chat.plan.decisions.engine_choice.reasons if r.startswith("not llama"))
    assert "tokenizer unknown" in why and str(refused) in why
    named = planned["named"]
    assert named.plan is None and "converter failed on" in named.errors[0].text
    record = json.loads(refused.read_text())
    refused.write_text(json.dumps({**record, "llama_cpp": "0.0.1"}))
    assert aw.plan()["chat"].prerequisite is not None


def test_the_token_file_goes_with_the_conversion_not_the_token(aw: AutoWorkspace) -> None:
    """approve's download of a gated model uses the endpoint's token, read from its
    root-only file when the conversion runs."""
    with root_folder() as folder:
        token = write_secret(folder / "secrets" / "hf.token", "hf_secretsecret\n")
        aw.ws.endpoint("chat", f'engine = "auto"\nhf_token_file = "{token}"\n')
        waiting = aw.plan()["chat"]
        assert waiting.prerequisite is not None, [e.text for e in waiting.errors]
        assert waiting.prerequisite.hf_token_file == str(token)
        assert "hf_secretsecret" not in waiting.prerequisite.model_dump_json()
        assert prerequisite_token(waiting.prerequisite, aw.ws.settings) == "hf_secretsecret"


def test_each_engine_is_tried_once_in_the_profile_order() -> None:
    """Every engine once: the last one's error is the one an endpoint no engine can serve
    is refused with (quickstart's hint for a model it cannot fetch reads vLLM's)."""
    assert engine_order("balanced") == ("llama.cpp", "vllm")
    assert engine_order("throughput") == ("vllm", "llama.cpp")
    assert engine_order("throughput", ("llama.cpp",)) == ("llama.cpp", "vllm")
    assert engine_order("latency", ("vllm",)) == ("vllm", "llama.cpp")


def test_an_embedder_under_latency_goes_to_llama_cpp(aw: AutoWorkspace) -> None:
    """One user at a time: llama.cpp answered a published embedder as fast as vLLM, started
    in a fraction of the time and memory. Approve converts it; once converted, llama.cpp
    serves it as an embedder with the pooling rule's reason."""
    embedder = write_model(aw.ws.tmp / "models" / "bge-small", BGE_SMALL_EN_V1_5, chat=False)
    aw.ws.endpoint("emb", f'engine = "auto"\nprofile = "latency"\nmodel = "{embedder}"\n')
    waiting = aw.plan()["emb"]
    assert waiting.plan is None and waiting.prerequisite is not None, waiting.errors
    assert waiting.prerequisite.engine == "llama.cpp"
    assert "chose llama.cpp: an embedder or reranker, profile latency" in waiting.errors[0].text
    aw.convert(model=embedder, extra={"{arch}.pooling_type": 1})
    result = aw.plan()["emb"]
    assert result.plan is not None, [e.text for e in result.errors]
    decided = result.plan.decisions
    assert decided.engine == "llama.cpp" and decided.primary_endpoint == "embeddings"
    assert decided.engine_choice is not None
    assert decided.engine_choice.reasons[0].startswith(
        "llama.cpp: an embedder or reranker, profile latency"
    )
    assert DEFAULT_WEIGHTS_NOTE not in decided.engine_choice.reasons, "an encoder's weights"


@pytest.mark.parametrize("profile", ["balanced", "throughput"])
def test_an_embedder_for_several_users_goes_to_vllm_without_a_conversion(
    aw: AutoWorkspace, profile: str
) -> None:
    """Several users at once: vLLM batched a published embedder's inputs into one step,
    1.4-1.5x llama.cpp's requests/s. balanced reads the model with llama.cpp first, whose
    conversion it would wait for; the source says it is an embedder, so vLLM serves it at
    once, and nothing is converted. A converted file left from before changes nothing."""
    embedder = write_model(aw.ws.tmp / "models" / "bge-small", BGE_SMALL_EN_V1_5, chat=False)
    aw.ws.endpoint("emb", f'engine = "auto"\nprofile = "{profile}"\nmodel = "{embedder}"\n')
    for _ in range(2):
        result = aw.plan()["emb"]
        assert result.plan is not None, [e.text for e in result.errors]
        assert result.prerequisite is None
        decided = result.plan.decisions
        assert decided.engine == "vllm" and decided.primary_endpoint == "embeddings"
        assert decided.engine_choice is not None
        assert decided.engine_choice.reasons[0].startswith(
            "vllm: an embedder or reranker, several users at once"
        )
        aw.convert(model=embedder, extra={"{arch}.pooling_type": 1})


def test_an_embedder_the_converter_refused_is_served_by_vllm_with_the_pooling_reason(
    aw: AutoWorkspace,
) -> None:
    embedder = write_model(aw.ws.tmp / "models" / "bge-small", BGE_SMALL_EN_V1_5, chat=False)
    aw.ws.endpoint("emb", f'engine = "auto"\nprofile = "latency"\nmodel = "{embedder}"\n')
    waiting = aw.plan()["emb"].prerequisite
    assert waiting is not None
    write_refused(Path(waiting.output), str(embedder), None, "q8_0", pinned_version(), "unknown")
    result = aw.plan()["emb"]
    assert result.plan is not None, [e.text for e in result.errors]
    choice = result.plan.decisions.engine_choice
    assert result.plan.decisions.engine == "vllm" and choice is not None
    assert result.plan.decisions.primary_endpoint == "embeddings"
    assert choice.reasons[0].startswith("vllm: an embedder or reranker, profile latency")
    assert any(r.startswith("not llama.cpp:") and "unknown" in r for r in choice.reasons)


def test_every_profile_has_a_pooling_rule_with_its_reason() -> None:
    """A profile added without a pooling rule would fail every auto embedder's plan."""
    assert set(POOLING) == set(get_args(Profile))
    for isa in get_args(InstructionSet):
        assert set(PREFERRED[isa]) == set(WHY[isa]), isa
        assert all(rule in PREFERRED[isa] for rule in [*POOLING, *POOLING.values()]), isa


def test_a_chat_model_keeps_its_profiles_order() -> None:
    assert engine_order("pooling-latency") == ("llama.cpp", "vllm")
    assert engine_order("pooling") == ("vllm", "llama.cpp")
    assert engine_order("throughput") == ("vllm", "llama.cpp")


@pytest.fixture
def milan(ws: PlanWorkspace, host_of: Callable[..., HostFacts]) -> AutoWorkspace:
    """Both runtimes on a Milan: AVX2, no AVX-512."""
    return AutoWorkspace(ws, host_of("milan-7763-2s"))


def test_without_avx512_every_profile_goes_to_llama_cpp_with_the_figures(
    milan: AutoWorkspace,
) -> None:
    """vLLM's AVX2 path served 14-30x fewer tokens/s than llama.cpp on a Milan: auto gives
    llama.cpp every profile there, throughput too, and says why with the figures."""
    assert not milan.host.avx512
    milan.convert()
    for profile, concurrency in (("latency", 1), ("balanced", 8), ("throughput", 32)):
        milan.ws.endpoint("chat", f'engine = "auto"\nprofile = "{profile}"\n')
        result = milan.plan()["chat"]
        assert result.plan is not None, [e.text for e in result.errors]
        decided = result.plan.decisions
        assert decided.engine == "llama.cpp", profile
        assert decided.engine_choice is not None
        why = decided.engine_choice.reasons[0]
        assert why.startswith(f"llama.cpp: profile {profile}, no AVX-512"), why
        assert f"at concurrency {concurrency}" in why and "Milan" in why, why


def test_an_embedder_without_avx512_goes_to_llama_cpp(milan: AutoWorkspace) -> None:
    embedder = write_model(milan.ws.tmp / "models" / "bge-small", BGE_SMALL_EN_V1_5, chat=False)
    milan.convert(model=embedder, extra={"{arch}.pooling_type": 1})
    milan.ws.endpoint("emb", f'engine = "auto"\nprofile = "throughput"\nmodel = "{embedder}"\n')
    result = milan.plan()["emb"]
    assert result.plan is not None, [e.text for e in result.errors]
    decided = result.plan.decisions
    assert decided.engine == "llama.cpp" and decided.primary_endpoint == "embeddings"
    assert decided.engine_choice is not None
    assert "no AVX-512" in decided.engine_choice.reasons[0]


def test_the_order_follows_the_instruction_set() -> None:
    for rule in PREFERRED["avx2"]:
        assert engine_order(rule, isa="avx2") == ("llama.cpp", "vllm"), rule
    assert engine_order("throughput", ("vllm",), isa="avx2") == ("vllm", "llama.cpp")
    assert engine_order("throughput", isa="avx512") == ("vllm", "llama.cpp")
