"""Model facts: what the planner needs to know about a model (docs/architecture.md, "Model facts").

The contract between the model stage and the planner; `check-model --json` and
`estimate --json` are built from these.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

ModelKind = Literal[
    "text",
    "multimodal",
    "embedding",
    "rerank",
    "classify",
    "pooling",
    "unsupported",
    "undetermined",
]
"""What a model is to its engine. `embedding`, `rerank` and `classify` are the pooling models
it serves as such; `pooling` one it runs but not on an endpoint epyc-llm gives (a reward or
token-classification head, a late-interaction retriever)."""
TemplateStatus = Literal["present", "absent", "ambiguous", "unknown"]
Endpoint = Literal["chat_completions", "completions", "embeddings", "rerank", "score"]
POOLING_ENDPOINTS: tuple[Endpoint, ...] = ("embeddings", "rerank")
WeightsFormat = Literal["safetensors", "gguf"]


class ChatTemplate(BaseModel):
    status: TemplateStatus
    names: list[str] = Field(default_factory=list)
    source: str | None = Field(
        default=None, description="chat_template.jinja, tokenizer_config.json or the endpoint file"
    )


class Support(BaseModel):
    """vLLM's answer for the model's architectures at one vLLM version."""

    supported: bool | None
    kind: ModelKind
    vllm_version: str
    table_version: str | None = Field(
        default=None, description="the data/ table used (None when a real vLLM answered)"
    )
    source: Literal["table", "installed-vllm"] = "table"
    warnings: list[str] = Field(default_factory=list)


class GgufFile(BaseModel):
    """What one GGUF file says of itself (`epycd.engines.llama_cpp.model.gguf.read_gguf`)."""

    path: str = Field(description="where it was read: the local file or its HF cache blob")
    file: str = Field(description="its name, as the admin gave it")
    size_bytes: int
    architecture: str = Field(description="general.architecture, as the server names it")
    name: str | None = Field(default=None, description="general.name")
    file_type: str | None = Field(
        default=None, description="the file's quantization (general.file_type): Q4_K_M, BF16"
    )
    tensor_types: dict[str, int] = Field(description="ggml tensor type -> how many tensors")
    tensors_bytes: int = Field(description="the tensors' bytes: what the server maps")
    context_length: int | None = None
    block_count: int | None = None
    embedding_length: int | None = None
    head_count: int | None = None
    head_count_kv: list[int] | None = Field(
        default=None, description="KV heads, one value or one per layer"
    )
    key_length: int | None = None
    value_length: int | None = None
    sliding_window: int | None = None
    feed_forward_length: int | None = Field(
        default=None, description="the FFN's width (the widest layer's where it varies)"
    )
    vocab_size: int | None = Field(default=None, description="the tokenizer's tokens")
    repackable_bytes: dict[str, int] = Field(
        default_factory=dict,
        description="ggml tensor type -> bytes of the matrices the server's CPU backend may "
        "repack into a copy of its own: every weight matrix but the token embeddings whose "
        "rows are a multiple of 8 (its engine's model/memory.py, repacked_bytes)",
    )
    chat_template: bool = Field(description="tokenizer.chat_template is in the file")
    pooling_type: str | None = Field(
        default=None,
        description="{arch}.pooling_type as llama.cpp names it (none, mean, cls, last, rank): "
        "an embedder's or, rank, a reranker's; None where the file gives none",
    )
    classifier_outputs: int | None = Field(
        default=None,
        description="the outputs of the file's classifier head (cls.output.weight), which a "
        "converted sequence classifier carries: one for a reranker such as bge-reranker; "
        "None without a head",
    )


class EngineSupport(BaseModel):
    """Whether one engine can serve the model as a chat or completions endpoint, and why."""

    engine: str = Field(description="a registered engine's name (epycd.engines)")
    version: str = Field(description="the engine version (or pinned source) asked")
    supported: bool | None
    kind: ModelKind
    reason: str


class ModelFacts(BaseModel):
    model: str = Field(description="hub id or absolute path, as given")
    format: WeightsFormat = "safetensors"
    gguf: GgufFile | None = Field(default=None, description="the GGUF file's own facts")
    engines: list[EngineSupport] = Field(
        default_factory=list, description="each engine's answer (vLLM's is also `support`)"
    )
    revision: str | None = Field(default=None, description="the commit the facts were read at")
    local_path: str | None = Field(default=None, description="snapshot or model folder")
    architectures: list[str]
    model_type: str | None = None
    torch_dtype: str | None = None
    support: Support
    chat_template: ChatTemplate
    primary_endpoint: Endpoint | None
    supported_endpoints: list[Endpoint]
    launchable: bool
    gated: bool | None = None
    weights_bytes: int | None
    weights_source: Literal[
        "safetensors-header", "safetensors-index", "hub-metadata", "derived", "gguf-tensors"
    ]
    kv_bytes_per_token: int
    max_position_embeddings: int | None
    max_input_tokens: int | None = Field(
        default=None,
        description="an embedder's or reranker's longest input as its engine derives it (vLLM: "
        "sentence-transformers' max_seq_length, else the positions under the tokenizer's "
        "model_max_length); None for a generating model",
    )
    embedding_width: int | None = Field(
        default=None,
        description="the numbers in each vector of an embedding model, where its files say "
        "(the hidden size, no projection after it); None elsewhere",
    )
    is_mla: bool = False
    message: str = ""
    warnings: list[str] = Field(default_factory=list)

    @property
    def pooling(self) -> bool:
        """An embedder or a reranker: one forward pass over the input, no tokens generated."""
        return self.primary_endpoint in POOLING_ENDPOINTS


class MemoryFit(BaseModel):
    """The fit of weights + KV pool + vLLM's runtime + OS headroom in one socket's memory, GiB.
    The first three are the server's process tree at its peak (`process_gb`)."""

    weights_gb: float
    kv_bytes_per_token: int
    context: int = Field(description="min(max_model_len, max positions)")
    max_num_seqs: int
    kv_gb: float = Field(description="KV the requested context x sequences needs")
    kv_pool_gb: int = Field(
        description="the KV pool vLLM is given: what the sequences need, within the cap"
    )
    kv_pool_cap_gb: int = Field(
        default=0, description="the most the pool may take on these NUMA nodes (tuner's share)"
    )
    headroom_gb: float = Field(description="the OS's share, apart from the server's tree")
    runtime_gb: float = Field(
        default=0.0, description="vLLM's own processes beside weights and KV (data/footprint)"
    )
    process_gb: float = Field(
        default=0.0,
        description="the server's tree at its peak: weights + pool (the one the sequences "
        "need when it does not fit) + runtime",
    )
    required_gb: float = Field(description="process_gb + headroom_gb")
    available_gb: float
    fits: bool
    suggested_max_model_len: int | None
    action: str
