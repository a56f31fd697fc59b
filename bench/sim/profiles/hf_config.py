"""A model profile from a Hugging Face `config.json`, so a user simulates the model they serve
without writing a profile: `--model path/to/config.json` (or the directory holding it).

Read: layers, hidden size, attention heads, KV heads, head size, FFN size, experts and top-k
(Mixtral, Qwen-MoE, DeepSeek, gpt-oss, Llama 4's interleaved MoE layers and shared expert),
vocabulary, context, sliding-window layers (gpt-oss `layer_types`, Mistral `sliding_window`,
Llama 4's chunked layers), MLA (DeepSeek: kv_lora_rank, q_lora_rank, rope/nope/v head sizes)
and MTP layers. Parameter counts are derived from the shapes (embeddings, attention, MLPs,
experts, routers; norms and biases are below 0.1% and left out), so nothing is typed twice.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from bench.hardware import ProfileError


def config_path(ref: str | Path) -> Path | None:
    """The config.json a --model value names, or None when it is not a path to one."""
    p = Path(ref).expanduser()
    if p.is_dir() and (p / "config.json").is_file():
        return p / "config.json"
    if p.is_file() and p.suffix == ".json":
        return p
    return None


def model_name(path: Path) -> str:
    """The name a config.json's model goes by: its `_name_or_path`, else the directory (or
    file) name, without a Hugging Face cache prefix ("org--name")."""
    try:
        name = json.loads(path.read_text()).get("_name_or_path") or ""
    except (OSError, ValueError, AttributeError):
        name = ""
    if name:
        return str(name).rstrip("/").split("/")[-1].lower()
    stem = path.parent.name if path.name == "config.json" else path.stem
    return stem.removesuffix("_config").split("--")[-1].lower()


def _get(cfg: dict[str, Any], path: Path, *keys: str, default: Any = None) -> Any:
    for k in keys:
        if cfg.get(k) is not None:
            return cfg[k]
    if default is None:
        raise ProfileError(f"{path}: config.json has none of {', '.join(keys)}")
    return default


def profile_fields(path: Path) -> dict[str, Any]:
    """The fields of a ModelProfile read and derived from one config.json."""
    try:
        raw = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ProfileError(f"cannot read model config {path}: {exc}") from exc
    if not isinstance(raw, dict):
        raise ProfileError(f"{path}: a Hugging Face config.json is a JSON object")
    cfg = {**raw, **(raw.get("text_config") or {})}  # multimodal configs nest the LM
    g = lambda *k, default=None: _get(cfg, path, *k, default=default)  # noqa: E731
    layers, hidden = int(g("num_hidden_layers", "n_layer")), int(g("hidden_size", "n_embd"))
    q_heads = int(g("num_attention_heads", "n_head"))
    vocab = int(g("vocab_size"))
    out: dict[str, Any] = {
        "hf_id": str(raw.get("_name_or_path") or path.parent.name),
        "layers": layers,
        "hidden": hidden,
        "q_heads": q_heads,
        "vocab": vocab,
        "context": int(g("max_position_embeddings", default=4096)),
        "source": f"Hugging Face config.json read from {path}",
    }
    attn = _attention(cfg, out)
    experts = int(g("num_local_experts", "num_experts", "n_routed_experts", default=0))
    ffn = int(g("intermediate_size_mlp", "intermediate_size", default=4 * hidden))
    mlp = 3 * hidden * ffn
    # embedding table == LM head, one copy in memory (small Llama/Qwen3 models); a missing
    # field reads as untied, the default of transformers' LlamaConfig, Qwen3Config, MistralConfig
    tied = bool(cfg.get("tie_word_embeddings"))
    out["tie_word_embeddings"] = tied
    embed = vocab * hidden * (1 if tied else 2)
    total = active = embed + layers * attn
    if experts:
        k = int(g("num_experts_per_tok", "experts_per_token", "moe_topk"))
        expert_ffn = int(g("moe_intermediate_size", "intermediate_size"))
        step = int(cfg.get("interleave_moe_layer_step") or 1)
        dense = int(cfg.get("first_k_dense_replace") or 0) or (layers - layers // step)
        shared_n = int(
            cfg.get("n_shared_experts")
            or (1 if cfg.get("model_type", "").startswith("llama4") else 0)
        )
        shared_ffn = int(cfg.get("shared_expert_intermediate_size") or shared_n * expert_ffn)
        moe_layers = layers - dense
        one = 3 * hidden * expert_ffn
        per_moe = hidden * experts + 3 * hidden * shared_ffn
        total += dense * mlp + moe_layers * (per_moe + experts * one)
        active += dense * mlp + moe_layers * (per_moe + k * one)
        out.update(
            arch="moe", experts=experts, experts_per_token=k, expert_ffn=expert_ffn,
            shared_experts=1 if shared_ffn else 0, dense_layers=dense,
            ffn=ffn if dense else None,
        )  # fmt: skip
    else:
        total += layers * mlp
        active = total
        out.update(arch="dense", ffn=ffn)
    out.update(params_b=round(total / 1e9, 3), active_params_b=round(active / 1e9, 3))
    out.update(_sliding(cfg, layers))
    if cfg.get("num_nextn_predict_layers"):
        out["mtp_layers"] = int(cfg["num_nextn_predict_layers"])
    if _attention_kept_wide(cfg):
        out["dense_precision"] = "bf16"
    return out


def _attention_kept_wide(cfg: dict[str, Any]) -> bool:
    """A quantized checkpoint that names its attention among the modules it does not
    convert (gpt-oss's `modules_to_not_convert`, llm-compressor's `ignore`) keeps everything
    but the experts in BF16."""
    quant = cfg.get("quantization_config") or {}
    kept = quant.get("modules_to_not_convert") or quant.get("ignore") or []
    return any("self_attn" in str(name) for name in kept)


def _attention(cfg: dict[str, Any], out: dict[str, Any]) -> int:
    """Attention shape fields into `out`; returns attention parameters per layer."""
    hidden, q = out["hidden"], out["q_heads"]
    if cfg.get("kv_lora_rank"):  # MLA (DeepSeek-V2/V3/R1, Kimi K2)
        rope, nope = int(cfg["qk_rope_head_dim"]), int(cfg["qk_nope_head_dim"])
        v, lora, q_lora = int(cfg["v_head_dim"]), int(cfg["kv_lora_rank"]), cfg.get("q_lora_rank")
        out.update(
            attention="mla", kv_lora_rank=lora, qk_rope_head_dim=rope, qk_nope_head_dim=nope,
            v_head_dim=v,
        )  # fmt: skip
        qp = hidden * q_lora + q_lora * q * (nope + rope) if q_lora else hidden * q * (nope + rope)
        return qp + hidden * (lora + rope) + lora * q * (nope + v) + q * v * hidden
    kv = int(cfg.get("num_key_value_heads") or q)
    hd = int(cfg.get("head_dim") or hidden // q)
    out.update(attention="gqa", kv_heads=kv, head_dim=hd)
    return 2 * hidden * q * hd + 2 * hidden * kv * hd


def _sliding(cfg: dict[str, Any], layers: int) -> dict[str, int]:
    """Sliding-window (or chunked) layers and their window."""
    types = cfg.get("layer_types")
    window = cfg.get("sliding_window")
    if types and window:  # gpt-oss, Gemma: per-layer types
        n = sum(t == "sliding_attention" for t in types)
        return {"sliding_window_layers": n, "sliding_window": int(window)} if n else {}
    if cfg.get("attention_chunk_size"):  # Llama 4: chunked attention on 3 of every 4 layers
        n = layers - layers // 4
        return {"sliding_window_layers": n, "sliding_window": int(cfg["attention_chunk_size"])}
    if (
        window
        and cfg.get("use_sliding_window", True)
        and window < cfg.get("max_position_embeddings", 0)
    ):
        return {"sliding_window_layers": layers, "sliding_window": int(window)}
    return {}
