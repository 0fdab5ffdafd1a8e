"""llama.cpp's share of approve (`PREREQUISITES`, `epycd.approval.prerequisites`): the GGUF
file of a safetensors model a llama.cpp endpoint serves, converted by the pinned source's own
converter into the converted folder (docs/conversion.md), with its record beside it."""

from __future__ import annotations

from pathlib import Path

from epycd.approval.prerequisites import PlanChanged, PrerequisiteMaker, Say
from epycd.atomic import make_dirs
from epycd.engines.llama_cpp.model.convert import ConverterRefused, convert
from epycd.engines.llama_cpp.model.format import pinned_version
from epycd.engines.llama_cpp.plan.converted import quantize_of, write_record, write_refused
from epycd.engines.llama_cpp.settings import LlamaSettings
from epycd.plan.prepared import Prerequisite
from epycd.plan.service.secrets import read_root_only
from epycd.settings import Settings, trusted_admin_gid


def prerequisite_token(prerequisite: Prerequisite, settings: Settings) -> str | None:
    """The endpoint's HF token for the download (its root-only hf_token_file, read as the
    planner read it: root's, or readable by epycd.conf's admin group too); never passed on
    but to huggingface_hub."""
    if prerequisite.hf_token_file is None:
        return None
    path = Path(prerequisite.hf_token_file)
    group = trusted_admin_gid(settings.daemon_conf)
    return read_root_only(path, path, "hf_token_file", "the token", group_gid=group) or None


class LlamaConversion(PrerequisiteMaker):
    def describe(self, prerequisite: Prerequisite) -> str:
        return (
            f"convert {prerequisite.model} to a {prerequisite.quantize} GGUF file "
            f"({prerequisite.output}) with llama.cpp's converter"
        )

    def make(self, prerequisite: Prerequisite, settings: Settings, say: Say) -> None:
        output = Path(prerequisite.output)
        make_dirs(output.parent)
        quantize = quantize_of(prerequisite.quantize)
        try:
            done = convert(
                prerequisite.model,
                runtime_dir=LlamaSettings.of(settings).llama_runtime_dir,
                python=str(settings.runtime_dir / "bin" / "python"),
                quantize=quantize,
                output=output,
                revision=prerequisite.revision,
                token=prerequisite_token(prerequisite, settings),
                say=say,
            )
        except ConverterRefused as refused:
            recorded = write_refused(
                output, prerequisite.model, prerequisite.revision, quantize, pinned_version(),
                refused.message,
            )  # fmt: skip
            raise PlanChanged(
                f"{refused.message}; recorded in {recorded}: the plan passes llama.cpp over "
                "for this model",
                fix=refused.fix,
            ) from None
        write_record(done, prerequisite.revision)
        say(f"converted: {done.output} ({done.bytes / 2**20:.1f} MiB in {done.seconds:.1f} s)")


PREREQUISITES = LlamaConversion()
