"""Step time of one engine iteration from the roofline, for dense and MoE models.

One deployment = (GPU, model, precision, engine, parallelism). Parallelism is `tp` (tensor
parallel: attention and dense layers sharded over tp GPUs, 2 all-reduces per layer), `dp`
(attention data parallel: dp replicas of attention, each with its own sequences and KV cache) and
`ep` (expert parallel: the routed experts spread over ep GPUs; with attention data parallel, one
all-to-all dispatch and one combine per MoE layer; with attention TP ("TEP8": dp = 1) every rank
already holds every token, so each runs its own experts on them and the TP all-reduce after the
MoE layer combines them, no all-to-all: vLLM's FusedMoEParallelConfig.use_all2all_kernels is
dp_size > 1 and use_ep). GPUs = tp x dp; "DEP8" is dp=8, ep=8, tp=1. An iteration runs on every
data-parallel rank at once; per rank, with n_tok = decode tokens (x (1 + draft tokens) with
MTP) + prefill tokens:

    t_dense  = max(2 (N_body n_tok + N_head n_logits) / (tp F MFU),
                   (body bytes + head bytes [n_logits > 0] + n_tok hidden bytes) / tp / (BW MBU))
    t_expert = max(2 N_expert_active n_tok_e imbalance / (G F MFU_e moe_mfu_ratio r_fmt),
                   bytes of the experts some token routes to / G / (BW MBU moe_bw_ratio))
                                                                        G = ep or tp
               (r_fmt: fp8_moe_mfu_ratio for FP8 experts, 1 otherwise: an engine's block-FP8
               grouped GEMMs against its BF16 ones; below 1 for vLLM, as its own steps show)
    t_attnD  = max(KV bytes read / (BW MBU kv_bw_ratio), decode attention FLOPs / (F_attn MFU_attn))
    t_attnP  = prefill attention FLOPs / (F_attn MFU_prefill)
    (sliding-window layers attend at most `sliding_window` tokens: their KV reads and attention
    FLOPs count each query's context capped at the window)
    t_comm   = (tp > 1) 2 L (alpha_ar + all-reduce bytes / (BW_link eta))
             + (ep > 1, dp > 1) L_moe (2 alpha_a2a + all-to-all bytes / (BW_link eta))
    t_over   = t_fix + L t_layer + L_moe t_moe_layer + L t_mla_layer [MLA attention]
               + n_tok (t_tok + L_moe t_moe_tok) + t_multi [n_tok > 1]
    T_iter   = t_dense + t_expert + t_attnD + t_attnP + t_comm + t_over

A GEMM's MFU rises with its token rows n: MFU(n) = mfu n / (n + gemm_half_rows x min(1, n /
GEMM_TILE_ROWS)), for the one GEMM over all of a rank's tokens (decode and prefill chunks batched
together) and for the LM head's logit rows: from one tile of rows up the ramp of a fixed
gemm_half_rows, below it one full tile's efficiency (the compute shrinks with the rows); a
routed expert's grouped GEMM has its own ramp over the rows routed to it
(n_tok_e k / experts touched): MFU_e = mfu n_e / (n_e + moe_half_rows). With gemm_half_rows 0
(a calibrated CPU engine: a one-token GEMV path and a tiled one) decode tokens run at mfu and
prefill tokens at mfu_prefill, and experts at the step's mean.

N_body excludes the embedding table and the LM head (vocab x hidden each; one matrix when
tied). As in vLLM, llama.cpp, SGLang and TensorRT-LLM, the embedding is a row gather (n_tok rows
of hidden, no GEMM) and the LM head runs only on the rows that produce logits: n_logits = every
decode token (x (1 + draft tokens) when verifying MTP) plus the LAST token of each sequence whose
prefill completes in the step (vLLM's logits_indices; llama.cpp's batch entries flagged for
output). The head's weights are read once per step when any logits are computed. vLLM shards
both the head (ParallelLMHead) and the embedding (VocabParallelEmbedding) over TP, hence /tp.
Experts touched: E (1 - (1 - k/E)^n) for n tokens routed top-k among E (every expert some token
picks). Expert-parallel imbalance: the busiest GPU holds 1 + moe_imbalance + sqrt(2 ln G / m)
times the mean m token-assignments (random routing's maximum, plus hot experts).
MTP / speculative decoding with d draft tokens and acceptance a: a verify step runs 1 + d tokens
per sequence and yields g = 1 + a + ... + a^d tokens, after d drafting passes of the MTP module
(one more decoder layer plus the BF16 output head, for every decoding sequence); the engine
emits one token per sequence per step, so a step lasts (T(verify) + d T(draft)) / g, with
prefill scaled so its share per token is kept.
t_multi is the extra cost of a step whose GEMMs run more than one row (a CPU engine's tiled
kernels against its one-token GEMV path; 0 on GPUs). The endpoint's front end (t_req: HTTP,
tokenisation, hand-off) is not part of a step: the engine loop sees a request t_req after it
was sent (bench.sim.virtual, bench.sim.server).
Everything here is a pure function of its inputs, so the engine stays deterministic.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import cached_property

import numpy as np

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
EXACT_SIZES = 8  # batch sizes a step shape names one by one (batch_bucket)
A2A_BYTES = 3  # expert-parallel dispatch in FP8 (1 byte) + combine in BF16 (2 bytes)
# Rows of the smallest tile the dense GEMM kernels schedule on the GPUs modelled (Hopper's wgmma
# and Blackwell's tcgen05 take M = 64; Ampere's CUTLASS/cuBLAS tiles start at 64 rows). A GEMM of
# fewer rows runs the engines' small-M paths (split-K GEMV, narrow tiles) at one tile's
# efficiency: its compute shrinks with its rows and its weight reads set its time.
GEMM_TILE_ROWS = 64


def batch_bucket(n: np.ndarray) -> np.ndarray:
    """The batch sizes one step-shape entry covers, named by the largest: each size up to
    EXACT_SIZES, then 16 (9-16), 32 (17-32) and so on, so a run of 256 sequences is read on
    13 sizes, not 256. Small batches are where a step's shape changes most (a CPU engine's
    one-row kernel path against its multi-row one). For many batch sizes at once."""
    n = np.asarray(n, np.int64)
    pow2 = 2 ** np.ceil(np.log2(np.maximum(n, 1))).astype(np.int64)
    return np.where(n <= EXACT_SIZES, n, pow2)


def shape_factor(shape: tuple[tuple[int, bool, float], ...], n_decode: int, prefill: bool) -> float:
    """A step shape's factor for a step of n_decode decoding sequences (Efficiency.step_shape):
    that batch size's entry (batch_bucket) with the same prefill flag, else the nearest
    measured size's (in log2, the larger on a tie), else 1."""
    size = int(batch_bucket(np.array([max(int(n_decode), 1)]))[0])
    same = [(abs(math.log2(b / size)), -b, f) for b, p, f in shape if p == prefill]
    return min(same)[2] if same else 1.0


def parse_parallel(spec: str) -> tuple[int, int, int]:
    """(tp, dp, ep) of "tp4" (4, 1, 1), "dep8" (1, 8, 8: attention DP + expert parallel), "tep8"
    (8, 1, 8: attention TP + expert parallel)."""
    s = spec.strip().lower()
    shapes = {"dep": lambda n: (1, n, n), "tep": lambda n: (n, 1, n), "tp": lambda n: (n, 1, 1)}
    for prefix, shape in shapes.items():
        rest = s[len(prefix) :]
        if s.startswith(prefix) and rest.isdigit() and int(rest) > 0:
            return shape(int(rest))
    raise ValueError(f"parallelism {spec!r} is not tpN, depN or tepN (e.g. tp4, dep8)")


def mtp_per_position(
    model: ModelProfile, drafts: int, acceptance: float, length: float | None = None
) -> tuple[float, ...]:
    """P(the i-th of `drafts` draft tokens is accepted), i = 1..drafts (a chain: a draft
    counts only when all before it were accepted, so the figures never rise).

    length: a stated mean acceptance length (1 + the sum of these; vLLM's "mean acceptance
    length", SGLang's accept length, InferenceX's golden AL): the one acceptance a with
    a + ... + a^d = length - 1. Else the model's published curve, AL(k) for k drafts, whose
    steps AL(k) - AL(k-1) are the per-position figures (drafts beyond it continue its last
    ratio). Else a^i for the given acceptance.
    """
    if length is not None:
        if not 1.0 <= length <= drafts + 1:
            raise ValueError(
                f"--mtp-acceptance-length {length:g} with --mtp {drafts}: a verify step yields "
                f"1 to {drafts + 1} tokens per sequence; give a value in that range"
            )
        a = _acceptance_for_length(length, drafts)
        return tuple(a**i for i in range(1, drafts + 1))
    curve = model.mtp_acceptance_lengths
    if not curve:
        return tuple(acceptance**i for i in range(1, drafts + 1))
    steps = [round(b - a, 6) for a, b in zip((1.0, *curve), curve, strict=False)]
    while len(steps) < drafts:
        steps.append(steps[-1] * (steps[-1] / steps[-2] if len(steps) > 1 else acceptance))
    return tuple(steps[:drafts])


def _acceptance_for_length(length: float, drafts: int) -> float:
    """The one acceptance a with a + a^2 + ... + a^drafts = length - 1 (bisection: the sum
    rises with a)."""
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        gained = sum(mid**i for i in range(1, drafts + 1))
        lo, hi = (mid, hi) if gained < length - 1 else (lo, mid)
    return lo


@dataclass(frozen=True)
class Deployment:
    """A model served on tp x dp GPUs of one kind, at one precision, by one engine."""

    gpu: GPUProfile
    model: ModelProfile
    precision: Precision
    tp: int
    kv_precision: Precision
    eff: Efficiency
    dp: int = 1
    ep: int = 1
    engine: str = "vllm"
    # front-end processes streaming the tokens (vLLM --api-server-count); 0 = one per
    # data-parallel rank, vLLM's default
    api_servers: int = 0

    @classmethod
    def build(
        cls,
        gpu: str | GPUProfile,
        model: str | ModelProfile,
        precision: str = "fp8",
        tp: int = 1,
        kv_precision: str | None = None,
        *,
        dp: int = 1,
        ep: int = 1,
        engine: str = "vllm",
        mtp: bool | int | None = None,
        mtp_acceptance: float | None = None,
        mtp_acceptance_length: float | None = None,
        profiles: list[dict] | None = None,
        resolved: Efficiency | None = None,
        api_servers: int | None = None,
        **efficiency: float,
    ) -> Deployment:
        """Resolve names to profiles and check the GPU can run the precision and parallelism.

        mtp: None = the engine profile's default; False/True turns MTP off/on where the model
        has an MTP module; an int N drafts N tokens per step (the model's MTP module, or for a
        model without one an EAGLE-style one-layer draft: the cost model is the same).
        mtp_acceptance / mtp_acceptance_length: how the drafts are accepted (mtp_per_position);
        neither: the model's published curve where it has one, else efficiency.yaml's.
        profiles: efficiency profiles to resolve against instead of efficiency.yaml's (the
        calibration fit passes its trial values here). resolved: the efficiency already
        resolved for this GPU, precision, engine and model (a caller building many
        parallelisms of one deployment resolves it once); MTP is still applied.
        api_servers: front-end processes (vLLM --api-server-count); None = one per
        data-parallel rank.
        """
        g = get_gpu(gpu) if isinstance(gpu, str) else gpu
        m = get_model(model) if isinstance(model, str) else model
        p = get_precision(precision)
        if tp < 1 or dp < 1 or tp * dp > g.world_size:
            raise ValueError(
                f"tp={tp} x dp={dp} is outside 1..{g.world_size} GPUs of {g.name}'s scale-up domain"
            )
        if ep not in (1, tp * dp):
            raise ValueError(f"ep={ep} must be 1 or every GPU of the deployment ({tp * dp})")
        if ep > 1 and not m.is_moe:
            raise ValueError(f"{m.name} is dense: expert parallelism needs a MoE model")
        if api_servers is not None and api_servers < 1:
            raise ValueError(f"--api-server-count {api_servers}: at least 1 front end")
        if not g.tflops.get(p.compute):
            raise ValueError(
                f"{g.name} cannot serve {precision}: it has no {p.compute.upper()} tensor cores; "
                f"supported precisions: {', '.join(g.supported_precisions)}"
            )
        kv = get_precision(kv_precision or p.kv_default)
        eff = resolved or efficiency_for(g, p, engine, m.name, profiles, **efficiency)
        if api_servers is not None and not eff.t_fe_tok_s:
            raise ValueError(
                f"--api-server-count is vLLM's: {engine}'s front end is not modelled (no "
                "source here measures it, efficiency.yaml t_fe_tok_s 0); leave it out"
            )
        if mtp is False or mtp == 0 or (mtp in (None, True) and not m.mtp_layers):
            eff = eff.model_copy(update={"mtp_tokens": 0})
        elif mtp is True and not eff.mtp_tokens:
            eff = eff.model_copy(update={"mtp_tokens": eff.mtp_draft_tokens})
        elif mtp is not None and mtp is not True:
            if int(mtp) < 0:
                raise ValueError(f"--mtp {mtp}: draft tokens per step must be 0 or more")
            eff = eff.model_copy(update={"mtp_tokens": int(mtp)})
        if mtp_acceptance is not None and mtp_acceptance_length is not None:
            raise ValueError(
                "--mtp-acceptance and --mtp-acceptance-length both say how drafts are accepted: "
                "give one"
            )
        if mtp_acceptance is not None:
            eff = eff.model_copy(update={"mtp_acceptance": mtp_acceptance})
        if not 0 < eff.mtp_acceptance <= 1:
            raise ValueError(f"MTP acceptance {eff.mtp_acceptance} must be in (0, 1]")
        drafts = int(eff.mtp_tokens)
        if mtp_acceptance_length is not None and not drafts:
            raise ValueError(
                f"--mtp-acceptance-length {mtp_acceptance_length:g} describes drafted tokens: "
                "give --mtp N too (N drafts per step)"
            )
        if drafts and mtp_acceptance is None:
            positions = mtp_per_position(m, drafts, eff.mtp_acceptance, mtp_acceptance_length)
            eff = eff.model_copy(update={"mtp_per_position": positions})
        return cls(g, m, p, tp, kv, eff, dp, ep, engine, api_servers or 0)

    def with_efficiency(self, eff: Efficiency) -> Deployment:
        return replace(self, eff=eff)

    @property
    def front_ends(self) -> int:
        """The front-end processes streaming the tokens: api_servers, else one per rank."""
        return self.api_servers or self.dp

    @property
    def gpus(self) -> int:
        return self.tp * self.dp

    @property
    def parallel(self) -> str:
        if self.dp > 1:
            return f"dep{self.dp}" if self.ep > 1 else f"dp{self.dp}"
        return f"tep{self.tp}" if self.ep > 1 else f"tp{self.tp}"

    @property
    def label(self) -> str:
        mtp = f" MTP{self.eff.mtp_tokens}" if self.eff.mtp_tokens else ""
        return (
            f"{self.model.name} {self.precision.name} on {self.gpus}x {self.gpu.name} "
            f"{self.parallel.upper()} {self.engine}{mtp} (simulated)"
        )

    @cached_property
    def weight_bytes(self) -> float:
        return self.model.weight_bytes(self.precision.name)

    @cached_property
    def expert_bytes_total(self) -> float:
        m = self.model
        return m.routed_expert_bytes(self.precision.name) if m.is_moe else 0.0

    @cached_property
    def expert_bytes(self) -> float:
        """Bytes of one routed expert summed over all MoE layers."""
        m = self.model
        return self.expert_bytes_total / m.experts if m.is_moe else 0.0

    @property
    def expert_shards(self) -> int:
        """GPUs the routed experts are spread over (EP) or sliced across (TP)."""
        return self.ep if self.ep > 1 else self.tp

    @cached_property
    def weight_bytes_per_gpu(self) -> float:
        dense = self.weight_bytes - self.expert_bytes_total
        return dense / self.tp + self.expert_bytes_total / self.expert_shards

    @cached_property
    def kv_bytes_per_token(self) -> float:
        """Bytes of KV the full-attention layers hold and read per token of context."""
        return self.model.kv_bytes_per_token(self.kv_precision.name)

    @cached_property
    def kv_pool_bytes_per_token(self) -> float:
        """Bytes of KV one token of context costs in the pool (the unit of kv_capacity_tokens):
        its full-attention layers' KV. A model whose every layer slides (Mistral-7B-v0.1's
        config.json) has none; its pool is counted in the sliding layers' KV instead, and a
        sequence is charged its whole context, as if the window never slid: exact up to the
        window (4,096 tokens for Mistral), fewer sequences admitted than an engine that frees
        slid-out blocks beyond it."""
        if self.model.kv_layers == 0 and self.model.sliding_window_layers:
            return self._sliding_kv_bytes
        return self.kv_bytes_per_token

    def window_kv_tokens(self, seq_tokens: float) -> int:
        """KV room the sliding-window layers of one sequence of `seq_tokens` tokens hold, in
        tokens of the full-attention layers' KV (the unit of kv_capacity_tokens). Those layers
        keep at most `sliding_window` tokens per sequence (vLLM's hybrid KV cache manager frees
        the blocks that slide out of the window), so a running sequence costs
        min(window, its tokens) of them beyond its context. 0 without sliding-window layers."""
        m = self.model
        full = m.kv_elements_per_token()
        if not m.sliding_window_layers or not full:
            return 0
        held = min(m.sliding_window or 0, seq_tokens)
        return math.ceil(held * m.sliding_kv_elements_per_token() / full)

    @cached_property
    def kv_shards(self) -> int:
        """GPUs one sequence's KV is split across: GQA heads split over TP; MLA's latent is
        replicated on every TP rank (which is why MLA models are served data-parallel)."""
        return 1 if self.model.attention == "mla" else min(self.tp, self.model.kv_heads or 1)

    @cached_property
    def peak_flops(self) -> float:
        return self.gpu.peak_flops(self.precision.compute)

    @cached_property
    def attn_flops(self) -> float:
        """Attention kernels run at FP8 at most (FP4 GEMM peaks do not apply to attention)."""
        compute = "fp8" if self.precision.compute == "fp4" else self.precision.compute
        return self.gpu.peak_flops(compute)

    @cached_property
    def _bw(self) -> float:
        """Achieved bandwidth of a step's reads: the device's peak for weights of this size
        per GPU (a CPU's last-level cache when they fit there), times the fitted MBU."""
        m = self.model
        gathered = (m.embedding_params() - m.head_params()) * self._embed_bpp
        streamed = self.weight_bytes_per_gpu - gathered / self.tp  # an untied embedding table
        return self.gpu.stream_bw_bytes_s(streamed) * self.eff.mbu

    @cached_property
    def _embed_bpp(self) -> float:
        """Bytes per parameter of the embedding table and the LM head (BF16 in quantized
        checkpoints: ModelProfile.kept_precision)."""
        return self.model.kept_precision(self.precision.name).bytes_per_param

    @cached_property
    def mtp_positions(self) -> tuple[float, ...]:
        """P(the i-th draft is accepted), i = 1..d: the resolved per-position figures, else
        a^i for the one acceptance a (a deployment built with an efficiency of its own)."""
        d = int(self.eff.mtp_tokens)
        if len(self.eff.mtp_per_position) == d:
            return self.eff.mtp_per_position
        return tuple(self.eff.mtp_acceptance**i for i in range(1, d + 1))

    @cached_property
    def mtp_gain(self) -> float:
        """Tokens a sequence gains per verify step, the mean acceptance length: 1 + the
        per-position acceptances (1 + a + ... + a^d for one acceptance a)."""
        return 1.0 + sum(self.mtp_positions)

    @cached_property
    def _shape(self) -> tuple[float, float, float, float, float, float, float]:
        """Per-step constants: body params (dense, without embedding and LM head), body bytes,
        active expert params, attention FLOPs per (query, context) pair in decode and in
        prefill, LM head params, LM head bytes (all over the whole model, before TP)."""
        m = self.model
        bpp = self._embed_bpp
        embed = m.embedding_params()
        body_params = max(m.active_params_b * 1e9 - m.active_expert_params() - embed, 0.0)
        body_bytes = max(self.weight_bytes - self.expert_bytes_total - embed * bpp, 0.0)
        return (
            body_params,
            body_bytes,
            m.active_expert_params(),
            m.attn_pair_flops(decode=True),
            m.attn_pair_flops(decode=False),
            m.head_params(),
            m.head_params() * bpp,
        )

    def kv_capacity_tokens(
        self,
        memory_fraction: float | None = None,
        max_num_seqs: int | None = None,
        max_num_batched_tokens: int | None = None,
    ) -> int:
        """Tokens of KV cache over the deployment, by the engine's own memory arithmetic
        (bench.sim.memory) on the memory the device reports; limits are per engine instance
        (data-parallel rank); None = the engine's defaults."""
        from bench.sim.memory import memory_plan
        from bench.sim.profiles import engine_defaults

        plan = memory_plan(self, memory_fraction, max_num_seqs, max_num_batched_tokens)
        if plan.kv <= 0:
            gib = 1 << 30
            raise ValueError(
                f"{self.model.name} in {self.precision.name} ({self.weight_bytes / 1e9:.0f} GB) "
                f"does not fit on {self.gpus}x {self.gpu.name} {self.parallel.upper()}: per GPU "
                f"{plan.weights / gib:.1f} GiB of weights, {plan.activations / gib:.1f} GiB of "
                f"activations and {plan.non_torch / gib:.1f} GiB other against "
                f"{plan.total / gib:.1f} GiB x {plan.fraction:.2f} ({self.engine}'s "
                f"{engine_defaults(self.engine).memory_flag}); raise --tp, lower the precision "
                f"or set --memory-fraction"
            )
        per_rank = plan.kv * self.kv_shards  # a token puts 1/kv_shards of its KV on each
        return int(self.dp * per_rank // self.kv_pool_bytes_per_token)

    def experts_touched(self, n_tok: float) -> float:
        """Expected experts some token routes to, of E, for n_tok tokens routed top-k."""
        m = self.model
        return m.experts * (1 - (1 - m.experts_per_token / m.experts) ** n_tok)

    def weight_bytes_read(self, n_tok: int, logits: bool = True) -> float:
        """Weight bytes one step of n_tok tokens streams over the whole deployment (all GPUs):
        the body, the experts some token routes to, the LM head when the step computes any
        logits, and the n_tok embedding rows it gathers (not the whole table)."""
        body, head = self._shape[1], self._shape[6]
        gathered = n_tok * self.model.hidden * self._embed_bpp
        read = body + (head if logits else 0.0) + gathered
        if self.model.is_moe:
            read += self.expert_bytes * self.experts_touched(n_tok)
        return read

    def step_time(
        self,
        n_decode: int,
        decode_ctx: float,
        n_prefill: int,
        prefill_ctx: float,
        *,
        prefill_seqs: float | None = None,
    ) -> float:
        """Seconds for one iteration of the whole deployment.

        n_decode: decode tokens (one per running sequence); decode_ctx: sum of their context
        lengths (KV tokens read); n_prefill: prefill tokens in this step; prefill_ctx: sum over
        the prefill tokens of the context each attends to (for a chunk of n tokens starting at
        position p: n * (p + n / 2)); prefill_seqs: sequences whose prefill completes in this
        step (each samples its first token, so the LM head runs on its last prompt token);
        None = one when there is prefill (a caller that does not track completions).
        """
        if n_decode + n_prefill == 0:
            return 0.0
        if prefill_seqs is None:
            prefill_seqs = 1.0 if n_prefill else 0.0
        if n_decode and self.eff.mtp_tokens:
            g, d = self.mtp_gain, int(self.eff.mtp_tokens)
            q = 1 + d  # verification computes logits at every drafted position
            logits = n_decode * q + prefill_seqs * g
            t = self._iteration(
                n_decode, decode_ctx, n_prefill * g, prefill_ctx * g, q, logits=logits
            )
            t = (t + d * self._draft_time(n_decode, decode_ctx)) / g
            t *= self.step_scale(n_decode, n_prefill > 0)
            return max(t, self._frontend_time(n_decode + prefill_seqs / g))
        logits = n_decode + prefill_seqs
        t = self._iteration(n_decode, decode_ctx, n_prefill, prefill_ctx, 1, logits=logits)
        t *= self.step_scale(n_decode, n_prefill > 0)
        return max(t, self._frontend_time(n_decode + prefill_seqs))

    def _frontend_time(self, tokens: float) -> float:
        """The serving front end's work on the tokens a step emits (detokenising, streaming
        each to its client), spread over its processes (api_servers; by default one per
        data-parallel rank). It runs in its own process, overlapped with the GPU's next step,
        so it adds nothing until it is the slower of the two: then it sets the pace
        (Efficiency.t_fe_tok_s)."""
        return tokens / self.front_ends * self.eff.t_fe_tok_s

    def step_scale(self, n_decode: float, prefill: bool) -> float:
        """The calibrated device's measured step time over this model's at a batch of n_decode
        decoding sequences, with or without another prompt's prefill in the step
        (Efficiency.step_shape): the nearest batch size measured, as the model's own shape
        carries it beyond; 1 without a measurement. A roofline is smooth in the batch; real
        kernels are not (a CPU's one-row path against its tiled one, a GPU engine's decode
        batch padded up to a captured CUDA graph's size), and a fit of a few smooth terms
        trades one batch size's error against another's."""
        shape = self.eff.step_shape
        if not shape or n_decode < 1:  # a step of prompts alone: no token gap measured it
            return 1.0
        key = (int(n_decode), bool(prefill))
        memo = self._scale_memo
        if key not in memo:
            memo[key] = shape_factor(shape, *key)
        return memo[key]

    @cached_property
    def _scale_memo(self) -> dict[tuple[int, bool], float]:
        return {}

    def _draft_time(self, n_decode: float, decode_ctx: float) -> float:
        """One drafting pass: the MTP module is one more decoder layer plus the (shared, BF16)
        output head, run for every decoding sequence, once per drafted token."""
        m, e = self.model, self.eff
        body = self._iteration(n_decode, decode_ctx, 0, 0, 1, logits=0) - e.t_fix_s
        head_params = m.head_params() / self.tp
        rows = n_decode / self.dp
        mfu = self._gemm_mfu(rows) if e.gemm_half_rows else e.mfu
        head = max(
            head_params * 2 / self._bw,  # BF16 weights
            2 * head_params * rows / (self.gpu.peak_flops("bf16") * mfu),
        )
        return body / m.layers + head

    def _iteration(
        self,
        n_decode: float,
        decode_ctx: float,
        n_prefill: float,
        prefill_ctx: float,
        q: int,
        *,
        logits: float | None = None,
    ) -> float:
        """One forward pass; logits: rows the LM head runs on over the deployment (decode
        tokens x q + prefill sequences completing); None = n_decode x q, plus one with prefill."""
        m, e, tp, dp, F = self.model, self.eff, self.tp, self.dp, self.peak_flops
        nd, npf = n_decode * q / dp, n_prefill / dp  # tokens on one data-parallel rank
        n_tok = nd + npf
        if logits is None:
            logits = n_decode * q + (1.0 if n_prefill else 0.0)
        rows_p = max(logits / dp - nd, 0.0)  # prefill rows (those beyond the decode tokens)
        body_params, body_bytes, _, pair_d, pair_p, head_params, head_bytes = self._shape
        if e.gemm_half_rows:  # one GEMM over every token of the step
            work = n_tok / self._gemm_mfu(n_tok)
            head_rows = logits / dp
            head_work = head_rows / self._gemm_mfu(head_rows) if head_rows else 0.0
        else:
            work = nd / e.mfu + npf / e.mfu_prefill  # tokens weighted by 1 / MFU
            head_work = min(logits / dp, nd) / e.mfu + rows_p / e.mfu_prefill
        flops = 2 * (body_params * work + head_params * head_work)
        read = body_bytes + (head_bytes if logits > 0 else 0.0)
        read += n_tok * m.hidden * self._embed_bpp  # embedding rows gathered
        t = max(flops / (tp * F), read / tp / self._bw)
        if m.is_moe:
            t += self._expert_time(n_tok, work)
        kv_read = decode_ctx / dp * self.kv_bytes_per_token / self.kv_shards
        attn_d = decode_ctx / dp * q * pair_d / tp
        attn_p = prefill_ctx / dp * pair_p / tp
        if m.sliding_window_layers:  # each query sees at most `sliding_window` tokens there
            d_sw, p_sw = (
                self._windowed(n_decode, decode_ctx),
                self._windowed(n_prefill, prefill_ctx),
            )
            kv_read += d_sw / dp * self._sliding_kv_bytes / self.kv_shards
            attn_d += d_sw / dp * q * m.sliding_attn_pair_flops() / tp
            attn_p += p_sw / dp * m.sliding_attn_pair_flops() / tp
        t += max(kv_read / (self._bw * e.kv_bw_ratio), attn_d / (self.attn_flops * e.mfu_attn))
        t += attn_p / (self.attn_flops * e.mfu_prefill)
        t += self._comm_time(n_tok)
        layers, moe_layers, mla_layers = self._timed_layers
        t += e.t_fix_s + layers * e.t_layer_s + moe_layers * e.t_moe_layer_s
        t += mla_layers * e.t_mla_layer_s
        t += e.t_multi_s if n_tok > 1 else 0.0
        return t + n_tok * (e.t_tok_s + m.moe_layers * e.t_moe_tok_s)

    @cached_property
    def _timed_layers(self) -> tuple[int, int, int]:
        n = timed_layers(self.model)
        return n["t_layer_s"], n["t_moe_layer_s"], n["t_mla_layer_s"]

    def _gemm_mfu(self, rows: float) -> float:
        """MFU of a dense weight GEMM of `rows` token rows: the ceiling mfu, reached as the rows
        fill the tensor cores' tiles and waves (half of it at Efficiency.gemm_half_rows). Below
        one tile (GEMM_TILE_ROWS) the efficiency stays one full tile's: the ramp alone charged a
        one-row GEMM as much compute as ~190 rows, so on GPUs with few FLOPs per byte of
        bandwidth (A100, H200 at FP8, MI300X through the AMD factors) batch-1 decode came out
        compute-bound and 10-45% slow; with the floor its weight reads set it, as measured."""
        e = self.eff
        return e.mfu * rows / (rows + e.gemm_half_rows * min(1.0, rows / GEMM_TILE_ROWS))

    @cached_property
    def _sliding_kv_bytes(self) -> float:
        m = self.model
        return m.sliding_kv_elements_per_token() * self.kv_precision.bytes_per_param

    def _windowed(self, n: float, ctx: float) -> float:
        """Context summed over n queries, each capped at the sliding window (mean context
        capped: the step only knows the sum)."""
        return n * min(ctx / n, self.model.sliding_window or 0) if n else 0.0

    def _expert_time(self, n_tok: float, work: float) -> float:
        """Routed experts on the busiest GPU: FLOPs with imbalance vs bytes of touched experts."""
        m, e = self.model, self.eff
        g = self.expert_shards
        routed_tok = n_tok * self.dp if self.ep > 1 else n_tok  # EP: every rank's tokens
        imbalance = 1.0
        if self.ep > 1:
            mean = max(routed_tok * m.experts_per_token / g, 1.0)
            imbalance = 1 + e.moe_imbalance + math.sqrt(2 * math.log(g) / mean)
        if e.gemm_half_rows:  # each expert's GEMM runs the rows routed to it, on its own ramp
            rows = routed_tok * m.experts_per_token / max(self.experts_touched(routed_tok), 1e-9)
            mfu = self._expert_mfu(rows)
        else:
            mfu = (n_tok / work if work else e.mfu) * e.moe_mfu_ratio * self._expert_format_ratio
        flops = 2 * self._shape[2] * routed_tok * imbalance / g
        read = self.experts_touched(routed_tok) * self.expert_bytes / g
        return max(flops / (self.peak_flops * mfu), read / (self._bw * e.moe_bw_ratio))

    @cached_property
    def _expert_format_ratio(self) -> float:
        """The routed experts' grouped GEMMs in FP8 against their MFU in other formats: every
        FP8 MoE checkpoint here is 128x128 block-scaled, whose grouped kernels an engine may run
        well below its dense FP8 GEMMs (fp8_moe_mfu_ratio; 1 where the engine's are as good)."""
        return self.eff.fp8_moe_mfu_ratio if self.precision.name == "fp8" else 1.0

    def _expert_mfu(self, rows: float) -> float:
        """MFU of a routed expert's grouped GEMM of `rows` rows: the experts' own ramp
        (moe_half_rows) from one row, at moe_mfu_ratio of the dense ceiling. No tile floor as
        the dense GEMMs have: one (16-row grouped-GEMM tiles) fitted 12.3% in sample against
        12.8% but put MI325X's never-fitted gpt-oss points 39% off against 26%."""
        e = self.eff
        half = e.moe_half_rows or e.gemm_half_rows
        return e.mfu * rows / (rows + half) * e.moe_mfu_ratio * self._expert_format_ratio

    def _comm_time(self, n_tok: float) -> float:
        m, e = self.model, self.eff
        link = self.gpu.scale_up_bytes_s * e.nvlink_efficiency
        t = 0.0
        if self.tp > 1:
            payload = n_tok * m.hidden * ACTIVATION_BYTES * 2 * (self.tp - 1) / self.tp
            t += 2 * m.layers * (e.allreduce_latency_s + payload / link)
        if self.ep > 1 and self.dp > 1:  # TEP: every rank holds every token, no dispatch
            g = self.ep
            payload = n_tok * m.experts_per_token * m.hidden * A2A_BYTES * (g - 1) / g
            t += m.moe_layers * (2 * e.alltoall_latency_s + payload / link)
        return t


def timed_layers(model: ModelProfile) -> dict[str, int]:
    """How many of a model's layers each per-layer time of a step applies to (Efficiency's
    t_layer_s, t_moe_layer_s and t_mla_layer_s): every layer, the mixture-of-experts ones,
    and every layer of a model with latent attention. The step and the calibration's count of
    what each parameter is fitted on read it here."""
    mla = model.layers if model.attention == "mla" else 0
    return {"t_layer_s": model.layers, "t_moe_layer_s": model.moe_layers, "t_mla_layer_s": mla}


def steady_state(
    dep: Deployment, isl: float, osl: int, concurrency: float, chunk_tokens: int | None = None
) -> dict[str, float]:
    """Closed-loop steady state at a fixed concurrency C, as the engine schedules it.

    Every step decodes C tokens of mean context ISL + OSL/2; prompts arrive at C/OSL per step
    and are prefilled whole, up to `chunk_tokens` per step (vLLM's max_num_batched_tokens, per
    data-parallel rank; default: the engine's own). So a fraction f of steps carries P
    prefill tokens and the rest decode only, which matters at low concurrency, where a whole
    prompt in one step is compute-bound while spreading it over steps would hide it under the
    weight reads. Returns TPOT (s), interactivity (tok/s/user), output and total tok/s per GPU.
    """
    from bench.sim.profiles import engine_defaults

    c = concurrency
    budget = (chunk_tokens or engine_defaults(dep.engine, dep.gpu).max_num_batched_tokens) * dep.dp
    demand = c * isl / osl  # prefill tokens per step on average
    per_step = min(max(isl, demand), max(budget - c, isl))
    f = demand / per_step
    if f >= 1:  # every step carries prefill: all of the demand
        per_step, f = demand, 1.0
    ctx = c * (isl + osl / 2)
    seqs = per_step / isl if isl else 0.0  # prompts of isl tokens completing per prefill step
    t = dep.step_time(c, ctx, per_step, per_step * isl / 2, prefill_seqs=seqs)
    if f < 1:
        t = f * t + (1 - f) * dep.step_time(c, ctx, 0, 0, prefill_seqs=0)
    out = c / t / dep.gpus
    return {
        "tpot_s": t,
        "interactivity": 1 / t,
        "output_tps_per_gpu": out,
        "total_tps_per_gpu": out * (1 + isl / osl),
    }
