"""Write a tiny random-weight Llama as GGUF, for a real llama-server to serve in tests.

No model hub is reachable, so the model is made here: the real Llama-2 vocabulary (shipped
in llama.cpp's sources as `ggml-vocab-llama-spm.gguf`) and small random weights. The text it
writes is noise, but the server does all of a real server's work: tokenising, batching,
prefill, decode, prompt caching, streaming and metrics.

    python tiny_llama.py GGUF_PY_DIR VOCAB_GGUF OUT_GGUF
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np

N_EMBD = 128
N_LAYER = 2
N_HEAD = 4
N_HEAD_KV = 2
N_FF = 256
N_CTX_TRAIN = 4096


def write_tiny_llama(
    gguf_py: Path, vocab_file: Path, out: Path, seed: int = 0, q8: bool = False
) -> Path:
    """Write the model to `out` (atomically) and return it. q8: the matrices in llama.cpp's
    Q8_0 (blocks of 32 int8 weights and one F16 scale), else F32. On a CPU, llama.cpp's F32
    matrices run one sequence on a vector path and two or more on a tiled one three times
    dearer per step (0.6 ms against 1.9 ms here), a step no GPU engine shows; its Q8_0 steps
    grow with the batch alone (0.8, 1.5, 2.7 ms for 1, 2, 4 sequences)."""
    sys.path.insert(0, str(gguf_py))
    import gguf  # the writer vendored with llama.cpp, so its format matches the server

    vocab = gguf.GGUFReader(str(vocab_file))
    tokens = [bytes(vocab.fields["tokenizer.ggml.tokens"].parts[i]) for i in _data(vocab, "tokens")]
    scores = [
        float(vocab.fields["tokenizer.ggml.scores"].parts[i][0]) for i in _data(vocab, "scores")
    ]
    types = [
        int(vocab.fields["tokenizer.ggml.token_type"].parts[i][0])
        for i in _data(vocab, "token_type")
    ]
    n_vocab = len(tokens)

    tmp = out.with_suffix(f".{os.getpid()}.tmp")  # concurrent writers never share a file
    writer = gguf.GGUFWriter(str(tmp), "llama")
    writer.add_name("tokenbench-tiny-llama")
    writer.add_context_length(N_CTX_TRAIN)
    writer.add_embedding_length(N_EMBD)
    writer.add_block_count(N_LAYER)
    writer.add_feed_forward_length(N_FF)
    writer.add_head_count(N_HEAD)
    writer.add_head_count_kv(N_HEAD_KV)
    writer.add_rope_dimension_count(N_EMBD // N_HEAD)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0 if q8 else gguf.LlamaFileType.ALL_F32)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_unk_token_id(0)

    rng = np.random.default_rng(seed)

    def weight(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.02).astype(np.float32)

    def add_matrix(name: str, data: np.ndarray) -> None:
        if q8:
            kind = gguf.GGMLQuantizationType.Q8_0
            writer.add_tensor(name, gguf.quants.quantize(data, kind), raw_dtype=kind)
        else:
            writer.add_tensor(name, data)

    head_dim = N_EMBD // N_HEAD
    add_matrix("token_embd.weight", weight(n_vocab, N_EMBD))
    writer.add_tensor("output_norm.weight", np.ones(N_EMBD, dtype=np.float32))
    add_matrix("output.weight", weight(n_vocab, N_EMBD))
    for i in range(N_LAYER):
        writer.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(N_EMBD, dtype=np.float32))
        add_matrix(f"blk.{i}.attn_q.weight", weight(N_EMBD, N_EMBD))
        add_matrix(f"blk.{i}.attn_k.weight", weight(N_HEAD_KV * head_dim, N_EMBD))
        add_matrix(f"blk.{i}.attn_v.weight", weight(N_HEAD_KV * head_dim, N_EMBD))
        add_matrix(f"blk.{i}.attn_output.weight", weight(N_EMBD, N_EMBD))
        writer.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(N_EMBD, dtype=np.float32))
        add_matrix(f"blk.{i}.ffn_gate.weight", weight(N_FF, N_EMBD))
        add_matrix(f"blk.{i}.ffn_up.weight", weight(N_FF, N_EMBD))
        add_matrix(f"blk.{i}.ffn_down.weight", weight(N_EMBD, N_FF))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    tmp.replace(out)
    return out


def _data(reader, name: str) -> list[int]:
    """Indexes of an array field's items among its parts."""
    return list(reader.fields[f"tokenizer.ggml.{name}"].data)


if __name__ == "__main__":
    write_tiny_llama(Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3]))
