"""llama.cpp's share of approve (`PREREQUISITES`, `epycd.approval.prerequisites`): the GGUF
file of a safetensors model a llama.cpp endpoint serves, converted by the pinned source's own
converter into the converted folder (docs/conversion.md), with its record beside it."""

from __future__ import annotations

from pathlib import Path

from epycd.approval.prerequisites import PrerequisiteMaker, Say
from epycd.atomic import make_dirs
from epycd.engines.llama_cpp.model.convert import convert
from epycd.engines.llama_cpp.plan.converted import quantize_of, write_record
from epycd.engines.llama_cpp.settings import LlamaSettings
from epycd.plan.prepared import Prerequisite
from epycd.settings import Settings


class LlamaConversion(PrerequisiteMaker):
    def describe(self, prerequisite: Prerequisite) -> str:
        return (
            f"convert {prerequisite.model} to a {prerequisite.quantize} GGUF file "
            f"({prerequisite.output}) with llama.cpp's converter"
        )

    def make(self, prerequisite: Prerequisite, settings: Settings, say: Say) -> None:
        output = Path(prerequisite.output)
        make_dirs(output.parent)
        done = convert(
            prerequisite.model,
            runtime_dir=LlamaSettings.of(settings).llama_runtime_dir,
            python=str(settings.runtime_dir / "bin" / "python"),
            quantize=quantize_of(prerequisite.quantize),
            output=output,
            revision=prerequisite.revision,
            say=say,
        )
        write_record(done, prerequisite.revision)
        say(f"converted: {done.output} ({done.bytes / 2**20:.1f} MiB in {done.seconds:.1f} s)")


PREREQUISITES = LlamaConversion()
