"""Any model from its Hugging Face config.json (issue 25 item 4)."""

import json
from pathlib import Path

import pytest

from bench.sim.profiles import ProfileError, get_model
from bench.sim.roofline import Deployment

LLAMA_8B = {  # the fields of meta-llama/Llama-3.1-8B's config.json the simulator reads
    "architectures": ["LlamaForCausalLM"], "hidden_size": 4096, "intermediate_size": 14336,
    "max_position_embeddings": 131072, "num_attention_heads": 32, "num_hidden_layers": 32,
    "num_key_value_heads": 8, "vocab_size": 128256, "tie_word_embeddings": False,
}  # fmt: skip
DEEPSEEK_V3 = {
    "first_k_dense_replace": 3, "hidden_size": 7168, "intermediate_size": 18432,
    "kv_lora_rank": 512, "max_position_embeddings": 163840, "moe_intermediate_size": 2048,
    "n_routed_experts": 256, "n_shared_experts": 1, "num_attention_heads": 128,
    "num_experts_per_tok": 8, "num_hidden_layers": 61, "num_key_value_heads": 128,
    "num_nextn_predict_layers": 1, "q_lora_rank": 1536, "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64, "v_head_dim": 128, "vocab_size": 129280,
}  # fmt: skip
GPT_OSS_20B = {
    "hidden_size": 2880, "intermediate_size": 2880, "head_dim": 64, "num_attention_heads": 64,
    "num_key_value_heads": 8, "num_hidden_layers": 24, "num_local_experts": 32,
    "num_experts_per_tok": 4, "sliding_window": 128, "vocab_size": 201088,
    "layer_types": ["sliding_attention", "full_attention"] * 12,
    "max_position_embeddings": 131072,
}  # fmt: skip
LLAMA4_MAVERICK = {"model_type": "llama4", "text_config": {
    "model_type": "llama4_text", "attention_chunk_size": 8192, "head_dim": 128,
    "hidden_size": 5120, "interleave_moe_layer_step": 2, "intermediate_size": 8192,
    "intermediate_size_mlp": 16384, "max_position_embeddings": 1048576,
    "num_attention_heads": 40, "num_experts_per_tok": 1, "num_hidden_layers": 48,
    "num_key_value_heads": 8, "num_local_experts": 128, "vocab_size": 202048,
}}  # fmt: skip


def _write(tmp_path: Path, name: str, cfg: dict) -> Path:
    d = tmp_path / name
    d.mkdir()
    (d / "config.json").write_text(json.dumps(cfg))
    return d


def test_a_config_json_gives_the_shipped_profile(tmp_path: Path) -> None:
    mine = get_model(str(_write(tmp_path, "Llama-3.1-8B", LLAMA_8B)))
    shipped = get_model("llama-3.1-8b")
    for field in ("layers", "hidden", "ffn", "q_heads", "kv_heads", "head_dim", "vocab"):
        assert getattr(mine, field) == getattr(shipped, field), field
    assert mine.params_b == pytest.approx(shipped.params_b, rel=1e-3)
    assert mine.kv_bytes_per_token("fp8") == shipped.kv_bytes_per_token("fp8") == 65536
    assert mine.name == "llama-3.1-8b"


def test_tied_embeddings_are_stored_once(tmp_path: Path) -> None:
    """Llama-3.2-1B publishes "tie_word_embeddings": true: one vocab x hidden matrix serves as
    embedding table and LM head, so params_b (and HBM) count it once; Meta's 1.24B."""
    cfg = {**LLAMA_8B, "hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16,
           "head_dim": 64, "tie_word_embeddings": True}  # fmt: skip
    tied = get_model(str(_write(tmp_path, "Llama-3.2-1B", cfg)))
    untied = get_model(str(_write(tmp_path, "untied", {**cfg, "tie_word_embeddings": False})))
    assert tied.tie_word_embeddings and not untied.tie_word_embeddings
    assert tied.params_b == pytest.approx(1.236, rel=0.01)
    assert (untied.params_b - tied.params_b) * 1e9 == pytest.approx(128256 * 2048, abs=1e6)
    assert tied.embedding_params() == tied.head_params() == 128256 * 2048


def test_mla_moe_and_mtp_from_deepseek_v3(tmp_path: Path) -> None:
    m = get_model(str(_write(tmp_path, "DeepSeek-V3", DEEPSEEK_V3) / "config.json"))
    r1 = get_model("deepseek-r1")
    assert (m.attention, m.kv_lora_rank, m.experts, m.experts_per_token) == ("mla", 512, 256, 8)
    assert (m.dense_layers, m.mtp_layers, m.shared_experts) == (3, 1, 1)
    assert m.params_b == pytest.approx(671, rel=0.002)  # DeepSeek: 671B, 37B active
    assert m.active_params_b == pytest.approx(37, rel=0.02)
    assert m.kv_bytes_per_token("fp8") == r1.kv_bytes_per_token("fp8")


def test_sliding_window_layers_and_interleaved_moe(tmp_path: Path) -> None:
    oss = get_model(str(_write(tmp_path, "gpt-oss-20b", GPT_OSS_20B)))
    assert (oss.sliding_window_layers, oss.sliding_window, oss.kv_layers) == (12, 128, 12)
    assert oss.params_b == pytest.approx(20.9, rel=0.01)  # OpenAI: 21B
    mav = get_model(str(_write(tmp_path, "Llama-4-Maverick", LLAMA4_MAVERICK)))
    assert (mav.dense_layers, mav.moe_layers, mav.ffn, mav.expert_ffn) == (24, 24, 16384, 8192)
    assert mav.params_b == pytest.approx(400, rel=0.01)  # Meta: 400B total, 17B active
    assert mav.active_params_b == pytest.approx(17, rel=0.02)
    assert mav.sliding_window_layers == 36  # chunked attention on 3 of every 4 layers


def test_sliding_window_attention_counts_in_prefill_and_decode() -> None:
    dep = Deployment.build("B200", "gpt-oss-120b", "mxfp4")
    # window 0: the sliding layers cost nothing (as before windows were modelled)
    no_sw = Deployment.build("B200", dep.model.model_copy(update={"sliding_window": 0}), "mxfp4")
    full = Deployment.build(  # every layer full attention
        "B200", dep.model.model_copy(update={"sliding_window_layers": 0}), "mxfp4"
    )
    long_prefill = (0, 0, 8192, 8192 * 32768.0)
    # the windowed layers add work, but far less than full attention would
    pf = dep.step_time(*long_prefill)
    assert no_sw.step_time(*long_prefill) < pf < full.step_time(*long_prefill)
    assert dep.step_time(256, 256 * 30000.0, 0, 0) > no_sw.step_time(256, 256 * 30000.0, 0, 0)


def test_bad_config_and_unknown_model_say_what_to_do(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"hidden_size": 4096}))
    with pytest.raises(ProfileError, match="bad.json"):
        get_model(str(bad))
    with pytest.raises(ProfileError, match="config.json"):
        get_model("llama-9")


def test_sim_run_takes_a_config_path(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from bench.cli import app

    path = _write(tmp_path, "my-llama", LLAMA_8B)
    args = ["sim", "run", "--gpu", "l40s", "--model", str(path), "--num-prompts", "20",
            "--db", f"sqlite:///{tmp_path / 'r.db'}"]  # fmt: skip
    res = CliRunner().invoke(app, args, env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    from bench.store.read import get_run, list_runs

    db = f"sqlite:///{tmp_path / 'r.db'}"
    sim = get_run(list_runs(db=db)[0].id, db).extra_json["sim"]
    assert (sim["model"], sim["gpu"]) == ("my-llama", "L40S")


def test_a_model_whose_every_layer_slides_is_simulated(tmp_path: Path) -> None:
    # Mistral-7B-v0.1's config.json: sliding_window 4096 on all 32 layers, no full layer.
    # It crashed the KV arithmetic (ZeroDivisionError). Its KV per token is that of a full
    # model of the same shape, so its pool holds as many tokens, less the weight difference.
    mistral = {**LLAMA_8B, "vocab_size": 32000, "sliding_window": 4096, "model_type": "mistral"}
    model = get_model(str(_write(tmp_path, "Mistral-7B-v0.1", mistral)))
    assert (model.sliding_window_layers, model.kv_layers) == (32, 0)
    full = model.model_copy(update={"sliding_window_layers": 0, "sliding_window": None})
    slid, same = Deployment.build("H100", model, "bf16"), Deployment.build("H100", full, "bf16")
    assert slid.kv_pool_bytes_per_token == same.kv_bytes_per_token == 2 * 32 * 8 * 128 * 2
    assert slid.kv_capacity_tokens() == same.kv_capacity_tokens() > 0
    # Decode over a 30k context reads only the 4,096-token window on every layer.
    assert slid.step_time(64, 64 * 30000.0, 0, 0) < same.step_time(64, 64 * 30000.0, 0, 0)
