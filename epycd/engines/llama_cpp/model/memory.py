"""The memory one llama-server process holds, from a GGUF file's own facts and the server's
settings: what a llama.cpp endpoint's fit counts (`epycctl estimate`; docs/tuning.md rule 9).

Every term is what the pinned llama.cpp allocates, measured against its own log and the
process's PSS (benchmarks/llama-memory-results.md, `benchmarks/llama_compute.py`):

- weights: the file's tensors, memory-mapped (every page counts once the model has run);
- repacked weights: llama.cpp's CPU backend copies some quantized matrices into a layout of
  its own (`CPU_REPACK`, anonymous memory beside the mapping): on x86 with AVX2 the Q4_0,
  Q4_K, IQ4_NL and MXFP4 matrices, with AVX-512 also Q2_K, each whose rows are a multiple of 8
  (ggml-cpu/repack.cpp; exact on the four files measured);
- KV: the pool's cells x the f16 K and V of a token in every layer (`kv_bytes_per_token`);
- compute: the graph's scratch for one ubatch, `ubatch x (4 B x (3 FFN + 3 hidden + attention
  width) + 20 B + 2 B x cells) + 4 KiB`: the activations of a layer (exact on 8 of 10 shapes
  of the llama, qwen2 and qwen3 architectures, above the server's on the other 2), the f16
  attention mask over the cells and the graph's inputs; for a BERT encoder (no KV cache)
  `ubatch x (4 B x max(FFN + 3 hidden, 5.5 hidden) + 48 B + 2 B x ubatch) + 4 B x ubatch x
  slots + 4 KiB`; measured for those architectures only;
- output: the logits of one token per slot (vocabulary x slots x 4 B: the server reserves
  one output per slot), and serving embeddings its vector too (+ width x slots x 4 B);
- the server itself: code, threads, tokenizer, HTTP (about 60 MiB of PSS beside the buffers
  on a 0.5B model).
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Literal

from pydantic import BaseModel, Field

from epycd.model.facts import GgufFile

MIB = 1024**2
KV_CACHE_DTYPE_BYTES = 2
"""f16: llama-server's default cache type for K and V (`--cache-type-k/-v f16`)."""
CELL_PADDING = 256
"""llama.cpp rounds the context (the pool's cells) up to a multiple of 256."""
DEFAULT_UBATCH = 512
"""llama-server's physical batch (`-ub`): the tokens one graph runs at most."""
SERVER_BYTES = 64 * MIB
"""llama-server's own PSS beside its buffers (58-63 MiB measured on a 0.5B model)."""
DECODER_ARCHITECTURES = frozenset({"llama", "qwen2", "qwen3"})
"""The decoders whose compute buffer the formula was measured on."""
ENCODER_ARCHITECTURES = frozenset({"bert"})
"""The encoders whose compute buffer the encoder formula was measured on. llama.cpp gives an
encoder no KV cache: its attention spans the one ubatch it reads (llama-model.cpp
`create_memory`)."""
COMPUTE_ARCHITECTURES = DECODER_ARCHITECTURES | ENCODER_ARCHITECTURES
REPACKED_WITH_AVX2 = frozenset({"Q4_0", "Q4_K", "IQ4_NL", "MXFP4"})
REPACKED_WITH_AVX512 = frozenset({"Q2_K"})
ACTIVATION_BYTES = 4
MASK_BYTES = 2
GRAPH_INPUT_BYTES = 20
GRAPH_BYTES = 4096
"""The graph's small inputs (positions, output ids): 20 B per ubatch token and 4 KiB, fitted
to the log's 0.01 MiB at ubatch 256, 512 and 1024."""
ENCODER_ATTENTION_WIDTHS = 5.5
"""An encoder layer's attention phase holds 5.5 hidden widths per token (q, k, v, their f16
copies for flash attention, the output and the residual), its FFN phase the FFN's width and
3 hidden widths: the buffer is the larger of the two (fitted to 14 shapes' logs)."""
ENCODER_INPUT_BYTES = 48
"""An encoder's graph inputs per ubatch token (positions, token types, the pooling's
indices): fitted above the logs of 14 shapes at ubatch 256 to 2048."""


def kv_bytes_per_token(facts: GgufFile, dtype_bytes: int = KV_CACHE_DTYPE_BYTES) -> int | None:
    """The f16 KV cache one token takes in every layer, as llama.cpp allocates it: per layer,
    K of `key_length x kv_heads` and V of `value_length x kv_heads`; the head length defaults
    to `embedding_length / head_count`, the KV heads to the heads. None when the file lacks
    the figures (a recurrent model has a fixed state, not a per-token cache); 0 for an
    encoder, which has no cache."""
    if facts.architecture in ENCODER_ARCHITECTURES:
        return 0
    layers = facts.block_count
    head_dim = None
    if facts.embedding_length and facts.head_count:
        head_dim = facts.embedding_length // facts.head_count
    key = facts.key_length or head_dim
    value = facts.value_length or head_dim
    kv_heads = facts.head_count_kv or ([facts.head_count] if facts.head_count else None)
    if not layers or not key or not value or not kv_heads:
        return None
    per_layer = kv_heads if len(kv_heads) == layers else [kv_heads[0]] * layers
    return sum(heads * (key + value) for heads in per_layer) * dtype_bytes


class LlamaMemory(BaseModel):
    """One llama-server process's memory at its peak, bytes, by what holds it."""

    cells: int = Field(description="the KV pool's cells (-c, padded to 256): every slot's share")
    slots: int = Field(description="parallel sequences (-np)")
    ubatch: int = Field(description="the physical batch (-ub)")
    weights_bytes: int = Field(description="the file's tensors, mapped")
    repacked_bytes: int = Field(description="the quantized matrices the CPU backend copies")
    kv_bytes: int
    compute_bytes: int
    output_bytes: int
    server_bytes: int = SERVER_BYTES
    source: Literal["llama.cpp", "formulas"] = Field(
        default="formulas",
        description="llama.cpp: llama-server's own pass at the plan's words; formulas: the "
        "measured formulas, where there is no llama-server to ask (rule 9)",
    )

    @property
    def total_bytes(self) -> int:
        return (
            self.weights_bytes
            + self.repacked_bytes
            + self.kv_bytes
            + self.compute_bytes
            + self.output_bytes
            + self.server_bytes
        )


def padded_cells(tokens: int) -> int:
    return -(-tokens // CELL_PADDING) * CELL_PADDING


def repacked_bytes(gguf: GgufFile, cpu_flags: Collection[str]) -> int:
    """The bytes llama.cpp's CPU backend repacks on a CPU with these /proc/cpuinfo flags."""
    types: set[str] = set()
    if "avx2" in cpu_flags:
        types |= REPACKED_WITH_AVX2
    if "avx512f" in cpu_flags:
        types |= REPACKED_WITH_AVX512
    return sum(size for kind, size in gguf.repackable_bytes.items() if kind in types)


def compute_bytes(gguf: GgufFile, cells: int, ubatch: int, slots: int = 1) -> int | None:
    """The compute buffer llama-server reserves, or None where the formula was not measured
    (another architecture, or figures the file lacks)."""
    hidden, ffn, heads = gguf.embedding_length, gguf.feed_forward_length, gguf.head_count
    if not hidden or not ffn or not heads:
        return None
    if gguf.architecture in ENCODER_ARCHITECTURES:
        return encoder_compute_bytes(hidden, ffn, ubatch, slots)
    if gguf.architecture not in DECODER_ARCHITECTURES:
        return None
    attention = heads * (gguf.key_length or hidden // heads)
    per_token = ACTIVATION_BYTES * (3 * ffn + 3 * hidden + attention) + GRAPH_INPUT_BYTES
    return ubatch * (per_token + MASK_BYTES * cells) + GRAPH_BYTES


def encoder_compute_bytes(hidden: int, ffn: int, ubatch: int, slots: int) -> int:
    """An encoder's compute buffer: a layer's activations at the larger of its two phases,
    the f16 mask of its attention over the ubatch itself (no cells: no cache), the pooling's
    f32 matrix of ubatch x slots, and the graph's inputs."""
    widest = max(ffn + 3 * hidden, ENCODER_ATTENTION_WIDTHS * hidden)
    per_token = int(ACTIVATION_BYTES * widest) + ENCODER_INPUT_BYTES
    pooling = ACTIVATION_BYTES * ubatch * slots
    return ubatch * (per_token + MASK_BYTES * ubatch) + pooling + GRAPH_BYTES


class UnmeasuredModel(ValueError):
    """A figure of the fit is unknown for this file: the reason says which."""


def llama_memory(
    gguf: GgufFile,
    *,
    context: int,
    slots: int,
    cpu_flags: Collection[str],
    ubatch: int = DEFAULT_UBATCH,
    shared_pool: bool = False,
    embeddings: bool = False,
) -> LlamaMemory:
    """The memory of llama-server serving `slots` sequences of up to `context` tokens each
    from one unified pool (`-c context x slots --kv-unified`), or with `shared_pool` from one
    pool of `context` cells that the slots share (`-c context --kv-unified`, the server's
    own default sizing). With `embeddings` (`--embeddings` or `--rerank`) each slot's output
    holds a vector of the model's width beside its logits."""
    per_token = kv_bytes_per_token(gguf)
    if per_token is None:
        raise UnmeasuredModel(
            f"the file gives no KV figures (layers, heads, head length) for {gguf.architecture}"
        )
    cells = padded_cells(context if shared_pool else context * slots)
    compute = compute_bytes(gguf, cells, ubatch, slots)
    if compute is None:
        raise UnmeasuredModel(
            f"llama.cpp's compute buffer is measured for {', '.join(sorted(COMPUTE_ARCHITECTURES))}"
            f" models, not {gguf.architecture} (benchmarks/llama_compute.py measures one)"
        )
    if not gguf.vocab_size:
        raise UnmeasuredModel("the file gives no vocabulary size (tokenizer.ggml.tokens)")
    return LlamaMemory(
        cells=cells,
        slots=slots,
        ubatch=ubatch,
        weights_bytes=gguf.tensors_bytes,
        repacked_bytes=repacked_bytes(gguf, cpu_flags),
        kv_bytes=cells * per_token,
        compute_bytes=compute,
        output_bytes=output_bytes(gguf.vocab_size, gguf.embedding_length, slots, embeddings),
    )


def output_bytes(vocab: int, width: int | None, slots: int, embeddings: bool) -> int:
    """The output buffer: one output per slot, its logits and, serving embeddings, its vector
    (llama-context.cpp `output_reserve`; exact on every case logged)."""
    return (vocab + (width or 0 if embeddings else 0)) * slots * ACTIVATION_BYTES
