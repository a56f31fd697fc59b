"""Device truth: memory as each GPU reports it, and each engine's own KV-cache arithmetic.

The expected figures are written out here the way each engine computes them (vLLM's
gpu_memory_utilization of total memory, SGLang's mem_fraction_static, TensorRT-LLM's
free_gpu_memory_fraction of what is left after weights), from the device's reported memory.
"""

import pytest

from bench.hardware import get_gpu, load_gpus
from bench.sim.memory import memory_plan, sglang_mem_fraction_static
from bench.sim.profiles import engine_defaults
from bench.sim.roofline import Deployment

MIB = 1 << 20
OTHER = 551 * MIB  # CUDA context + cuBLAS workspace, measured (aiconfigurator other_mem note)
# FP8 checkpoints keep the embedding table and the LM head (vocab x hidden each) in BF16 [S76]
EMBED_8B = 2 * 128256 * 4096  # bytes beyond 1 per parameter: Llama-3.1-8B
W70_FP8 = 70.55e9 + 2 * 128256 * 8192  # Llama-3.3-70B FP8: 72.65 GB

# nvidia-smi memory.total / rocm-smi VRAM Total of each GPU, MiB (sources in gpus.yaml)
REPORTED_MIB = {
    "A100-SXM": 81920,
    "L40S": 46068,
    "H100-SXM": 81559,
    "H200-SXM": 143771,
    "B200-SXM": 183359,
    "B200-SXM-192": 183359,
    "B300-SXM": 275040,
    "MI300X": 205822885888 / MIB,
    "MI325X": 262144,  # assumed 256 GiB: no public rocm-smi output (gpus.yaml says so)
    "MI355X": 309220868096 / MIB,
    "GB200-NVL72": 189471,
    "GB300-NVL72": 284208,
}


def test_every_gpu_has_its_reported_memory_with_a_source() -> None:
    gpus = load_gpus()
    assert set(gpus) == set(REPORTED_MIB)
    for name, gpu in gpus.items():
        assert gpu.memory_mib == REPORTED_MIB[name] and gpu.memory_source, name
        assert gpu.hbm_bytes == REPORTED_MIB[name] * MIB


def test_an_80gb_h100_is_85_5e9_bytes() -> None:
    assert get_gpu("h100").hbm_bytes == pytest.approx(85.52e9, rel=1e-3)


def _vllm_kv_8b(gpu: str, total: float, weights: float) -> float:
    """vLLM: total x 0.9 - weights - profile-run peak - non-torch (Llama-3.1-8B, TP1). The
    profile run pushes max_num_batched_tokens through the model and samples max_num_seqs rows
    of FP32 logits: `vllm serve` defaults to 8,192 and 1,024 on a device of at least 70 GiB
    that is not an A100, else 2,048 and 256 (EngineArgs.get_batch_defaults)."""
    hidden, ffn, vocab = 4096, 14336, 128256
    large = total >= 70 * 2**30 and "a100" not in gpu.lower()
    tokens, seqs = (8192, 1024) if large else (2048, 256)
    activations = tokens * (4 * hidden + 2 * ffn) * 2 + seqs * vocab * 4
    return total * 0.90 - weights - activations - OTHER


@pytest.mark.parametrize("gpu", sorted(REPORTED_MIB))
def test_vllm_kv_room_per_gpu_is_vllms_arithmetic(gpu: str) -> None:
    precision = "fp8" if get_gpu(gpu).tflops.get("fp8") else "bf16"
    dep = Deployment.build(gpu, "llama-3.1-8b", precision, engine="vllm")
    total = REPORTED_MIB[gpu] * MIB
    # an FP8 checkpoint keeps its embedding table and LM head in BF16 [S76]: one more byte each
    weights = 8.03e9 + EMBED_8B if precision == "fp8" else 8.03e9 * 2.0
    kv = _vllm_kv_8b(gpu, total, weights)
    assert memory_plan(dep).kv == pytest.approx(kv, rel=1e-9)
    per_token = 2 * 32 * 8 * 128 * (1 if precision == "fp8" else 2)
    assert dep.kv_capacity_tokens() == int(kv // per_token)


def test_70b_fp8_on_one_h100_holds_about_five_2k_sequences() -> None:
    # issue 25: at 80e9 bytes the KV room was ~4 sequences; at 81,559 MiB vLLM leaves ~10.6k
    # tokens after weights (72.65 GB: 70.55 GB of FP8 layers plus the BF16 embedding and LM
    # head; vLLM logs "Loading model weights took 67.6979 GB", GiB, for 70B FP8 [S76]),
    # activations (8,192 tokens and 1,024 sequences' logits, `vllm serve`'s defaults on an
    # H100) and non-torch memory; ~13.0k while the defaults read 256 sequences, 25.8k when the
    # embedding and head counted as FP8
    dep = Deployment.build("h100", "llama-3.3-70b", "fp8", engine="vllm")
    tokens = dep.kv_capacity_tokens()
    assert 10_000 < tokens < 11_000
    assert tokens // 2048 == 5
    # a server started with --max-num-seqs 256 samples 256 rows in its profile run
    assert 12_500 < dep.kv_capacity_tokens(max_num_seqs=256) < 13_500


def test_sglang_mem_fraction_static_as_sglang_derives_it() -> None:
    # reserved = 512 MB + 1.5 MB x chunked prefill + tp/8 GiB + 2 MB x graph batch, >= 10 GiB
    # above 60 GiB, + 2 GiB with EAGLE/MTP drafts; chunk and graph batch as SGLang picks them
    # for the device's memory (engines.yaml by_device)
    def derived(gpu: str, tp: int, drafts: bool = False) -> float:
        d = engine_defaults("sglang", get_gpu(gpu))
        total = get_gpu(gpu).hbm_bytes
        return sglang_mem_fraction_static(
            total, d.max_num_batched_tokens, d.graph_batch(tp), tp, 1, drafts
        )

    h100 = 81559  # 60-160 GiB: chunked prefill 8192, graph batch 256 below TP 4
    reserve = 512 + 1.5 * 8192 + 128 + 256 * 2
    assert derived("h100", 1) == round((h100 - reserve) / h100, 3)
    assert derived("h100", 1, drafts=True) == round((h100 - reserve - 2048) / h100, 3)
    b200 = 183359  # above 160 GiB: chunked prefill 16384, graph batch 512
    assert derived("b200", 8) == round((b200 - (512 + 1.5 * 16384 + 1024 + 512 * 2)) / b200, 3)
    l40s = 46068  # 35-60 GiB: chunked prefill 4096, graph batch 32 (160 at TP 4); no floor
    assert derived("l40s", 1) == round((l40s - (512 + 1.5 * 4096 + 128 + 32 * 2)) / l40s, 3)
    assert derived("l40s", 4) == round((l40s - (512 + 1.5 * 4096 + 512 + 160 * 2)) / l40s, 3)
    small = 16 * 1024 * MIB  # below 20 GiB: 2048 and 8 (SGLang's T4 tier)
    assert sglang_mem_fraction_static(small, 2048, 8, 1, 1) == round(
        (16384 - (512 + 1.5 * 2048 + 128 + 8 * 2)) / 16384, 3
    )


def test_sglang_kv_pool_is_fraction_of_total_minus_weights() -> None:
    dep = Deployment.build("h200", "llama-3.3-70b", "fp8", engine="sglang")
    total = 143771 * MIB
    kv = total * sglang_mem_fraction_static(total, 8192, 256, 1, 1) - W70_FP8
    assert memory_plan(dep).kv == pytest.approx(kv, rel=1e-9)


def test_sglang_reserves_for_the_chunk_and_drafts_in_use() -> None:
    """SGLang sizes its reserve from the chunked-prefill size in effect (a user's
    --chunked-prefill-size too) and adds 2 GiB when EAGLE/MTP drafts run: the KV pool shrinks by
    that much (to the 0.001 of capacity SGLang rounds the fraction to)."""
    b200 = Deployment.build("b200", "llama-3.3-70b", "fp8", engine="sglang")
    total = b200.gpu.hbm_bytes
    default, wide = memory_plan(b200), memory_plan(b200, max_num_batched_tokens=32768)
    assert default.fraction == sglang_mem_fraction_static(total, 16384, 512, 1, 1)
    assert wide.fraction == sglang_mem_fraction_static(total, 32768, 512, 1, 1)
    step = total * 1e-3  # mem_fraction_static is rounded to 3 decimals
    assert default.kv - wide.kv == pytest.approx(1.5 * 16384 * MIB, abs=step)  # 24 GiB more
    dsr1 = {"gpu": "b200", "model": "deepseek-r1", "precision": "fp8", "tp": 8, "engine": "sglang"}
    plain = memory_plan(Deployment.build(**dsr1, mtp=False))
    drafting = memory_plan(Deployment.build(**dsr1, mtp=True))
    assert plain.kv - drafting.kv == pytest.approx(2048 * MIB, abs=step)


def test_trtllm_takes_its_fraction_of_what_is_left_after_weights() -> None:
    dep = Deployment.build("h200", "llama-3.3-70b", "fp8", engine="trtllm")
    total = 143771 * MIB
    activations = 8192 * (4 * 8192 + 2 * 28672) * 2 + 2048 * 128256 * 4
    kv = (total - W70_FP8 - activations - OTHER) * 0.90
    assert memory_plan(dep).kv == pytest.approx(kv, rel=1e-9)
    # TP2 shards weights and the MLP activations, and adds NCCL's buffers (342 MB)
    tp2 = Deployment.build("h200", "llama-3.3-70b", "fp8", 2, engine="trtllm")
    act2 = 8192 * (4 * 8192 + 2 * 28672 / 2) * 2 + 2048 * 128256 * 4
    kv2 = (total - W70_FP8 / 2 - act2 - OTHER - 358612992) * 0.90
    assert memory_plan(tp2).kv == pytest.approx(kv2, rel=1e-9)


def test_a_model_that_does_not_fit_says_what_took_the_memory() -> None:
    dep = Deployment.build("l40s", "llama-3.3-70b", "fp8")
    with pytest.raises(ValueError, match=r"GiB of weights.*raise --tp"):
        dep.kv_capacity_tokens()
