"""The endpoint file's keys are one table (epycd.spec.keys): each key a row, every field of
`EndpointSpec` a row, docs/admin.md's table made from the rows, and for every engine and device
a key does not apply to, a file that sets it is refused naming the key and the row's fix,
while its harmless values pass and every other endpoint file still parses."""

from __future__ import annotations

from itertools import product
from pathlib import Path

import pytest
import tomli_w

from epycd.engines import ENGINES as REGISTERED
from epycd.engines.base import RUNTIMES
from epycd.spec import parse_endpoint, spec_model
from epycd.spec.key_setting import ENGINE_VALUES
from epycd.spec.keys import DEVICES, ENGINES, keys, keys_markdown

REPO = Path(__file__).resolve().parents[2]
PRECISIONS = ["bfloat16", "float16", "float32"]
SAMPLES: dict[str, object] = {
    "model": "/srv/models/qwen3",
    "revision": "main",
    "engine": "vllm",
    "gguf_file": "model-Q4_K_M.gguf",
    "llama_server": "/opt/llama/bin/llama-server",
    "dtype": "bfloat16",
    "max_model_len": 2048,
    "max_num_seqs": 4,
    "profile": "latency",
    "port": 8100,
    "host": "127.0.0.1",
    "api_key_file": "/etc/epyc-llm/key",
    "hf_token_file": "/etc/epyc-llm/token",
    "runtime": "auto",
    "vllm": "/opt/venv/bin/vllm",
    "image": "repo/name:tag",
    "socket": 1,
    "served_model_name": "chat",
    "aliases": ["gpt-4o-mini"],
    "chat_template": "/etc/epyc-llm/template.jinja",
    "restart": "no",
    "extra_args": ["--seed", "1"],
    "env": {"VLLM_LOGGING_LEVEL": "DEBUG"},
    "throughput_flags": True,
    "instances": 2,
    "placement": "host",
    "min_ready": 2,
    "device": "instinct",
    "gpus": [0, 1],
    "tensor_parallel_size": 2,
    "on_demand": True,
    "idle_stop": "20s",
    "quantize": "q4_k_m",
    "speculative": "ngram",
}
"""A value of the right type for each key, not one of its harmless values."""
EXCLUSIVE = (
    frozenset({"instances", "placement", "min_ready"}),
    frozenset({"on_demand", "idle_stop"}),
)
"""Keys no file sets together: a set of instances, and on-demand serving (one engine)."""


def parse(tmp_path: Path, data: dict[str, object]) -> list[tuple[str | None, str, str | None]]:
    path = tmp_path / "chat.toml"
    raw = tomli_w.dumps(data).encode()
    return [
        (e.key, e.message, e.fix) for e in parse_endpoint(path, raw, precisions=PRECISIONS).errors
    ]


def test_every_field_is_a_row_and_every_row_a_field() -> None:
    assert [row.name for row in keys()] == list(dict.fromkeys(row.name for row in keys()))
    assert {row.name for row in keys()} == set(spec_model().model_fields) == set(SAMPLES)


def test_the_admin_guide_table_is_made_from_the_rows() -> None:
    admin = (REPO / "docs" / "admin.md").read_text()
    assert keys_markdown() in admin, "run .venv/bin/python -m epycd.spec and paste its table"


@pytest.mark.parametrize(("engine", "device"), list(product(ENGINE_VALUES, DEVICES)))
def test_a_key_that_does_not_apply_is_refused_with_its_fix(
    tmp_path: Path, engine: str, device: str
) -> None:
    base = {"engine": engine, "device": device}
    for row in keys():
        if row.name in base:
            continue
        errors = parse(tmp_path, base | {row.name: SAMPLES[row.name]})
        mine = [e for e in errors if e[0] == row.name and "does not apply" in e[1]]
        if row.applies(engine, device):
            assert not mine, (row.name, engine, device, mine)
            continue
        assert len(mine) == 1, (row.name, engine, device, errors)
        assert mine[0][2] == row.fix_for(engine, device)
        for value in row.harmless:
            again = parse(tmp_path, base | {row.name: value})
            assert not [e for e in again if e[0] == row.name], (row.name, value, again)


def test_a_file_of_each_engine_with_only_its_keys_parses(tmp_path: Path) -> None:
    for engine, device in (
        ("vllm", "cpu"),
        ("vllm", "instinct"),
        ("llama.cpp", "cpu"),
        ("auto", "cpu"),
    ):
        data = {row.name: SAMPLES[row.name] for row in keys() if row.applies(engine, device)}
        data |= {"engine": engine, "device": device}
        if device == "instinct":
            data["runtime"] = "podman"
        for left_out in EXCLUSIVE:
            one_of = {key: value for key, value in data.items() if key not in left_out}
            errors = parse(tmp_path, one_of)
            assert not errors, (engine, device, errors)


@pytest.mark.parametrize("engine", [e.name for e in REGISTERED])
def test_each_engine_takes_its_runtimes_and_refuses_the_others(tmp_path: Path, engine: str) -> None:
    """A runtime the engine's servers cannot run in is refused on `runtime`, the fix listing
    the ones they can; each of those parses."""
    declared = next(e for e in REGISTERED if e.name == engine)
    for runtime in ("auto", *RUNTIMES):
        errors = parse(tmp_path, {"engine": engine, "runtime": runtime})
        if runtime == "auto" or runtime in declared.runtimes:
            assert not errors, (engine, runtime, errors)
            continue
        [(key, message, fix)] = errors
        assert key == "runtime" and declared.title in message, (engine, runtime, message)
        assert fix is not None and all(f'"{r}"' in fix for r in declared.runtimes), fix
        assert f'"{runtime}"' not in fix, fix


def test_an_engine_outside_the_registry_is_refused_on_its_key(tmp_path: Path) -> None:
    """`engine` takes the registered engines' names (epycd.engines.ENGINES) and no other."""
    [(key, message, fix)] = parse(tmp_path, {"engine": "sglang"})
    assert key == "engine" and message == "'sglang' is not allowed", message
    assert fix is not None and all(f'"{e.name}"' in fix for e in REGISTERED), fix
    assert sorted(ENGINES) == sorted(e.name for e in REGISTERED)


def test_an_engine_that_refuses_a_shared_key_leaves_its_row_with_its_fix() -> None:
    """An engine's `EngineKeys.refused`: a key every engine takes stops applying to it, and
    its files get its fix; the engine's own rows follow `engine`."""
    from epycd.spec.key_setting import EngineKeys, KeySetting
    from epycd.spec.keys import SHARED_KEYS, _with_refusals

    port = next(row for row in SHARED_KEYS if row.name == "port")
    assert "llama.cpp" in port.engines
    share = EngineKeys(refused={"port": "remove port: it listens on a socket"})
    refused = _with_refusals(port, {"llama.cpp": share, "vllm": EngineKeys()})
    assert not refused.applies("llama.cpp", "cpu") and refused.applies("vllm", "cpu")
    assert refused.fix_for("llama.cpp", "cpu") == "remove port: it listens on a socket"
    rows = [row.name for row in keys()]
    own = [r.name for e in REGISTERED for r in e.implementation("spec", "KEYS", EngineKeys).own]
    assert rows[rows.index("engine") + 1 : rows.index("engine") + 1 + len(own)] == own
    assert all(isinstance(row, KeySetting) for row in keys())
