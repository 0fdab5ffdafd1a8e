"""The real llama-server and the tiny GGUF files the llama.cpp tests serve
(tests/tools/llama_server.sh: the product's recipe, packaging/llama-runtime.sh)."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from tests.health.realvllm import CACHE, free_port

SERVER = CACHE / "llama-server"
TINY_GGUF = CACHE / "tiny-gguf"
BOOTSTRAP_HINT = "run tests/bootstrap.sh (tests/tools/llama_server.sh and tiny_gguf.sh)"
READY_BOUND_S = 60


def llama_server() -> Path:
    """The recipe's `llama-server`; the test FAILS (never skips) when it has not been built."""
    server = SERVER / "bin" / "llama-server"
    if not server.is_file() or not (SERVER / ".epyc-stamp").is_file():
        pytest.fail(f"no llama-server in {SERVER}: {BOOTSTRAP_HINT}")
    return server


def tiny_gguf(out_type: str = "q8_0") -> Path:
    path = TINY_GGUF / f"tiny-{out_type}.gguf"
    if not path.is_file():
        pytest.fail(f"no {path}: {BOOTSTRAP_HINT}")
    return path


TINY_POOLING_GGUF = CACHE / "tiny-pooling-gguf"


def tiny_bert_gguf(name: str) -> Path:
    """The tiny BERT `embedder` (mean pooling) or `reranker` (a one-output classifier head)
    as llama.cpp's converter writes them (tests/tools/tiny_pooling_gguf.sh)."""
    path = TINY_POOLING_GGUF / f"{name}-bf16.gguf"
    if not path.is_file():
        pytest.fail(f"no {path}: run tests/bootstrap.sh (tests/tools/tiny_pooling_gguf.sh)")
    return path


PUBLISHED_GEMMA = CACHE / "published-gemma" / "gemma-3-270m-q4_k_m.gguf"


def published_gemma() -> Path:
    """Gemma 3 270M in Q4_K_M, the published GGUF (tests/tools/published_gemma.sh): a real
    chat model's weights, of an architecture (gemma3) the tiny models are not."""
    if not PUBLISHED_GEMMA.is_file():
        hint = "run tests/bootstrap.sh (tests/tools/published_gemma.sh)"
        pytest.fail(f"no {PUBLISHED_GEMMA}: {hint}")
    return PUBLISHED_GEMMA


def healthy(url: str) -> bool:
    try:
        return httpx.get(f"{url}/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


@contextmanager
def serving(*args: str, key: str | None = None, model: Path | None = None) -> Iterator[str]:
    """The real llama-server on a free loopback port serving `model` (the tiny q8_0 GGUF by
    default) with one thread, `--metrics` and `args` (its key from LLAMA_API_KEY, as the
    supervisor hands it over); its base URL once /health answers 200."""
    port = free_port()
    server = subprocess.Popen(
        [str(llama_server()), "-m", str(model or tiny_gguf()), "--port", str(port), "-t", "1",
         "--metrics", *args],
        env={"LLAMA_API_KEY": key} if key else {},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + READY_BOUND_S
        while not healthy(url):
            assert server.poll() is None, f"llama-server ended ({server.returncode})"
            assert time.monotonic() < deadline, "llama-server not ready"
            time.sleep(0.2)
        yield url
    finally:
        server.terminate()
        server.wait(30)


POOLING_TYPES = {"mean": 1, "cls": 2, "last": 3, "rank": 4}
"""llama.cpp's `enum llama_pooling_type`, as a GGUF stores `{arch}.pooling_type`."""


def with_pooling(source: Path, out: Path, pooling: str) -> Path:
    """A copy of the GGUF `source` that declares `pooling` (its `{arch}.pooling_type`), as an
    embedding model's conversion writes it: the same tensors and keys, one key more."""
    return copy_gguf(source, out, pooling_type=POOLING_TYPES[pooling])


def copy_gguf(
    source: Path, out: Path, *, architecture: str | None = None, pooling_type: int | None = None
) -> Path:
    """A copy of the GGUF `source`: its keys and tensors, under `architecture` (its keys
    renamed to it) and with `{arch}.pooling_type` where given."""
    import gguf

    reader = gguf.GGUFReader(source)
    was = str(reader.fields["general.architecture"].contents())
    arch = architecture or was
    writer = gguf.GGUFWriter(out, arch=arch)
    for name, field in reader.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        value_type = field.types[0]
        sub_type = field.types[-1] if value_type == gguf.GGUFValueType.ARRAY else None
        key = f"{arch}.{name.removeprefix(was + '.')}" if name.startswith(was + ".") else name
        writer.add_key_value(key, field.contents(), value_type, sub_type=sub_type)
    if pooling_type is not None:
        writer.add_uint32(f"{arch}.pooling_type", pooling_type)
    for tensor in reader.tensors:
        writer.add_tensor(tensor.name, tensor.data, raw_shape=tensor.data.shape,
                          raw_dtype=tensor.tensor_type)  # fmt: skip
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out
