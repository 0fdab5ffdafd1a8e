"""A safetensors header is checked, not trusted: a length past the file or over the cap, a
header that is not a JSON object, an unknown dtype, a shape that is not non-negative ints, an
offset missing, not a number, out of order, overlapping another, leaving a hole or bytes after
the last tensor, or past the file, or a span that is not the shape's bytes is one `InputError`
(exit 2, one line naming the file, the tensor and the fix) from `check-model` and from `plan`,
never a traceback, "failed unexpectedly" or a negative weights figure that fits."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from epycd.cli import main
from epycd.errors import InputError
from epycd.model.weights import MAX_HEADER_BYTES, local_weights_bytes, read_safetensors_header
from tests.model import hostile_safetensors as h
from tests.plan.conftest import write_model
from tests.sandbox import CliSandbox, make_executable

T = h.TENSOR_BYTES
HOSTILE: dict[str, tuple[bytes, str]] = {
    # name -> (the file, what its one line says)
    "shorter than its length": (b"\x05\x00", "shorter than 8 bytes"),
    "a header length past the file": (h.safetensors({}, length=10**6), "past the end of the file"),
    "a header length over the cap": (h.safetensors({}, length=2**63), "more than"),
    "a header that is not JSON": (h.safetensors("{nope"), "not JSON"),
    "a header that is not UTF-8": (h.safetensors(b'{"\xff": 1}'), "not JSON"),
    "a header that is a list": (h.safetensors([]), "not a JSON object"),
    "an entry that is not an object": (h.safetensors({"w": 5}), '"w": is not an object'),
    "offsets missing": (
        h.safetensors({"w": {"dtype": "BF16", "shape": [32]}}),
        '"w": data_offsets is missing',
    ),
    "offsets not numbers": (
        h.safetensors({"w": {"dtype": "BF16", "shape": [32], "data_offsets": ["0", "64"]}}),
        '"w": data_offsets must be two non-negative integers',
    ),
    "offsets as floats": (
        h.safetensors({"w": {"dtype": "BF16", "shape": [32], "data_offsets": [0.0, 64.5]}}),
        '"w": data_offsets must be two non-negative integers',
    ),
    "offsets as booleans": (
        h.safetensors({"w": {"dtype": "U8", "shape": [1], "data_offsets": [False, True]}}),
        '"w": data_offsets must be two non-negative integers',
    ),
    "three offsets": (
        h.safetensors({"w": {"dtype": "BF16", "shape": [32], "data_offsets": [0, 32, 64]}}),
        '"w": data_offsets must be two non-negative integers',
    ),
    "a negative offset": (
        h.safetensors({"w": h.tensor(-64, 0, shape=[32])}),
        '"w": data_offsets must be two non-negative integers',
    ),
    "offsets out of order": (
        h.safetensors({"w": h.tensor(T, 0, shape=[32])}),
        '"w": data_offsets [64, 0] end before they start',
    ),
    "overlapping tensors": (
        h.safetensors({"a": h.tensor(0, T), "b": h.tensor(T // 2, T + T // 2)}, data=2 * T),
        "overlap",
    ),
    "a hole between two tensors": (
        h.safetensors({"a": h.tensor(0, T // 2), "b": h.tensor(T, 2 * T)}, data=2 * T),
        '"b": data_offsets [64, 128] leave bytes [32, 64] before them that no tensor holds',
    ),
    "bytes after the last tensor": (
        h.safetensors({"w": h.tensor(0, T)}, data=T + 7),
        "7 bytes after the last tensor that no tensor holds",
    ),
    "a tensor past the file": (
        h.safetensors({"w": h.tensor(0, 2**40)}),
        '"w": data_offsets [0, 1099511627776] end past the file',
    ),
    "a span that is not the shape's bytes": (
        h.safetensors({"w": h.tensor(shape=[5])}),
        '"w": shape [5] of BF16 is 10 bytes, but data_offsets span 64',
    ),
    "a negative dimension": (
        h.safetensors({"w": h.tensor(shape=[-32])}),
        '"w": shape must be a list of non-negative integers',
    ),
    "a shape that is not a list": (
        h.safetensors({"w": h.tensor(shape="32")}),
        '"w": shape must be a list of non-negative integers',
    ),
    "an unknown dtype": (h.safetensors({"w": h.tensor(dtype="Q99")}), '"w": dtype "Q99" is not'),
    "metadata that is not a string map": (
        h.safetensors({"__metadata__": {"format": 1}, "w": h.tensor()}),
        '"__metadata__" must map strings to strings',
    ),
}


def model_folder(base: Path, data: bytes) -> tuple[Path, Path]:
    folder = write_model(base / "model")
    weights = folder / "model.safetensors"
    weights.write_bytes(data)
    return folder, weights


def one_line(result: Result) -> str:
    assert "Traceback" not in result.output + result.stderr
    assert "failed unexpectedly" not in result.output + result.stderr
    [line] = result.stderr.strip().splitlines()
    return line


def test_a_good_header_reads() -> None:
    assert h.good()  # the builder itself writes what the reader accepts


def test_the_good_file_of_the_builder_is_read(tmp_path: Path) -> None:
    folder, weights = model_folder(tmp_path, h.good())
    assert local_weights_bytes(folder) == (T, "safetensors-header")
    assert list(read_safetensors_header(weights).tensors) == ["w"]


@pytest.mark.usefixtures("offline_hub")
@pytest.mark.parametrize("case", list(HOSTILE))
def test_a_hostile_header_is_one_line_of_bad_input_from_check_model(
    tmp_path: Path, case: str
) -> None:
    data, said = HOSTILE[case]
    folder, weights = model_folder(tmp_path, data)
    result = CliRunner().invoke(main, ["check-model", str(folder)])
    assert result.exit_code == 2, (result.output, result.exception)
    line = one_line(result)
    assert str(weights) in line and said in line, line
    with pytest.raises(InputError) as raised:
        local_weights_bytes(folder)
    assert raised.value.fix, "the error says how to fix it"


@pytest.fixture
def sandbox(tmp_path: Path) -> CliSandbox:
    box = CliSandbox.create(tmp_path / "box")
    box.use_fake_host()
    make_executable(box.bin_dir / "podman", "#!/bin/sh\necho 'podman version 5.4.2'\n")
    return box


@pytest.mark.parametrize("case", list(HOSTILE))
def test_a_hostile_header_is_bad_input_of_its_endpoint_in_plan(
    sandbox: CliSandbox, case: str
) -> None:
    """The endpoint of that model is exit 2 naming the weights file; the endpoint beside it,
    of a good model, still plans."""
    data, said = HOSTILE[case]
    folder, weights = model_folder(sandbox.tmp / "bad", data)
    good, _ = model_folder(sandbox.tmp / "good", h.good())
    config = sandbox.settings.config_dir
    (config / "bad.toml").write_text(f'model = "{folder}"\n')
    (config / "good.toml").write_text(f'model = "{good}"\nport = 8101\n')
    env = sandbox.environ(HF_HUB_OFFLINE="1")
    result = CliRunner().invoke(main, ["plan", "bad", "--json"], env=env)
    assert result.exit_code == 2, (result.output, result.exception)
    data_out = json.loads(result.stdout)
    assert data_out.get("memory") is None, "no figure is planned from a hostile header"
    [error] = data_out["errors"]
    assert str(weights) in error and said in error, error
    assert "Traceback" not in result.output + result.stderr
    planned = CliRunner().invoke(main, ["plan", "good", "--json"], env=env)
    assert planned.exit_code == 0, planned.output
    assert json.loads(planned.stdout)["memory"]["fits"] is True


def test_the_header_cap_is_a_credible_one() -> None:
    assert 1 << 20 <= MAX_HEADER_BYTES <= 100 << 20
