"""Write a GGUF model of a real architecture's shape with random weights, for timing.

500 MB of weights cannot travel to a lent GPU machine (64 MiB per run), and step times do not
depend on the weights' values, so the GPU evidence writes its models there. The tokenizer (the
vocabulary, merges and chat template) is copied from a real GGUF, or from the small file
`--export-tokenizer` makes of one, so prompts tokenize as they would with the real model.
Matrices are stored as Q8_0 (one random matrix per shape, shared by the layers), norms and
biases as F32.

    python scripts/random-gguf.py --export-tokenizer tokenizer.json.gz --from model.gguf
    python scripts/random-gguf.py --shape qwen2.5-0.5b --tokenizer tokenizer.json.gz out.gguf
    python scripts/random-gguf.py --shape tiny --tokenizer tokenizer.json.gz tiny.gguf

Shapes: `qwen2.5-0.5b` (Fairlane's default model's shape); `llama-3.1-8b` (Llama 3.1 8B's
layers, with the Qwen2.5 vocabulary of the tokenizer given: 151,936 tokens against Llama 3's
128,256, so its output layer is 18% larger); `tiny` (two small layers, for rehearsals).
"""

from __future__ import annotations

import argparse
import gzip
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gguf
import numpy as np


@dataclass(frozen=True)
class Shape:
    arch: str
    layers: int
    hidden: int
    ffn: int
    heads: int
    kv_heads: int
    rope_base: float
    qkv_bias: bool


SHAPES = {
    "qwen2.5-0.5b": Shape("qwen2", 24, 896, 4864, 14, 2, 1_000_000.0, True),
    "llama-3.1-8b": Shape("llama", 32, 4096, 14336, 32, 8, 500_000.0, False),
    "tiny": Shape("qwen2", 2, 128, 256, 4, 2, 1_000_000.0, True),
}
TOKENIZER_KEYS = (
    "tokenizer.ggml.model", "tokenizer.ggml.pre", "tokenizer.ggml.tokens",
    "tokenizer.ggml.token_type", "tokenizer.ggml.merges", "tokenizer.ggml.eos_token_id",
    "tokenizer.ggml.padding_token_id", "tokenizer.ggml.bos_token_id",
    "tokenizer.ggml.add_bos_token", "tokenizer.chat_template",
)


def export_tokenizer(source: Path, out: Path) -> None:
    reader = gguf.GGUFReader(str(source))
    fields = {}
    for key in TOKENIZER_KEYS:
        if key in reader.fields:
            value = reader.fields[key].contents()
            fields[key] = value.tolist() if isinstance(value, np.ndarray) else value
    with gzip.open(out, "wt", encoding="utf-8") as handle:
        json.dump(fields, handle)


def load_tokenizer(path: Path) -> dict[str, Any]:
    if path.suffix == ".gguf":
        tmp = path.with_suffix(".tokenizer.json.gz")
        export_tokenizer(path, tmp)
        path = tmp
    with gzip.open(path, "rt", encoding="utf-8") as handle:
        return dict(json.load(handle))


def write(shape: Shape, tokenizer: dict[str, Any], out: Path, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    vocab = len(tokenizer["tokenizer.ggml.tokens"])
    head_dim = shape.hidden // shape.heads
    kv = shape.kv_heads * head_dim
    writer = gguf.GGUFWriter(str(out), shape.arch)
    writer.add_name(f"random {shape.arch} {shape.layers}x{shape.hidden}")
    writer.add_context_length(32768)
    writer.add_embedding_length(shape.hidden)
    writer.add_block_count(shape.layers)
    writer.add_feed_forward_length(shape.ffn)
    writer.add_head_count(shape.heads)
    writer.add_head_count_kv(shape.kv_heads)
    writer.add_rope_freq_base(shape.rope_base)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0)
    writer.add_tokenizer_model(tokenizer["tokenizer.ggml.model"])
    if "tokenizer.ggml.pre" in tokenizer:
        writer.add_tokenizer_pre(tokenizer["tokenizer.ggml.pre"])
    writer.add_token_list(tokenizer["tokenizer.ggml.tokens"])
    writer.add_token_types(tokenizer["tokenizer.ggml.token_type"])
    writer.add_token_merges(tokenizer["tokenizer.ggml.merges"])
    writer.add_eos_token_id(tokenizer["tokenizer.ggml.eos_token_id"])
    writer.add_bos_token_id(tokenizer["tokenizer.ggml.bos_token_id"])
    writer.add_pad_token_id(tokenizer["tokenizer.ggml.padding_token_id"])
    writer.add_add_bos_token(bool(tokenizer.get("tokenizer.ggml.add_bos_token", False)))
    if "tokenizer.chat_template" in tokenizer:
        writer.add_chat_template(tokenizer["tokenizer.chat_template"])

    made: dict[tuple[int, int], np.ndarray] = {}

    def matrix(name: str, rows: int, cols: int) -> None:
        # One random matrix per shape, used by every layer: the values do not change the
        # timing, and an 8B model is then written in seconds, not minutes.
        if (rows, cols) not in made:
            data = rng.standard_normal((rows, cols), dtype=np.float32) * 0.02
            made[rows, cols] = gguf.quants.quantize(data, gguf.GGMLQuantizationType.Q8_0)
        writer.add_tensor(name, made[rows, cols], raw_dtype=gguf.GGMLQuantizationType.Q8_0)

    def vector(name: str, size: int, value: float = 1.0) -> None:
        writer.add_tensor(name, np.full(size, value, dtype=np.float32))

    matrix("token_embd.weight", vocab, shape.hidden)
    for block in range(shape.layers):
        prefix = f"blk.{block}"
        vector(f"{prefix}.attn_norm.weight", shape.hidden)
        matrix(f"{prefix}.attn_q.weight", shape.hidden, shape.hidden)
        matrix(f"{prefix}.attn_k.weight", kv, shape.hidden)
        matrix(f"{prefix}.attn_v.weight", kv, shape.hidden)
        if shape.qkv_bias:
            vector(f"{prefix}.attn_q.bias", shape.hidden, 0.0)
            vector(f"{prefix}.attn_k.bias", kv, 0.0)
            vector(f"{prefix}.attn_v.bias", kv, 0.0)
        matrix(f"{prefix}.attn_output.weight", shape.hidden, shape.hidden)
        vector(f"{prefix}.ffn_norm.weight", shape.hidden)
        matrix(f"{prefix}.ffn_gate.weight", shape.ffn, shape.hidden)
        matrix(f"{prefix}.ffn_up.weight", shape.ffn, shape.hidden)
        matrix(f"{prefix}.ffn_down.weight", shape.hidden, shape.ffn)
    vector("output_norm.weight", shape.hidden)
    matrix("output.weight", vocab, shape.hidden)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", nargs="?", type=Path)
    parser.add_argument("--shape", choices=sorted(SHAPES), default="tiny")
    parser.add_argument("--tokenizer", type=Path, help="a GGUF, or a file --export-tokenizer made")
    parser.add_argument("--export-tokenizer", type=Path, help="write the tokenizer of --from here")
    parser.add_argument("--from", dest="source", type=Path, help="the GGUF to take it from")
    args = parser.parse_args()
    if args.export_tokenizer:
        export_tokenizer(args.source, args.export_tokenizer)
        return
    if args.out is None or args.tokenizer is None:
        parser.error("give the output file and --tokenizer")
    write(SHAPES[args.shape], load_tokenizer(args.tokenizer), args.out)


if __name__ == "__main__":
    main()
