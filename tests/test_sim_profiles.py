"""Profiles: lookup, aliases, errors, and derived sizes against the reference figures."""

from pathlib import Path

import pytest

from bench.sim.profiles import ProfileError, get_gpu, get_model, load_gpus, load_models


def test_aliases_case_insensitive() -> None:
    assert get_gpu("b200").name == "B200-SXM"
    assert get_gpu("B200").name == "B200-SXM"
    assert get_gpu("h100").name == "H100-SXM"
    for alias, name in [("h200", "H200-SXM"), ("b300", "B300-SXM"), ("MI300X", "MI300X")]:
        assert get_gpu(alias).name == name
    assert get_gpu("mi355x").name == "MI355X"
    assert get_model("Llama-3.3-70B").name == "llama-3.3-70b"


def test_b200_two_figures() -> None:
    hgx, launch = get_gpu("B200-SXM"), get_gpu("B200-SXM-192")
    assert (hgx.hbm_gb, hgx.hbm_bw_tbs) == (180, 7.7)
    assert (launch.hbm_gb, launch.hbm_bw_tbs) == (192, 8.0)


def test_unknown_name_lists_known() -> None:
    with pytest.raises(ProfileError, match="H100-SXM.*B200-SXM"):
        get_gpu("v100")
    with pytest.raises(ProfileError, match="llama-3.3-70b"):
        get_model("llama-5")


def test_every_entry_has_source_and_tdp() -> None:
    for gpu in load_gpus().values():
        assert gpu.source and gpu.tdp_w > 0 and gpu.hbm_gb > 0
    for model in load_models().values():
        assert model.source


def test_fp4_error_names_gpu_and_precisions() -> None:
    with pytest.raises(ValueError, match=r"H100-SXM.*bf16, fp8"):
        get_gpu("h100").peak_flops("fp4")


@pytest.mark.parametrize(
    "name,bf16,fp8",
    [
        ("llama-3.1-8b", 131072, 65536),
        ("llama-3.3-70b", 327680, 163840),
        ("deepseek-r1", 70272, 35136),
        ("qwen3-30b-a3b", 98304, 49152),
        ("gpt-oss-120b", 36864, 18432),  # full-attention layers only
    ],
)
def test_kv_bytes_match_reference(name: str, bf16: int, fp8: int) -> None:
    model = get_model(name)
    assert model.kv_bytes_per_token("bf16") == bf16
    assert model.kv_bytes_per_token("fp8") == fp8


def test_weight_bytes_derived() -> None:
    m = get_model("llama-3.3-70b")
    # the decoder's linear layers in FP8 (1 byte) or NVFP4, the embedding table and the LM
    # head (2 x 128,256 x 8,192) kept in BF16 as the quantized checkpoints keep them [S76]
    embed = 2 * 128256 * 8192
    assert m.weight_bytes("fp8") == pytest.approx(70.55e9 - embed + 2 * embed)
    assert m.weight_bytes("nvfp4") == pytest.approx(39.7e9 + embed * (2 - 0.5625), rel=0.01)
    assert m.weight_bytes("bf16") == pytest.approx(2 * 70.55e9)
    # gpt-oss: MXFP4 experts, everything else BF16 (about 65 GB, as the checkpoint ships)
    assert get_model("gpt-oss-120b").weight_bytes("mxfp4") == pytest.approx(65.2e9, rel=0.01)
    # routed experts are nearly all of an MoE model's parameters
    oss = get_model("gpt-oss-120b")
    assert 0.9 < oss.routed_expert_bytes("bf16") / oss.weight_bytes("bf16") < 1.0


def test_extra_file_extends(tmp_path: Path) -> None:
    extra = tmp_path / "mine.yaml"
    extra.write_text(
        "gpus:\n  V100-SXM:\n    vendor: nvidia\n    aliases: [v100]\n    hbm_gb: 32\n"
        "    hbm_bw_tbs: 0.9\n    tflops: {bf16: 125, fp8: null, fp4: null}\n    tdp_w: 300\n"
        "    scale_up_gbps: 150\n    source: test\n"
    )
    gpus = load_gpus(extra)
    assert "V100-SXM" in gpus and "H100-SXM" in gpus
    v100 = get_gpu("v100", extra)
    assert v100.supported_precisions == ["bf16"]
    assert v100.hbm_bytes == 32e9  # no reported memory given: the marketed figure
