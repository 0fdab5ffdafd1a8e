"""A converted GGUF file bound to its source (docs/conversion.md, "Bound to its source"), in
the real planner: two sources never share a converted file, the records beside it are read
through epycd/readfile.py (a FIFO or a device there refuses that endpoint alone, at once),
and `quantize` on a model that is a GGUF file already is refused with the fix."""

from __future__ import annotations

import json
import os
import shutil
import struct
import threading
from collections.abc import Callable
from contextlib import suppress
from pathlib import Path

import pytest

from epycd.engines.llama_cpp.model.convert import kept_step, stamp_of
from epycd.engines.llama_cpp.plan.converted import converted_path
from epycd.plan.model import ConvertedWeights
from epycd.plan.pipeline.result import EndpointResult
from tests.plan.conftest import write_model
from tests.plan.test_auto_engine import AutoWorkspace, aw
from tests.plan.test_llama_plan import gguf_model

__all__ = ["aw"]

BOUND_S = 30


def plan_bounded(aw: AutoWorkspace, fifos: list[Path]) -> dict[str, EndpointResult]:
    """`aw.plan()`, failed when it does not answer within `BOUND_S` (a read blocked on one
    of `fifos`, which are then opened for writing and closed, so the blocked read ends)."""
    answer: dict[str, dict[str, EndpointResult]] = {}
    failure: list[BaseException] = []

    def run() -> None:
        try:
            answer["plan"] = aw.plan()
        except BaseException as exc:  # the test's thread: handed back to the test
            failure.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(BOUND_S)
    if thread.is_alive():
        for fifo in fifos:  # a reader blocked in open() gets its writer, then EOF
            with suppress(OSError):
                os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        thread.join(BOUND_S)
        pytest.fail(f"plan did not answer within {BOUND_S} s: a read blocked on a FIFO")
    if failure:
        raise failure[0]
    return answer["plan"]


def prerequisite_output(result: EndpointResult) -> Path:
    assert result.prerequisite is not None, [e.text for e in result.errors]
    return Path(result.prerequisite.output)


def test_two_sources_whose_paths_slugged_alike_never_share_a_converted_file(
    aw: AutoWorkspace,
) -> None:
    """`/m/a b/x` and `/m/a/b/x` were one slug (`m--a--b--x`): one endpoint could be served
    the other's weights. Their files differ now, and two paths of one folder (a symlink)
    are one source, one file."""
    spaced = shutil.copytree(aw.ws.model, aw.ws.tmp / "m" / "a b" / "x")
    nested = shutil.copytree(aw.ws.model, aw.ws.tmp / "m" / "a" / "b" / "x")
    (aw.ws.tmp / "link").symlink_to(nested)
    aw.ws.endpoint("one", f'engine = "llama.cpp"\nmodel = "{spaced}"\n')
    aw.ws.endpoint("two", f'engine = "llama.cpp"\nmodel = "{nested}"\n')
    aw.ws.endpoint("three", f'engine = "llama.cpp"\nmodel = "{aw.ws.tmp / "link"}"\n')
    results = aw.plan()
    one, two, three = (prerequisite_output(results[name]) for name in ("one", "two", "three"))
    assert one != two, "two sources, one converted file"
    assert two == three, "one folder under two paths is one source"
    assert one.parent == two.parent == aw.converted


def test_quantize_on_a_gguf_model_is_refused_with_the_fix(aw: AutoWorkspace) -> None:
    model = gguf_model(aw.ws.tmp)
    aw.ws.endpoint("g", f'engine = "llama.cpp"\nmodel = "{model}"\nquantize = "q4_k_m"\n')
    aw.ws.endpoint("plain", f'engine = "llama.cpp"\nmodel = "{model}"\n')
    results = aw.plan()
    assert results["plain"].plan is not None, [e.text for e in results["plain"].errors]
    refused = results["g"]
    assert refused.plan is None and refused.prerequisite is None
    text = refused.errors[0].text
    assert text.startswith(f"{aw.ws.config_dir / 'g.toml'}: quantize: "), text
    assert str(model) in text and "already a GGUF file" in text
    assert "remove quantize" in text and "safetensors" in text


@pytest.mark.parametrize("suffix", [".json", ".refused.json"])
@pytest.mark.parametrize("kind", ["fifo", "dev-zero", "folder"])
def test_a_special_file_as_a_record_refuses_no_plan_and_hangs_none(
    aw: AutoWorkspace, suffix: str, kind: str
) -> None:
    """The record (NAME.gguf.json) or the refusal record (NAME.gguf.refused.json) beside a
    converted file is a FIFO, a symlink to /dev/zero or a folder: the plan answers at once,
    that endpoint waits for its conversion with the reason, and the other endpoint's plan
    is as it was."""
    other = write_model(aw.ws.tmp / "models" / "other")
    aw.ws.endpoint("chat", 'engine = "llama.cpp"\n')
    aw.ws.endpoint("gguf", f'engine = "llama.cpp"\nmodel = "{gguf_model(aw.ws.tmp)}"\n')
    aw.ws.endpoint("next", f'engine = "llama.cpp"\nmodel = "{other}"\n')
    output = prerequisite_output(aw.plan()["chat"])
    output.parent.mkdir(parents=True, exist_ok=True)
    record = output.with_name(output.name + suffix)
    special: dict[str, Callable[[Path], None]] = {
        "fifo": os.mkfifo,
        "dev-zero": lambda path: path.symlink_to("/dev/zero"),
        "folder": lambda path: path.mkdir(),
    }
    special[kind](record)
    results = plan_bounded(aw, [record] if kind == "fifo" else [])
    assert results["gguf"].plan is not None, [e.text for e in results["gguf"].errors]
    assert prerequisite_output(results["next"]) != output
    waiting = results["chat"]
    assert prerequisite_output(waiting) == output, "approve converts it again"
    if suffix == ".json":
        assert str(record) in waiting.errors[0].text, waiting.errors[0].text
        assert "not a regular file" in waiting.errors[0].text or "larger" in waiting.errors[0].text


def tiny_safetensors(fill: int) -> bytes:
    """A safetensors file of one F32 tensor of two values (all bytes `fill`)."""
    header = json.dumps({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}).encode()
    return struct.pack("<Q", len(header)) + header + bytes([fill]) * 8


@pytest.mark.parametrize(
    ("change", "said"),
    [
        ("rewrite-config", "config.json was rewritten (size"),
        ("touch-weights", "model.safetensors was modified or replaced"),
        ("replace-weights", "model.safetensors was modified or replaced"),
        ("new-shard", "model-00002.safetensors is new"),
        ("tokenizer-gone", "tokenizer_config.json is gone"),
    ],
)
def test_a_source_changed_since_its_conversion_waits_for_a_conversion_with_the_reason(
    aw: AutoWorkspace, change: str, said: str
) -> None:
    """The converted file stands for the source as it was converted: a config or weights
    rewritten, touched, replaced (same size, another inode), added or removed since is a
    plan that waits for approve to convert again, saying what changed (an approved
    endpoint is then `changed-needs-approval` with it: tests/llama/test_approve_converted.py)."""
    model = aw.ws.model
    weights = model / "model.safetensors"
    weights.write_bytes(tiny_safetensors(0))
    gguf = aw.convert()
    aw.ws.endpoint("chat", 'engine = "llama.cpp"\n')
    before = aw.plan()["chat"]
    assert before.plan is not None, [e.text for e in before.errors]
    converted = before.plan.decisions.engine_choice
    assert converted is not None and converted.converted is not None
    assert converted.converted.source_identity == f"folder:{os.path.realpath(model)}"
    if change == "rewrite-config":
        config = json.loads((model / "config.json").read_text())
        (model / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 1}))
    elif change == "touch-weights":
        os.utime(weights, ns=(1, 1))
    elif change == "replace-weights":
        (model / "new").write_bytes(tiny_safetensors(1))
        stat = weights.stat()
        os.replace(model / "new", weights)
        os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    elif change == "new-shard":
        (model / "model-00002.safetensors").write_bytes(tiny_safetensors(2))
    else:
        (model / "tokenizer_config.json").unlink()
    after = aw.plan()["chat"]
    assert after.plan is None and prerequisite_output(after) == gguf
    text = after.errors[0].text
    assert "must be converted again" in text and said in text, text
    assert "epycctl approve chat converts it first" in text


def test_an_approval_recorded_before_the_binding_still_loads() -> None:
    """An approved plan of a converted endpoint recorded before `converted` carried the
    source's identity and digest loads (it is then drift, not a damaged record)."""
    older = {"source": "/m/x", "source_revision": None, "quantize": "q8_0", "sha256": "0" * 64}
    weights = ConvertedWeights.model_validate(older)
    assert (weights.source_identity, weights.source_sha256) == (None, None)


def test_quantize_on_a_gguf_model_under_auto_names_the_key_and_the_fix(
    aw: AutoWorkspace,
) -> None:
    model = gguf_model(aw.ws.tmp)
    aw.ws.endpoint("g", f'engine = "auto"\nmodel = "{model}"\nquantize = "q8_0"\n')
    refused = aw.plan()["g"]
    assert refused.plan is None and refused.prerequisite is None
    text = refused.errors[0].text
    assert "not llama.cpp: " in text and "already a GGUF file" in text, text
    assert "remove quantize" in text, text


def test_a_kept_step_whose_stamp_is_a_fifo_is_no_step(tmp_path: Path) -> None:
    """The stamp beside a kept bf16 step (FILE.bf16.json) is read through readfile: a FIFO
    there is no stamp (converted again), at once."""
    model = write_model(tmp_path / "model")
    whole = tmp_path / "out.gguf.bf16"
    whole.write_bytes(b"a step")
    os.mkfifo(whole.with_name(whole.name + ".json"))
    answer: list[bool] = []
    thread = threading.Thread(
        target=lambda: answer.append(kept_step(whole, stamp_of(model, None))), daemon=True
    )
    thread.start()
    thread.join(BOUND_S)
    if thread.is_alive():
        with suppress(OSError):
            os.close(os.open(whole.with_name(whole.name + ".json"), os.O_WRONLY | os.O_NONBLOCK))
        pytest.fail("kept_step blocked on a FIFO")
    assert answer == [False]


def test_a_hub_source_is_named_by_its_id_and_commit(tmp_path: Path) -> None:
    """A hub model's file comes from its id at its commit: another commit, another id whose
    slug was the same (`org/a-b` and `org-a/b`), another file."""
    names = {
        converted_path(tmp_path, model, revision, "q8_0")
        for model, revision in [("org/a-b", "c1"), ("org/a-b", "c2"), ("org-a/b", "c1"),
                                ("org/a", "c1")]
    }  # fmt: skip
    assert len(names) == 4
    assert converted_path(tmp_path, "org/a-b", "c1", "q8_0") != converted_path(
        tmp_path, "org/a-b", "c1", "q4_k_m"
    )
