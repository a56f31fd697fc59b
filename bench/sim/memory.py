"""How each serving engine sizes its KV cache from device memory, per GPU.

The engines differ in what their memory fraction is a fraction of (engines.yaml says which and
cites the code): vLLM's gpu_memory_utilization caps TOTAL device memory, from which weights,
the profile run's peak activations and non-torch memory (CUDA context, NCCL) come out; SGLang's
mem_fraction_static caps weights plus the KV pool against total memory, the rest being its
reserve for activations and CUDA graphs; TensorRT-LLM's free_gpu_memory_fraction takes a
fraction of what is left after weights and activations. CUDA graphs are captured after the KV
cache is sized, out of the memory the fraction leaves free. Total memory is what the device
reports (bench.hardware: nvidia-smi / rocm-smi), never the marketed figure.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from bench.hardware import GPUProfile
from bench.sim.profiles import (
    Efficiency,
    EngineDefaults,
    ModelProfile,
    engine_defaults,
    memory_constants,
)


class Deployment(Protocol):
    """What the memory arithmetic reads of a deployment (bench.sim.roofline.Deployment)."""

    gpu: GPUProfile
    model: ModelProfile
    engine: str
    eff: Efficiency
    tp: int
    dp: int

    @property
    def gpus(self) -> int: ...

    @property
    def expert_shards(self) -> int: ...

    @property
    def weight_bytes_per_gpu(self) -> float: ...


MIB = 1 << 20


@dataclass(frozen=True)
class MemoryPlan:
    """One GPU's memory, in bytes, as the engine divides it."""

    engine: str
    total: float
    fraction: float
    weights: float
    activations: float
    non_torch: float
    kv: float

    def describe(self) -> str:
        gib = 1 << 30
        return (
            f"{self.engine}: {self.total / gib:.1f} GiB reported, fraction {self.fraction:.3f}; "
            f"weights {self.weights / gib:.1f}, activations {self.activations / gib:.2f}, "
            f"non-torch {self.non_torch / gib:.2f}, KV {self.kv / gib:.1f} GiB"
        )


def activation_bytes(dep: Deployment, max_num_seqs: int, max_num_batched_tokens: int) -> float:
    """Peak activation memory of the engine's profile run on one GPU.

    max_num_batched_tokens tokens through one layer: its input, attention (4 x hidden) and the
    MLP's gate/up output (2 x ffn per tensor-parallel rank; for MoE the top-k experts' share),
    in BF16; plus the sampler's FP32 logits for max_num_seqs sequences over the vocabulary.
    """
    m = dep.model
    per_elem = memory_constants()["bytes_per_element"]
    if m.is_moe:
        ffn = m.experts_per_token * (m.expert_ffn or 0) / dep.expert_shards
    else:
        ffn = (m.ffn or 4 * m.hidden) / dep.tp
    per_token = (4 * m.hidden + 2 * ffn) * per_elem
    return max_num_batched_tokens * per_token + max_num_seqs * m.vocab * 4


def non_torch_bytes(gpus: int) -> float:
    """CUDA context and cuBLAS workspace, plus NCCL buffers when the deployment spans GPUs."""
    c = memory_constants()
    nccl = c["nccl_bytes_by_tp"]
    key = max((k for k in nccl if k <= gpus), default=1)
    return c["base_bytes"] + nccl[key]


def sglang_mem_fraction_static(
    total: float, chunk: int, graph_bs: int, tp: int, dp: int, drafts: bool = False
) -> float:
    """SGLang's default mem_fraction_static for a GPU of `total` bytes (ServerArgs @0.5.16, as
    NVIDIA's aiconfigurator mirrors it [S70]): its reserve for activations grows with the
    chunked-prefill size, for CUDA graphs with the largest graph batch (both picked by device
    memory in engines.yaml, or the user's), and by 2 GiB for EAGLE/MTP draft layers."""
    cap = total / MIB
    reserved = 512 + 1.5 * max(chunk, 2048) + tp / 8 * 1024 + graph_bs * 2
    if dp > 1:
        reserved += graph_bs * dp * 3 + (graph_bs * dp * 1.5 if graph_bs > 300 else 0)
    if cap > 60 * 1024:
        reserved = max(reserved, 10 * 1024)
    if drafts:
        reserved += 2 * 1024
    return round((cap - reserved) / cap, 3)


def memory_plan(
    dep: Deployment,
    fraction: float | None = None,
    max_num_seqs: int | None = None,
    max_num_batched_tokens: int | None = None,
    defaults: EngineDefaults | None = None,
) -> MemoryPlan:
    """The engine's own arithmetic for one GPU of the deployment (per data-parallel rank:
    max_num_seqs and max_num_batched_tokens are one engine instance's limits)."""
    d = defaults or engine_defaults(dep.engine, dep.gpu)
    seqs = max_num_seqs or d.max_num_seqs
    tokens = max_num_batched_tokens or d.max_num_batched_tokens
    total = dep.gpu.hbm_bytes
    weights = dep.weight_bytes_per_gpu
    act = activation_bytes(dep, seqs, tokens)
    other = non_torch_bytes(dep.gpus)  # NCCL buffers for TP and for expert-parallel all-to-all
    if d.memory == "total_fraction":
        frac = fraction if fraction is not None else d.memory_fraction
        kv = total * frac - weights - act - other
    elif d.memory == "sglang_static":
        drafts = dep.eff.mtp_tokens > 0
        derived = sglang_mem_fraction_static(
            total, tokens, d.graph_batch(dep.tp), dep.tp, dep.dp, drafts
        )
        frac = fraction if fraction is not None else derived
        kv = total * frac - weights
    else:
        frac = fraction if fraction is not None else d.memory_fraction
        kv = (total - weights - act - other) * frac
    return MemoryPlan(d.name, total, frac, weights, act, other, kv)
