"""A GGUF file is read within bounds, whatever it says: a count longer than the file, arrays of
arrays, a figure out of range or a file cut anywhere is one `GgufError` (exit 2, one line naming
the file) within a second or two and a window of memory, never a loop, a traceback or a plan
sized from a negative or absurd figure."""

from __future__ import annotations

import os
import random
import signal
import struct
import subprocess
import sys
import time
import tracemalloc
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType

import pytest
from click.testing import CliRunner
from gguf import GGUFReader, GGUFValueType

from epycd.cli import main
from epycd.engines.llama_cpp.model import gguf as gguf_module
from epycd.engines.llama_cpp.model.gguf import GgufError, read_gguf
from tests.model import hostile_gguf as h
from tests.model.gguf_files import GgufShape, write_gguf

pytestmark = pytest.mark.usefixtures("offline_hub")

CASE_SECONDS = 5.0
"""What one read may take here (it takes milliseconds; a loop is stopped, not waited on)."""
MEMORY_SLACK = 8 << 20
"""What one read may hold beyond the file's size: the reader's window and the kept values."""
TINY_GGUF = Path(os.environ.get("EPYC_TEST_CACHE", "/var/cache/epyc-llm-test")) / "tiny-gguf"
FUZZ_SEED = int(os.environ.get("EPYC_FUZZ_SEED", "20250101"))


@contextmanager
def within(seconds: float) -> Iterator[None]:
    """Stop the block with TimeoutError after `seconds`: a reader that loops fails its test
    instead of hanging the session."""

    def expire(_signum: int, _frame: FrameType | None) -> None:
        raise TimeoutError(f"took more than {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


HOSTILE: dict[str, tuple[bytes, str]] = {
    # name -> (the file, what the one line says)
    "an array longer than the file (u8)": (
        h.gguf([*h.model_keys(), h.array("tokenizer.ggml.token_type", GGUFValueType.UINT8, 2**40)]),
        "'tokenizer.ggml.token_type' (1099511627776 items of UINT8)",
    ),
    "an array longer than the file (i32)": (
        h.gguf([*h.model_keys(), h.array("x.scores", GGUFValueType.INT32, 2**33, b"\0" * 8)]),
        "truncated",
    ),
    "an array of arrays": (
        h.gguf([*h.model_keys(), h.nested_arrays("x.nested", 2)]),
        "'x.nested' is an array of arrays",
    ),
    "arrays nested 5000 deep": (
        h.gguf([*h.model_keys(), h.nested_arrays("x.nested", 5000)]),
        "'x.nested' is an array of arrays",
    ),
    "a string longer than the file": (
        h.gguf(
            [*h.model_keys(), h.kv("general.name", GGUFValueType.STRING, struct.pack("<Q", 2**62))]
        ),
        "'general.name' at byte",
    ),
    "block_count 2**63": (h.gguf(h.model_keys(block_count=2**63)), "qwen2.block_count"),
    "block_count 2**40": (h.gguf(h.model_keys(block_count=2**40)), "qwen2.block_count"),
    "block_count -3": (h.gguf(h.model_keys(block_count=-3)), "qwen2.block_count: -3"),
    "context_length -4096": (
        h.gguf(h.model_keys(context_length=-4096)),
        "qwen2.context_length: -4096 is out of range",
    ),
    "context_length 2**62": (
        h.gguf(h.model_keys(context_length=2**62)),
        "qwen2.context_length: 4611686018427387904",
    ),
    "head_count -4": (
        h.gguf(h.model_keys(attention__head_count=-4)),
        "qwen2.attention.head_count: -4",
    ),
    "head_count_kv 2**62": (
        h.gguf(h.model_keys(attention__head_count_kv=2**62)),
        "qwen2.attention.head_count_kv",
    ),
    "a per-layer array of 600 layers": (
        h.gguf(
            [
                *h.model_keys(attention__head_count_kv=1),
                h.array("qwen2.feed_forward_length", GGUFValueType.UINT8, 600, b"\x08" * 600),
            ]
        ),
        "qwen2.feed_forward_length: 600 items, more than 512 layers",
    ),
}


@pytest.mark.parametrize("case", list(HOSTILE))
def test_a_hostile_file_is_one_line_of_bad_input_at_once(tmp_path: Path, case: str) -> None:
    data, said = HOSTILE[case]
    path = tmp_path / "hostile.gguf"
    path.write_bytes(data)
    started = time.monotonic()
    with within(CASE_SECONDS):
        result = CliRunner().invoke(main, ["check-model", str(path)])
    assert time.monotonic() - started < CASE_SECONDS
    assert result.exit_code == 2, (result.output, result.exception)
    [line] = result.stderr.strip().splitlines()
    assert str(path) in line and said in line, line


def test_the_looping_file_is_exit_2_from_the_real_command(tmp_path: Path) -> None:
    """The command itself, as an admin runs it: it ends at once with exit 2 and one line."""
    data, said = HOSTILE["an array longer than the file (u8)"]
    path = tmp_path / "hostile.gguf"
    path.write_bytes(data)
    done = subprocess.run(
        [sys.executable, "-c", "from epycd.cli import main; main()", "check-model", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    assert done.returncode == 2, done.stderr
    [line] = done.stderr.strip().splitlines()
    assert str(path) in line and said in line


def test_counts_past_any_real_file_are_refused_before_reading(tmp_path: Path) -> None:
    """Counts and lengths are held to llama.cpp's limits, not walked: 2**40 tokens, 2**20
    tensors or keys, a 64-byte tensor name."""
    path = tmp_path / "m.gguf"
    cases = {
        "strings, more than": h.gguf(
            [h.array("tokenizer.ggml.tokens", GGUFValueType.STRING, 2**40, h.text("a") * 4)]
        ),
        "tensors, more than": h.gguf(h.model_keys(), tensor_count=2**20),
        "metadata keys, more than": h.gguf(h.model_keys(), kv_count=2**20),
        "cannot fit": h.gguf(h.model_keys(), tensor_count=1000),
        "63 at most": h.gguf(h.model_keys(), tensors=[h.tensor_info("x" * 64, [32], 0)]),
        "impossible shape": h.gguf(h.model_keys(), tensors=[h.tensor_info("t", [2**40] * 3, 0)]),
        "unknown ggml type": h.gguf(h.model_keys(), tensors=[h.tensor_info("t", [32], 999)]),
        "past the file's end": h.gguf(h.model_keys(), tensors=[h.tensor_info("t", [32], 0)]),
    }
    for said, data in cases.items():
        path.write_bytes(data)
        with within(CASE_SECONDS), pytest.raises(GgufError) as refused:
            read_gguf(path)
        assert said in str(refused.value) and str(path) in str(refused.value), said


@pytest.mark.parametrize("window", [1, 7, 4096])
def test_the_window_it_reads_through_changes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, window: int
) -> None:
    """The same facts through a window of any size: each value read across its edge."""
    path = tmp_path / "m.gguf"
    write_gguf(path, GgufShape(vocab=100, kv_heads=[2, 0, 4], feed_forward=512))
    whole = read_gguf(path)
    monkeypatch.setattr(gguf_module, "WINDOW", window)
    assert read_gguf(path) == whole
    assert (whole.vocab_size, whole.head_count_kv, whole.feed_forward_length) == (
        100,
        [2, 0, 4],
        512,
    )


TRACE_EVERY = 5
"""Memory is traced on every fifth case: tracing makes a read ten times slower."""


def fuzz_base() -> list[Path]:
    """One of the tiny model's real GGUF files, where the test cache has them (the others
    differ only in their tensors' types)."""
    found = sorted(TINY_GGUF.glob("*.gguf"), key=lambda p: "q8_0" not in p.name)
    return found[:1]


def header_end(path: Path) -> int:
    """Where a valid file's tensor data starts: the bytes the reader parses."""
    return int(GGUFReader(str(path)).data_offset)


def mutate(data: bytes, end: int, rng: random.Random) -> bytes:
    """1 to 8 bytes of the header set to edge values (0, 0xff, 0x80, 0x7f) or random ones."""
    buffer = bytearray(data)
    for _ in range(rng.randint(1, 8)):
        buffer[rng.randrange(end)] = rng.choice([0, 0xFF, 0x80, 0x7F, rng.randrange(256)])
    return bytes(buffer)


def read_case(path: Path, what: str, trace: bool) -> None:
    """The property: a result or one clean error naming the file, in time and in memory."""
    if trace:
        tracemalloc.start()
    started = time.monotonic()
    try:
        with within(CASE_SECONDS):
            read_gguf(path)
    except GgufError as exc:
        assert str(path) in str(exc) and "\n" not in str(exc), f"{what}: {exc}"
    except Exception as exc:
        pytest.fail(f"{what}: {type(exc).__name__}: {exc}")
    finally:
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    took = time.monotonic() - started
    assert took < CASE_SECONDS, f"{what}: {took:.1f} s"
    assert peak < path.stat().st_size + MEMORY_SLACK, f"{what}: {peak} bytes held"


def test_cut_or_mutated_files_read_or_fail_cleanly(tmp_path: Path) -> None:
    """A file cut at 120 offsets and mutated 300 times, a written GGUF and one of the tiny
    model's real ones where the test cache has them (seeded: EPYC_FUZZ_SEED replays a run).
    About 5 s on 2 cores with the real file."""
    written = tmp_path / "written.gguf"
    write_gguf(written, GgufShape(vocab=64, kv_heads=[2, 0, 4], feed_forward=512))
    case = tmp_path / "case.gguf"
    rng = random.Random(FUZZ_SEED)
    cases = 0
    for base in [written, *fuzz_base()]:
        data, end = base.read_bytes(), header_end(base)
        cuts = sorted({*range(min(end, 64)), *(rng.randrange(end) for _ in range(100)), end + 1})
        for cut in cuts[:120]:
            case.write_bytes(data[:cut])
            what = f"{base.name} cut at {cut} (EPYC_FUZZ_SEED={FUZZ_SEED})"
            read_case(case, what, trace=cases % TRACE_EVERY == 0)
            cases += 1
        for index in range(300):
            case.write_bytes(mutate(data, end, rng))
            what = f"{base.name} mutation {index} (EPYC_FUZZ_SEED={FUZZ_SEED})"
            read_case(case, what, trace=cases % TRACE_EVERY == 0)
            cases += 1
    assert cases >= 420
