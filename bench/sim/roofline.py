"""Step time of one engine iteration from the roofline (published.md section 4a).

One deployment = (GPU, model, precision, tensor-parallel degree). An iteration runs B decode
tokens and N_pf prefill tokens through the weights once:

    t_gemm  = max(FLOPs of the weight GEMMs / (tp * peak * MFU), weight bytes read / tp / (BW * MBU))
    t_attnD = KV bytes read by the decode tokens / tp / (BW * MBU)
    t_attnP = causal prefill attention FLOPs / (tp * peak * MFU_prefill)
    t_comm  = (tp > 1) * 2 * layers * (alpha + activation bytes * 2 (tp-1)/tp / (BW_link * eta))
    T_iter  = t_gemm + t_attnD + t_attnP + t_comm + t_fix

MoE models do the FLOPs of their active parameters but read, per step, the non-expert weights
plus min(E, n_tok * top_k) experts' bytes: every expert some token in the batch routes to.
Everything here is a pure function of its inputs, so the engine stays deterministic.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from bench.sim.profiles import (
    Efficiency,
    GPUProfile,
    ModelProfile,
    Precision,
    efficiency_for,
    get_gpu,
    get_model,
    get_precision,
)

ACTIVATION_BYTES = 2  # all-reduce payloads are BF16 activations


@dataclass(frozen=True)
class Deployment:
    """A model served on tp GPUs of one kind at one precision, with its efficiency figures."""

    gpu: GPUProfile
    model: ModelProfile
    precision: Precision
    tp: int
    kv_precision: Precision
    eff: Efficiency

    @classmethod
    def build(
        cls,
        gpu: str | GPUProfile,
        model: str | ModelProfile,
        precision: str = "fp8",
        tp: int = 1,
        kv_precision: str | None = None,
        **efficiency: float,
    ) -> Deployment:
        """Resolve names to profiles and check the GPU can run the precision at all."""
        g = get_gpu(gpu) if isinstance(gpu, str) else gpu
        m = get_model(model) if isinstance(model, str) else model
        p = get_precision(precision)
        if tp < 1 or tp > g.world_size:
            raise ValueError(f"tp={tp} is outside 1..{g.world_size} for {g.name}")
        if not g.tflops.get(p.compute):
            raise ValueError(
                f"{g.name} cannot serve {precision}: it has no {p.compute.upper()} tensor cores; "
                f"supported precisions: {', '.join(g.supported_precisions)}"
            )
        kv = get_precision(kv_precision or p.kv_default)
        return cls(g, m, p, tp, kv, efficiency_for(g, **efficiency))

    @property
    def label(self) -> str:
        return f"{self.model.name} {self.precision.name} on {self.tp}x {self.gpu.name} (simulated)"

    @cached_property
    def weight_bytes(self) -> float:
        return self.model.weight_bytes(self.precision.name)

    @cached_property
    def expert_bytes(self) -> float:
        """Bytes of one routed expert summed over all MoE layers."""
        m = self.model
        return m.routed_expert_bytes(self.precision.name) / m.experts if m.is_moe else 0.0

    @cached_property
    def kv_bytes_per_token(self) -> float:
        return self.model.kv_bytes_per_token(self.kv_precision.name)

    @cached_property
    def peak_flops(self) -> float:
        return self.gpu.peak_flops(self.precision.compute)

    @cached_property
    def _bw(self) -> float:
        return self.gpu.hbm_bw_bytes_s * self.eff.mbu

    def kv_capacity_tokens(self, gpu_memory_utilization: float = 0.90) -> int:
        """Tokens of KV cache: (tp * HBM * utilisation - weights) / KV bytes per token."""
        free = self.tp * self.gpu.hbm_bytes * gpu_memory_utilization - self.weight_bytes
        if free <= 0:
            raise ValueError(
                f"{self.model.name} in {self.precision.name} ({self.weight_bytes / 1e9:.0f} GB) "
                f"does not fit on {self.tp}x {self.gpu.name} at {gpu_memory_utilization:.0%} "
                f"of {self.gpu.hbm_gb:g} GB; raise --tp or lower the precision"
            )
        return int(free // self.kv_bytes_per_token)

    def weight_bytes_read(self, n_tok: int) -> float:
        """Weight bytes one step streams; MoE touches at most min(E, n_tok * top_k) experts."""
        m = self.model
        if not m.is_moe:
            return self.weight_bytes
        touched = min(m.experts, n_tok * m.experts_per_token)
        return self.weight_bytes - self.expert_bytes * (m.experts - touched)

    def step_time(
        self, n_decode: int, decode_ctx: float, n_prefill: int, prefill_ctx: float
    ) -> float:
        """Seconds for one iteration.

        n_decode: decode tokens (one per running sequence); decode_ctx: sum of their context
        lengths (KV tokens read); n_prefill: prefill tokens in this step; prefill_ctx: sum over
        the prefill tokens of the context each attends to (for a chunk of n tokens starting at
        position p: n * (p + n / 2)).
        """
        n_tok = n_decode + n_prefill
        if n_tok == 0:
            return 0.0
        m, e, tp, F = self.model, self.eff, self.tp, self.peak_flops
        flops = 2 * m.active_params_b * 1e9 * (n_decode / e.mfu + n_prefill / e.mfu_prefill)
        t_gemm = max(flops / (tp * F), self.weight_bytes_read(n_tok) / tp / self._bw)
        t_attn_d = decode_ctx * self.kv_bytes_per_token / tp / self._bw
        t_attn_p = 4 * m.layers * m.hidden * prefill_ctx / (tp * F * e.mfu_prefill)
        t_comm = 0.0
        if tp > 1:
            link = self.gpu.scale_up_bytes_s * e.nvlink_efficiency
            payload = n_tok * m.hidden * ACTIVATION_BYTES * 2 * (tp - 1) / tp
            t_comm = 2 * m.layers * (e.allreduce_latency_s + payload / link)
        return t_gemm + t_attn_d + t_attn_p + t_comm + e.t_fix_s


def steady_state(dep: Deployment, isl: int, osl: int, concurrency: float) -> dict[str, float]:
    """Closed-loop steady state at a fixed concurrency C (published.md 4a).

    Each iteration decodes C tokens of mean context ISL + OSL/2 and prefills C * ISL/OSL tokens
    (whole prompts, mean attention context ISL/2). Returns TPOT (s), interactivity (tok/s/user),
    output and total tokens/s per GPU.
    """
    c = concurrency
    n_pf = c * isl / osl
    t = dep.step_time(c, c * (isl + osl / 2), n_pf, n_pf * isl / 2)
    out = c / t / dep.tp
    return {
        "tpot_s": t,
        "interactivity": 1 / t,
        "output_tps_per_gpu": out,
        "total_tps_per_gpu": out * (1 + isl / osl),
    }
