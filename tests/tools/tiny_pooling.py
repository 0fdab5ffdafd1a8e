"""A tiny BERT embedder and a tiny BERT reranker for the pooling tests, built offline and
deterministically with transformers (run under the vLLM venv's Python, which has it).

Both are hidden 128, 2 layers, 4 heads, intermediate 256, 512 positions, seeded random bf16
weights, with a WordPiece tokenizer of 2,048 tokens trained on a fixed set of this
interpreter's stdlib sources (`[CLS] A [SEP] B [SEP]`, as BERT's). The embedder is a
`BertModel` (vLLM: `_EMBEDDING_MODELS`, /v1/embeddings); the reranker a
`BertForSequenceClassification` of one label (a cross-encoder: /v1/rerank and /v1/score).
vLLM's `--runner auto` serves each as a pooling model. A third, `qwen3-embedder`, is a
Qwen3ForCausalLM with sentence-transformers' last-token pooling module, as Qwen3-Embedding:
a text generator's architecture that its modules.json makes an embedder.

    python tests/tools/tiny_pooling.py --out DIR     # DIR/embedder, reranker, qwen3-embedder
"""

from __future__ import annotations

import argparse
import sys
import sysconfig
from pathlib import Path
from typing import Any

SEED = 20261205
VOCAB = 2048
SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
CORPUS_MODULES = ["textwrap.py", "argparse.py", "string.py", "this.py", "json/decoder.py"]
SHAPE = {
    "hidden_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "intermediate_size": 256,
    "max_position_embeddings": 512,
}


def tokenizer() -> Any:
    """BERT's WordPiece, trained here, as transformers' fast tokenizer."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast  # type: ignore[import-not-found]

    stdlib = Path(sysconfig.get_paths()["stdlib"])
    corpus = [(stdlib / name).read_text(encoding="utf-8") for name in CORPUS_MODULES]
    trained = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    trained.normalizer = normalizers.BertNormalizer(lowercase=True)
    trained.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    trainer = trainers.WordPieceTrainer(
        vocab_size=VOCAB, special_tokens=SPECIAL, show_progress=False
    )
    trained.train_from_iterator(corpus, trainer)
    cls, sep = trained.token_to_id("[CLS]"), trained.token_to_id("[SEP]")
    trained.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls), ("[SEP]", sep)],
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=trained,
        unk_token="[UNK]",
        pad_token="[PAD]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        mask_token="[MASK]",
        model_max_length=SHAPE["max_position_embeddings"],
    )


def build(out: Path) -> None:
    # the vLLM venv's, never the test .venv's (no stubs: mypy skips them)
    import torch  # type: ignore[import-not-found]
    from transformers import (
        BertConfig,
        BertForSequenceClassification,
        BertModel,
    )

    words = tokenizer()
    for name, model_class, labels in (
        ("embedder", BertModel, 2),
        ("reranker", BertForSequenceClassification, 1),
    ):
        torch.manual_seed(SEED)
        config = BertConfig(vocab_size=len(words), num_labels=labels, **SHAPE)
        model = model_class(config).to(torch.bfloat16)
        model.save_pretrained(out / name)
        words.save_pretrained(out / name)
    build_decoder_embedder(out / "qwen3-embedder", words)


QWEN3_SHAPE = {
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "max_position_embeddings": 2048,
    "tie_word_embeddings": True,
}
SENTENCE_TRANSFORMERS_MODULES = [
    {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
    {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
]


def build_decoder_embedder(folder: Path, words: Any) -> None:
    """A Qwen3ForCausalLM shipped as a sentence-transformers embedder with last-token pooling,
    as Qwen3-Embedding is: its architecture is a text generator, its modules.json and pooling
    module make it an embedder (vLLM: a pooling config resolves `--runner auto` to pooling and
    converts the model with `--convert embed`)."""
    import json

    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(SEED)
    config = Qwen3Config(vocab_size=len(words), **QWEN3_SHAPE)
    Qwen3ForCausalLM(config).to(torch.bfloat16).save_pretrained(folder)
    words.save_pretrained(folder)
    (folder / "modules.json").write_text(json.dumps(SENTENCE_TRANSFORMERS_MODULES, indent=1))
    (folder / "1_Pooling").mkdir()
    pooling = {"word_embedding_dimension": QWEN3_SHAPE["hidden_size"],
               "pooling_mode_lasttoken": True, "pooling_mode_mean_tokens": False,
               "pooling_mode_cls_token": False}  # fmt: skip
    (folder / "1_Pooling" / "config.json").write_text(json.dumps(pooling, indent=1))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="folder of the two models")
    args = parser.parse_args()
    build(args.out)
    print(f"tiny pooling models: {args.out}/embedder, reranker and qwen3-embedder")
    return 0


if __name__ == "__main__":
    sys.exit(main())
