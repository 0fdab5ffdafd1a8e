"""llama.cpp's own epycctl commands (`Engine.commands`). `epycctl convert MODEL`: a Hugging
Face model as a GGUF file for llama.cpp, by llama.cpp's own converter and quantizer from the
pinned source (docs/conversion.md)."""

from __future__ import annotations

from pathlib import Path

import click

from epycd.cli.options import TEXT, NonEmptyPath
from epycd.cli.output import json_option, print_json
from epycd.engines.llama_cpp.model.convert import DEFAULT_QUANTIZE, QUANTIZE, Quantize, convert


@click.command("convert")
@click.argument("model")
@click.option(
    "--quantize",
    type=click.Choice(QUANTIZE),
    default=DEFAULT_QUANTIZE,
    show_default=True,
    help="q8_0: near-lossless at half of bf16's size; q4_k_m: a quarter, as Ollama serves; "
    "bf16: the weights as trained",
)
@click.option(
    "--output",
    type=NonEmptyPath(dir_okay=False, path_type=Path),
    default=None,
    help="the GGUF file to write (default: NAME-QUANTIZE.gguf in this folder)",
)
@click.option("--revision", type=TEXT, default=None, help="branch, tag or commit (default main)")
@click.option(
    "--python",
    type=TEXT,
    default=None,
    help="a Python with torch and transformers to run the converter (default: the vLLM runtime's)",
)
@json_option("stable JSON for scripts")
def convert_command(
    model: str,
    quantize: Quantize,
    output: Path | None,
    revision: str | None,
    python: str | None,
    as_json: bool,
) -> None:
    """Convert MODEL (hub id or absolute folder, safetensors) to a GGUF file that a llama.cpp
    endpoint serves (engine = "llama.cpp", model = the file)."""
    from epycd.engines.llama_cpp.settings import LlamaSettings
    from epycd.settings import load_settings

    settings = load_settings()
    runtime_dir = LlamaSettings.of(settings).llama_runtime_dir
    interpreter = python or str(settings.runtime_dir / "bin" / "python")

    def say(text: str) -> None:
        click.echo(f"convert: {text}", err=True)

    done = convert(
        model,
        runtime_dir=runtime_dir,
        python=interpreter,
        quantize=quantize,
        output=output,
        revision=revision,
        say=say,
    )
    if as_json:
        print_json(done.model_dump())
        return
    click.echo(
        f"{done.output}: {done.architecture} as {done.quantize}, {done.bytes / 2**20:.1f} MiB "
        f"in {done.seconds:.1f} s (sha256 {done.sha256[:16]})"
    )
    click.echo(
        f'serve it: engine = "llama.cpp" and model = "{done.output}" in an endpoint file, or '
        f"epycctl quickstart --engine llama.cpp --model {done.output}"
    )
