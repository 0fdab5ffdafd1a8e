"""A stand-in for llama-server's memory pass (docs/tuning.md rule 9), run by the plan tests'
llama-server (`tests.plan.test_llama_plan.fake_llama_server`) for every call but --version.

The plan tests' GGUF files (tests/model/gguf_files.py) hold metadata and a few tensors of the
test's chosen shape: llama.cpp itself cannot load them (no tokenizer model, most tensors
missing), and it would refuse them with its own reason, as the plan then does. This prints
what llama-server's `--fit on` pass prints for a file it loads, the memory table and the
pass's end line, its figures from the measured formulas (epycd/engines/llama_cpp/model/memory.py,
which tests/llama/test_fit_params.py holds to the real pass on real files), rounded down to
the MiB as llama.cpp prints them; for a file the formulas do not cover, nothing, exit 1 (what
llama.cpp does, more often than not, with a file it cannot load). The real pass on real files:
tests/llama and the e2e."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from epycd.engines.llama_cpp.model.gguf import read_gguf
from epycd.engines.llama_cpp.model.memory import UnmeasuredModel, llama_memory
from epycd.engines.llama_cpp.plan.fit import SERVER_FIT_DONE

MIB = 1024**2


def cpu_flags() -> set[str]:
    """This machine's, as llama.cpp's CPU backend sees them (not a test's identity root)."""
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


LINE = "0.00.000.000 I common_memory_breakdown_print: "


def words(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--model", required=True)
    parser.add_argument("--parallel", type=int, required=True)
    parser.add_argument("--ctx-size", type=int, required=True)
    parser.add_argument("--ubatch-size", type=int, required=True)
    parser.add_argument("--embeddings", action="store_true")
    parser.add_argument("--rerank", action="store_true")
    return parser.parse_known_args(argv)[0]


def main(argv: list[str]) -> int:
    said = words(argv)
    gguf = read_gguf(Path(said.model))
    try:
        memory = llama_memory(
            gguf, context=said.ctx_size, slots=said.parallel, cpu_flags=cpu_flags(),
            ubatch=said.ubatch_size, shared_pool=True,
            embeddings=said.embeddings or said.rerank,
        )  # fmt: skip
    except UnmeasuredModel:
        return 1  # as llama.cpp, more often than not, on a file it cannot load: exit 1, silent
    mapped, repacked = memory.weights_bytes // MIB, memory.repacked_bytes // MIB
    kv, compute = memory.kv_bytes // MIB, memory.compute_bytes // MIB
    host = mapped - repacked
    table = [
        "| memory breakdown [MiB] | total   free    self   model   context   compute"
        "    unaccounted |",
        f"|   - Host               |  {host + kv + compute:6} = {host:6} + {kv:6} + {compute:6}  |",
        f"|   - CPU_REPACK         |  {repacked:6} = {repacked:6} + {0:6} + {0:6}  |",
    ]
    print("\n".join(LINE + row for row in table), file=sys.stderr)
    print(f"0.00.000.000 I {SERVER_FIT_DONE} 0.00 seconds", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
