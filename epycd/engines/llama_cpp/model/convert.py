"""A Hugging Face model (safetensors) turned into a GGUF file by llama.cpp's own tools from
the pinned source: `convert_hf_to_gguf.py` writes bf16 or q8_0, and the runtime's `llama
quantize` makes q4_k_m from a bf16 file (`epycctl convert`, docs/conversion.md).

The converter is Python that imports torch and transformers. The runtime recipe
(packaging/llama-runtime.sh) installs it from the pinned llama.cpp source beside llama-server,
in DEST/converter; it runs under a Python that has torch and transformers (the vLLM
runtime's, by default).

Whether the converter takes a model is read from the converter itself: its map of
architectures (`LlamaTable.converts`, read from its source). A model it does not take is
refused before anything runs. The file is written as OUTPUT.part and renamed when whole, so
an interrupted or refused conversion leaves no file that looks finished.

An interrupted conversion resumes at the step that was cut: a hub model's download where it
stopped (huggingface_hub); q4_k_m's bf16 file, once whole, is kept (OUTPUT.bf16, with the
stamp of what it was made from) until the quantizer has written the result, so a quantizer
cut short starts again from it. The converter's own step writes one file in one pass and
starts again from the beginning.

A conversion the converter refuses for the model itself (`ConverterRefused`: its tokenizer is
unknown to it) fails the same way every time with the same llama.cpp; approve records it, and
the planner passes llama.cpp over for that model (docs/conversion.md).
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Literal

from pydantic import BaseModel

from epycd.atomic import write_atomic
from epycd.engines.llama_cpp.model.format import load_table, pinned_version
from epycd.engines.llama_cpp.model.source import (
    NOT_WEIGHTS,
    NOT_WEIGHTS_FOLDERS,
    ConvertedSource,
    SourceFile,
    converted_files,
    read_converted_source,
)
from epycd.errors import InputError, Refusal
from epycd.model.hub import HubEnvironment, locate_model
from epycd.readfile import (
    MODEL_JSON_MAX_BYTES,
    RECORD_MAX_BYTES,
    read_json_object,
    read_model,
    read_sha256,
)

Quantize = Literal["q8_0", "q4_k_m", "bf16"]
QUANTIZE: tuple[Quantize, ...] = ("q8_0", "q4_k_m", "bf16")
DEFAULT_QUANTIZE: Quantize = "q8_0"
"""Near-lossless at half of bf16's size; what a converted endpoint serves unless told."""
CONVERTER_OUTTYPE: dict[Quantize, str] = {"q8_0": "q8_0", "bf16": "bf16", "q4_k_m": "bf16"}
"""The converter's --outtype for each result; q4_k_m is quantized from the bf16 file."""
QUANTIZER_TYPE: dict[Quantize, str] = {"q4_k_m": "Q4_K_M"}
"""`llama quantize`'s type for the results the converter cannot write itself."""

CONVERTER_DIR = "converter"
"""Where packaging/llama-runtime.sh installs the converter in the runtime: its script, its
conversion/ modules and its gguf-py/ library, from the pinned source."""
CONVERTER_SCRIPT = "convert_hf_to_gguf.py"
CONVERTER_MODULES = ("torch", "transformers", "numpy", "sentencepiece")
"""What the converter imports (llama.cpp's requirements-convert_hf_to_gguf.txt)."""
TAIL_LINES = 12
KNOWN_FAILURES = {
    "pre-tokenizer was not recognized": "llama.cpp's converter does not know this model's "
    "tokenizer: its BPE pre-tokenizer is none of the published ones the converter lists",
}
"""The converter's failures a person meets most, in words (the converter's own line stays)."""


class ConverterRefused(Refusal):
    """llama.cpp's converter failed on the model itself, in a way it fails every time with
    the same llama.cpp (`KNOWN_FAILURES`), not on the machine (a full disk, a signal)."""


class Conversion(BaseModel):
    """What `convert` made."""

    model: str
    architecture: str
    quantize: Quantize
    output: str
    bytes: int
    sha256: str
    seconds: float
    llama_cpp: str
    converted_from: ConvertedSource
    """The source's identity, the files the converter read and their content's digest."""


Say = Callable[[str], None]


def converted_architecture(architectures: list[str], version: str | None = None) -> str | None:
    """The first of a model's config.json architectures the pinned converter takes."""
    takes = set(load_table(version or pinned_version()).converts)
    return next((name for name in architectures if name in takes), None)


def converter_refusal(architectures: list[str], version: str | None = None) -> str | None:
    """Why the pinned converter does not take a model of these config.json architectures;
    None when it takes one of them."""
    version = version or pinned_version()
    if converted_architecture(architectures, version) is not None:
        return None
    named = ", ".join(architectures) or "none (config.json names no architectures)"
    return f"llama.cpp {version}'s convert_hf_to_gguf.py does not take the architecture {named}"


def default_output(model: str, quantize: Quantize) -> Path:
    """NAME-Q8_0.gguf in the working folder, NAME the model folder's or repository's name."""
    name = Path(model.rstrip("/")).name or "model"
    return Path.cwd() / f"{name}-{quantize.upper()}.gguf"


def installed_converter(runtime_dir: Path) -> Path:
    """runtime_dir/converter, as the runtime recipe installs it from the pinned source."""
    converter = runtime_dir / CONVERTER_DIR
    if not (converter / ".source").is_file() or not (converter / CONVERTER_SCRIPT).is_file():
        raise Refusal(
            f"no llama.cpp converter beside llama-server in {runtime_dir}",
            file=converter,
            fix="run the llama.cpp runtime's recipe again (packaging/install.sh --engine "
            "llama.cpp): it keeps the built server and installs the converter from its source",
        )
    return converter


def check_python(python: str) -> None:
    """Refused unless `python` runs and imports what the converter imports."""
    code = "import " + ", ".join(CONVERTER_MODULES)
    try:
        done = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=120)
    except OSError as exc:
        raise Refusal(
            f"the converter's Python {python} does not run: {exc.strerror}",
            key="--python",
            fix=PYTHON_FIX,
        ) from None
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise Refusal(
            f"the converter's Python {python} lacks what it imports ({last})",
            key="--python",
            fix=PYTHON_FIX,
        )


PYTHON_FIX = (
    "install the vLLM runtime (packaging/install.sh --runtime), whose Python has torch and "
    "transformers, or give --python PATH of a Python that has torch, transformers, numpy and "
    "sentencepiece"
)


def model_folder(
    model: str, revision: str | None, token: str | None, say: Say
) -> tuple[Path, str | None]:
    """The model's folder with its weights and tokenizer, and the hub revision it is at: a
    folder as given; a hub id downloaded into the HF cache (resumed where a download
    stopped), or read from it offline."""
    source = locate_model(model, revision=revision, token=token)
    if model.startswith("/"):
        return source.folder, None
    from huggingface_hub import snapshot_download

    env = HubEnvironment.from_environ()
    say(f"download {model} into {env.cache_dir} (resumes where it stopped)")
    folder = snapshot_download(
        model,
        revision=source.revision,
        cache_dir=env.cache_dir,
        ignore_patterns=NOT_WEIGHTS + NOT_WEIGHTS_FOLDERS,
        token=token,
        local_files_only=env.offline or not source.from_hub,
        endpoint=env.endpoint,
    )
    return Path(folder), source.revision


CONFIG_FIX = (
    "config.json is the model's Hugging Face config: a JSON object whose architectures is a "
    'list of names, e.g. "architectures": ["LlamaForCausalLM"]; download the model again'
)


def architectures_of(folder: Path) -> list[str]:
    """config.json's `architectures`, read through epycd/readfile.py (a regular file of at
    most `MODEL_JSON_MAX_BYTES`, a JSON object); a list of names or nothing."""
    config = folder / "config.json"
    try:
        data = read_json_object(config, MODEL_JSON_MAX_BYTES, fix=CONFIG_FIX)
    except OSError as exc:
        raise InputError(
            f"config.json cannot be read: {exc.strerror or exc}", file=config, fix=CONFIG_FIX
        ) from None
    names = data.get("architectures")
    if names is None:
        return []
    if not isinstance(names, list) or not all(isinstance(name, str) for name in names):
        raise InputError(
            f"is {json.dumps(names)[:80]}, not a list of architecture names",
            file=config,
            key="architectures",
            fix=CONFIG_FIX,
        )
    return names


@contextmanager
def written_whole(output: Path) -> Iterator[Path]:
    """OUTPUT.part to write; renamed to OUTPUT when the block ends well, removed when not."""
    partial = output.with_name(output.name + ".part")
    partial.unlink(missing_ok=True)
    try:
        yield partial
        os.replace(partial, output)
    finally:
        partial.unlink(missing_ok=True)


def run_tool(argv: list[str], what: str, say: Say, env: dict[str, str] | None = None) -> None:
    """Run one of llama.cpp's tools, its output passed to `say` line by line; refused with
    its last lines when it fails."""
    tail: list[str] = []
    with subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
    ) as process:
        assert process.stdout is not None
        for line in process.stdout:
            line = line.rstrip()
            if line:
                say(f"  {line}")
                tail = [*tail[-(TAIL_LINES - 1) :], line]
    if process.returncode != 0:
        reason = next((t for t in reversed(tail) if "Error" in t or "error" in t), None)
        reason = reason or (tail or ["no output"])[-1]
        known = next((words for k, words in KNOWN_FAILURES.items() if k in reason), None)
        refusal = ConverterRefused if known else Refusal
        raise refusal(
            f"{what} failed (exit {process.returncode}): "
            + (f"{known} ({reason})" if known else reason),
            fix="the lines above say why; no file was written",
        )


class Stamp(BaseModel):
    """What a kept bf16 step was made from: another model, revision, file or llama.cpp is
    another stamp, and the step is made again."""

    folder: str
    revision: str | None
    files: list[SourceFile]
    llama_cpp: str


def stamp_of(folder: Path, revision: str | None) -> Stamp:
    files = converted_files(folder)
    return Stamp(folder=str(folder), revision=revision, files=files, llama_cpp=pinned_version())


def kept_step(whole: Path, stamp: Stamp) -> bool:
    """Whether `whole` is a finished step of this same conversion, kept by one cut short; a
    stamp that cannot be read (a FIFO, a device, too large, not a stamp) is no stamp."""
    try:
        kept = read_model(
            whole.with_name(whole.name + ".json"), RECORD_MAX_BYTES, Stamp, fix="converted again"
        )
    except (OSError, InputError):
        return False
    return whole.is_file() and kept == stamp


def bf16_step(
    python: str, script: str, folder: Path, whole: Path, stamp: Stamp, say: Say,
    env: dict[str, str],
) -> None:  # fmt: skip
    """`whole` as the bf16 file of `folder`, from a conversion cut short when it is there
    and stamped as this one; written whole, then stamped, when not."""
    if kept_step(whole, stamp):
        say(f"resume from {whole} (the bf16 step of a conversion that was cut short)")
        return
    whole.with_name(whole.name + ".json").unlink(missing_ok=True)
    say(f"convert {folder} to bf16 (llama.cpp's convert_hf_to_gguf.py)")
    with written_whole(whole) as partial:
        argv = [python, script, str(folder), "--outtype", "bf16", "--outfile", str(partial)]
        run_tool(argv, "convert_hf_to_gguf.py", say, env)
    write_atomic(whole.with_name(whole.name + ".json"), stamp.model_dump_json().encode())


def drop_step(whole: Path) -> None:
    whole.unlink(missing_ok=True)
    whole.with_name(whole.name + ".json").unlink(missing_ok=True)


WRITTEN_BESIDE = (".part", ".bf16", ".bf16.json", ".bf16.part", ".json", ".refused.json")
"""The files a conversion (and approve's records) write beside OUTPUT."""


def refuse_overwriting_source(output: Path, folder: Path, files: list[SourceFile]) -> None:
    """An InputError when OUTPUT, or a file written beside it, is the model folder or one
    of the files the conversion reads: as named, resolved, or the same inode (a hard link).
    Nothing has been written yet."""
    sources = [folder / file.name for file in files]
    named = {os.path.abspath(path) for path in sources} | {os.path.realpath(folder)}
    named |= {os.path.realpath(path) for path in sources}
    inodes = set()
    for path in sources:
        try:
            info = os.stat(path)
        except OSError:
            continue
        inodes.add((info.st_dev, info.st_ino))
    for written in [output, *(output.with_name(output.name + end) for end in WRITTEN_BESIDE)]:
        try:
            info = os.stat(written)
        except OSError:
            same_inode = False
        else:
            same_inode = (info.st_dev, info.st_ino) in inodes
        if same_inode or {os.path.abspath(written), os.path.realpath(written)} & named:
            raise InputError(
                f"would overwrite the model's own {written} (the model folder {folder} is "
                "what the conversion reads)",
                file=output,
                key="--output",
                fix="give --output a new file outside the model folder, e.g. "
                f"{Path.cwd() / output.name}",
            )


def read_source(model: str, folder: Path, at: str | None, say: Say) -> ConvertedSource:
    """The source as the converter will read it: its identity, its files and their
    content's digest (the weights read once more)."""
    say(f"hash the files of {folder} (what the converted file is bound to)")
    try:
        source = read_converted_source(model, folder, at)
    except OSError as exc:
        raise InputError(
            f"a file of the model cannot be read: {exc.strerror or exc}",
            file=exc.filename or folder,
            fix="a model's files are regular files (or links to them): download it again",
        ) from None
    refuse_changed_source(source, folder, "while it was read")
    return source


def refuse_changed_source(source: ConvertedSource, folder: Path, when: str) -> None:
    if converted_files(folder) != source.files:
        raise Refusal(
            f"the model's files changed {when}",
            file=folder,
            fix="convert again once the model is whole (a download or copy still running?)",
        )


def convert(
    model: str,
    *,
    runtime_dir: Path,
    python: str,
    quantize: Quantize = DEFAULT_QUANTIZE,
    output: Path | None = None,
    revision: str | None = None,
    token: str | None = None,
    say: Say = lambda text: None,
) -> Conversion:
    """`model` (a hub id or a folder of safetensors) as one GGUF file at `output`, with
    what it was made from (`Conversion.converted_from`)."""
    started = time.monotonic()
    output = (output or default_output(model, quantize)).absolute()
    if not output.parent.is_dir():
        raise InputError(
            "the output's folder does not exist", file=output.parent, key="--output",
            fix="create it, or give --output in an existing folder",
        )  # fmt: skip
    quantizer = runtime_dir / "bin" / "llama"
    if quantize in QUANTIZER_TYPE and not os.access(quantizer, os.X_OK):
        raise Refusal(
            f"{quantize} needs llama.cpp's quantizer, and {quantizer} is not there",
            fix="build the llama.cpp runtime (packaging/install.sh --engine llama.cpp)",
        )
    folder, at = model_folder(model, revision, token, say)
    refuse_overwriting_source(output, folder, converted_files(folder))
    architectures = architectures_of(folder)
    architecture = converted_architecture(architectures)
    if architecture is None:
        refusal = converter_refusal(architectures) or ""
        raise Refusal(refusal, file=folder / "config.json", fix="serve it with vLLM")
    converter = installed_converter(runtime_dir)
    check_python(python)
    source = read_source(model, folder, at, say)
    env = {**os.environ, "PYTHONPATH": str(converter / "gguf-py")}
    script = str(converter / CONVERTER_SCRIPT)
    with written_whole(output) as partial:
        if quantize in QUANTIZER_TYPE:
            whole = output.with_name(output.name + ".bf16")
            bf16_step(python, script, folder, whole, stamp_of(folder, at), say, env)
            say(f"quantize to {QUANTIZER_TYPE[quantize]} (llama quantize)")
            argv = [str(quantizer), "quantize", str(whole), str(partial), QUANTIZER_TYPE[quantize]]
            run_tool(argv, "llama quantize", say)
        else:
            say(f"convert {folder} to {quantize} (llama.cpp's convert_hf_to_gguf.py)")
            argv = [
                python, script, str(folder), "--outtype", CONVERTER_OUTTYPE[quantize],
                "--outfile", str(partial),
            ]  # fmt: skip
            run_tool(argv, "convert_hf_to_gguf.py", say, env)
        refuse_changed_source(source, folder, "while it was converted")
    if quantize in QUANTIZER_TYPE:
        drop_step(output.with_name(output.name + ".bf16"))
    return Conversion(
        model=model,
        architecture=architecture,
        quantize=quantize,
        output=str(output),
        bytes=output.stat().st_size,
        sha256=read_sha256(output),
        seconds=round(time.monotonic() - started, 1),
        llama_cpp=pinned_version(),
        converted_from=source,
    )
