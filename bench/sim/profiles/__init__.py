"""Model, engine and efficiency profiles for the simulated endpoint, read from the YAML files
beside this; GPUs come from the hardware catalogue (bench.hardware, re-exported here).

The YAML files are the single source of truth for every model and engine figure (each entry
carries its source); this module only parses and validates them and derives the quantities
the engine needs (weight bytes, KV bytes per token, expert bytes), so no number is typed twice.
Users extend the catalogue by passing their own YAML file with the same layout.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from bench import hardware
from bench.hardware import COMPUTE_PRECISIONS, GPUProfile, ProfileError, get_gpu, load_gpus

HERE = Path(__file__).parent
MODELS_YAML = HERE / "models.yaml"
EFFICIENCY_YAML = HERE / "efficiency.yaml"
ENGINES_YAML = HERE / "engines.yaml"
PUBLISHED_YAML = HERE / "published.yaml"  # the published measurements (bench.sim.calibration)
GPUS_YAML = hardware.GPUS_YAML


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Precision(_Frozen):
    """A serving precision: bytes per weight and the GPU unit that runs its GEMMs."""

    name: str
    bytes_per_param: float
    compute: Literal["bf16", "fp8", "fp4"]
    kv_default: str
    note: str = ""


class ModelProfile(_Frozen):
    """One model's shape; weight and KV sizes are derived here, never stored."""

    name: str
    hf_id: str
    arch: Literal["dense", "moe"]
    params_b: float
    active_params_b: float
    layers: int
    hidden: int
    q_heads: int
    attention: Literal["gqa", "mla"] = "gqa"
    kv_heads: int | None = None
    head_dim: int | None = None
    kv_lora_rank: int | None = None
    qk_rope_head_dim: int | None = None
    qk_nope_head_dim: int | None = None
    v_head_dim: int | None = None
    mtp_layers: int = 0
    # mean acceptance length (tokens a verify step yields per sequence) with 1, 2, ... drafts,
    # as published for the model's own MTP module (bench.sim.roofline.mtp_per_position)
    mtp_acceptance_lengths: tuple[float, ...] = ()
    sliding_window_layers: int = 0
    sliding_window: int | None = None
    ffn: int | None = None
    dense_layers: int = 0
    expert_ffn: int | None = None
    experts: int = 0
    experts_per_token: int = 0
    shared_experts: int = 0
    vocab: int
    tie_word_embeddings: bool = False
    # the checkpoint keeps its non-expert weights (attention, router, shared layers) in this
    # precision whatever the experts are served in (gpt-oss: MXFP4 experts, BF16 elsewhere)
    dense_precision: str | None = None
    context: int
    aliases: tuple[str, ...] = ()
    notes: str = ""
    source: str

    @property
    def is_moe(self) -> bool:
        return self.arch == "moe"

    @property
    def kv_layers(self) -> int:
        """Layers whose KV cache grows with context (sliding-window layers excluded)."""
        return self.layers - self.sliding_window_layers

    def kv_elements_per_token(self) -> int:
        if self.attention == "mla":
            return self.kv_layers * (self.kv_lora_rank + self.qk_rope_head_dim)
        return 2 * self.kv_layers * self.kv_heads * self.head_dim

    def sliding_kv_elements_per_token(self) -> int:
        """KV elements per token of the sliding-window layers (kept for `sliding_window`
        tokens per sequence only)."""
        if not self.sliding_window_layers or self.attention == "mla":
            return 0
        return 2 * self.sliding_window_layers * self.kv_heads * self.head_dim

    def sliding_attn_pair_flops(self) -> float:
        """Attention FLOPs per (query, context token) pair over the sliding-window layers."""
        if not self.sliding_window_layers or self.attention == "mla":
            return 0.0
        return 4 * self.q_heads * self.head_dim * self.sliding_window_layers

    def kv_bytes_per_token(self, kv_precision: str) -> float:
        return self.kv_elements_per_token() * get_precision(kv_precision).bytes_per_param

    def weight_bytes(self, precision: str) -> float:
        """Bytes of the checkpoint served in `precision`: routed experts in it, the other
        weights in it too unless the checkpoint keeps them wider (`dense_precision`), and the
        embedding table and LM head as quantized checkpoints keep them (`kept_precision`)."""
        embed = self.embedding_params()
        experts = self.routed_expert_params() if self.is_moe else 0.0
        rest = max(self.params_b * 1e9 - embed - experts, 0.0)
        dense = get_precision(self.dense_precision or precision).bytes_per_param
        return (
            embed * self.kept_precision(precision).bytes_per_param
            + rest * dense
            + experts * get_precision(precision).bytes_per_param
        )

    def kept_precision(self, precision: str) -> Precision:
        """The precision of the embedding table and the LM head when serving in `precision`.
        FP8 and FP4 checkpoints quantize the linear layers of the decoder and keep these two in
        BF16 [S76] (ModelOpt and llm-compressor leave `lm_head` out; an embedding is a table,
        not a linear layer); BF16 and wider keep them as they are."""
        prec = get_precision(precision)
        return get_precision("bf16") if prec.bytes_per_param < 2 else prec

    def head_params(self) -> float:
        """Parameters of the LM head (vocab x hidden), the GEMM that turns a hidden state into
        logits; also the size of the embedding table, whose rows are gathered, not multiplied."""
        return float(self.vocab * self.hidden)

    def embedding_params(self) -> float:
        """Parameters of the embedding table and the LM head as stored (counted in params_b):
        one vocab x hidden matrix when they are tied (config.json `tie_word_embeddings`), two
        otherwise."""
        return self.head_params() * (1 if self.tie_word_embeddings else 2)

    @property
    def moe_layers(self) -> int:
        return self.layers - self.dense_layers if self.is_moe else 0

    def expert_params(self) -> float:
        """Parameters of one routed expert in one layer (gated MLP: gate, up, down)."""
        return 3 * self.hidden * (self.expert_ffn or 0) if self.is_moe else 0.0

    def routed_expert_params(self) -> float:
        """Parameters of all routed experts across all MoE layers."""
        return self.experts * self.moe_layers * self.expert_params()

    def active_expert_params(self) -> float:
        """Routed-expert parameters one token runs through (top-k experts in every MoE layer)."""
        return self.experts_per_token * self.moe_layers * self.expert_params()

    def attn_pair_flops(self, decode: bool) -> float:
        """FLOPs per (query token, context token) pair summed over the layers that attend.

        GQA: QK^T and PV, 2 x 2 x q_heads x head_dim per layer. MLA (DeepSeek) prefill runs the
        decompressed heads (qk = nope + rope, v); MLA decode runs in the latent space
        ("absorbed"): 2 x q_heads x (2 x kv_lora_rank + rope) per layer, which is why MLA decode
        attention is compute-bound where GQA's is bandwidth-bound.
        """
        if self.attention == "mla":
            if decode:
                width = 2 * self.kv_lora_rank + self.qk_rope_head_dim
            else:
                width = self.qk_nope_head_dim + self.qk_rope_head_dim + self.v_head_dim
            return 2 * self.q_heads * width * self.kv_layers
        return 4 * self.q_heads * self.head_dim * self.kv_layers

    def routed_expert_bytes(self, precision: str) -> float:
        """Bytes of all routed experts across all MoE layers."""
        return (
            self.experts
            * self.moe_layers
            * self.expert_params()
            * get_precision(precision).bytes_per_param
        )


class Efficiency(_Frozen):
    """Step-time model efficiency parameters; values and sources live in efficiency.yaml."""

    mbu: float
    kv_bw_ratio: float
    mfu: float
    mfu_prefill: float
    mfu_attn: float
    t_fix_s: float
    t_tok_s: float
    t_fe_tok_s: float = 0.0
    t_layer_s: float = 0.0
    t_moe_layer_s: float = 0.0
    t_mla_layer_s: float = 0.0
    t_multi_s: float = 0.0
    gemm_half_rows: float = 0.0
    moe_half_rows: float = 0.0
    moe_bw_ratio: float = 1.0
    t_req_s: float = 0.0
    step_cv: float = 0.0
    # A calibrated device's measured step time against the model's, by batch: ((decoding
    # sequences' batch_bucket, another prompt's prefill shared the step, factor), ...); empty
    # for a device never measured (bench.sim.roofline.Deployment.step_scale)
    step_shape: tuple[tuple[int, bool, float], ...] = ()
    t_moe_tok_s: float
    moe_imbalance: float
    moe_mfu_ratio: float
    fp8_moe_mfu_ratio: float = 1.0
    allreduce_latency_s: float
    alltoall_latency_s: float
    nvlink_efficiency: float
    mtp_tokens: int
    mtp_draft_tokens: int
    mtp_acceptance: float
    # P(the i-th draft is accepted), i = 1..mtp_tokens, where known per position (a model's
    # published curve, or a stated acceptance length); empty: mtp_acceptance ** i
    mtp_per_position: tuple[float, ...] = ()


class DeviceDefaults(_Frozen):
    """Batch limits an engine picks on some devices instead of its base ones (engines.yaml):
    a rule matches a device of its vendor (any, if not given) reporting at least
    min_memory_gib whose lower-case name contains none of except_names."""

    vendor: str | None = None
    min_memory_gib: float = 0.0
    except_names: tuple[str, ...] = ()
    # each limit a rule leaves out (None) stays the engine's base one
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    cuda_graph_max_bs: tuple[int, int] | None = None  # as EngineDefaults' (SGLang's tiers)

    def applies(self, gpu: GPUProfile) -> bool:
        """As the engine decides it: the device's kind, the memory it reports and its name."""
        if self.vendor is not None and gpu.vendor != self.vendor:
            return False
        big = gpu.hbm_bytes >= self.min_memory_gib * 2**30
        return big and not any(x in gpu.name.lower() for x in self.except_names)


class EngineDefaults(_Frozen):
    """One serving engine's own defaults and how it sizes its KV cache (engines.yaml)."""

    name: str
    memory: Literal["total_fraction", "sglang_static", "free_fraction"]
    memory_fraction: float | None
    memory_flag: str
    max_num_seqs: int
    max_num_batched_tokens: int
    block_size: int
    watermark: float
    source: str
    # the largest batch SGLang captures a CUDA graph for, below TP 4 and at TP 4 and up: it sizes
    # SGLang's memory reserve (bench.sim.memory.sglang_mem_fraction_static); None elsewhere
    cuda_graph_max_bs: tuple[int, int] | None = None
    by_device: tuple[DeviceDefaults, ...] = ()  # the first that matches replaces the limits

    def graph_batch(self, tp: int) -> int:
        """The largest CUDA-graph batch at this tensor-parallel size (SGLang's cuda_graph_max_bs)."""
        if self.cuda_graph_max_bs is None:
            raise ValueError(f"engine {self.name!r} states no CUDA-graph batch (engines.yaml)")
        small, large = self.cuda_graph_max_bs
        return small if tp < 4 else large


_read_yaml = hardware.read_yaml


def published_sources(path: Path = PUBLISHED_YAML) -> dict[str, str]:
    """The [S#] source list of the published measurements: what every point, speed-up and
    per-request suite must cite."""
    return dict(_read_yaml(path)["sources"])


_parse = hardware.parse_entry


@lru_cache(maxsize=8)
def _load_models_cached(extra: Path | None) -> dict[str, ModelProfile]:
    models: dict[str, ModelProfile] = {}
    for path in [MODELS_YAML] + ([extra] if extra else []):
        for name, body in (_read_yaml(path).get("models") or {}).items():
            models[name] = _parse(ModelProfile, name, body, path)
    return models


def load_models(extra_path: Path | None = None) -> dict[str, ModelProfile]:
    """All model profiles by canonical name; entries in extra_path add to or replace shipped ones."""
    return dict(_load_models_cached(Path(extra_path) if extra_path else None))


def get_model(name: str, extra_path: Path | None = None) -> ModelProfile:
    """A model by canonical name, alias or Hugging Face id, case-insensitive, or from a Hugging
    Face config.json (a path to the file or the directory holding it)."""
    from bench.sim.profiles.hf_config import config_path

    path = config_path(name)
    if path is not None:
        return _model_from_config(path.resolve())
    try:
        return hardware.lookup("model", name, load_models(extra_path))
    except ProfileError as exc:
        raise ProfileError(
            f"{exc}; or give a path to the model's Hugging Face config.json"
        ) from None


@lru_cache(maxsize=16)
def _model_from_config(path: Path) -> ModelProfile:
    from bench.sim.profiles.hf_config import model_name, profile_fields

    return _parse(ModelProfile, model_name(path), profile_fields(path), path)


@lru_cache(maxsize=1)
def _precisions() -> dict[str, Precision]:
    raw = _read_yaml(MODELS_YAML).get("precisions") or {}
    return {n: _parse(Precision, n, b, MODELS_YAML) for n, b in raw.items()}


def get_precision(name: str) -> Precision:
    """A serving precision (bf16, fp16, fp8, fp4/nvfp4, mxfp4)."""
    table = _precisions()
    prec = table.get(name.strip().lower())
    if prec is None:
        raise ProfileError(f"unknown precision {name!r}; known precisions: {', '.join(table)}")
    return prec


@lru_cache(maxsize=4)
def _efficiency_file(path: Path) -> dict[str, Any]:
    return _read_yaml(path)


def fitted_parameters() -> list[tuple[str, float, list[float], str]]:
    """(name, fitted value, physical range, range source) of each fitted parameter."""
    data = _efficiency_file(EFFICIENCY_YAML)
    specs = data.get("fit") or {}
    out = []
    for name, v in (data.get("fitted_values") or {}).items():
        spec = specs.get(name.split(".")[0], {})
        out.append((name, v["value"], v["range"], spec.get("source", "")))
    return out


def efficiency_profiles(path: Path = EFFICIENCY_YAML) -> list[dict[str, Any]]:
    """Hand-set `profiles` then fitted entries, each {match, set, source}."""
    data = _efficiency_file(path)
    return list(data.get("profiles") or []) + list(data.get("fitted") or [])


def _matches(match: dict[str, Any], key: dict[str, str]) -> bool:
    """Every key of `match` names the deployment's value, or a list holding it."""
    return all(
        str(key.get(k, "")).lower() in [str(x).lower() for x in (v if isinstance(v, list) else [v])]
        for k, v in match.items()
    )


def resolve_efficiency(
    key: dict[str, str], profiles: list[dict[str, Any]] | None = None
) -> dict[str, float]:
    """Parameter values for one deployment key {vendor, gpu, compute, precision, engine, model}.

    Defaults first, then every profile whose `match` the key satisfies, least specific first.
    """
    raw = _efficiency_file(EFFICIENCY_YAML).get("parameters") or {}
    values = {k: v["value"] for k, v in raw.items()}
    chosen = [p for p in (efficiency_profiles() if profiles is None else profiles)]
    chosen = [p for p in chosen if _matches(p.get("match") or {}, key)]
    for prof in sorted(chosen, key=lambda p: len(p.get("match") or {})):
        values.update(prof.get("set") or {})
    return values


def efficiency_for(
    gpu: GPUProfile,
    precision: Precision | str = "fp8",
    engine: str = "vllm",
    model: str = "",
    profiles: list[dict[str, Any]] | None = None,
    **overrides: float | tuple,
) -> Efficiency:
    """Defaults, then the matching efficiency profiles, then the GPU's own overrides, then the
    caller's."""
    prec = get_precision(precision) if isinstance(precision, str) else precision
    fmt = "nvfp4" if prec.name == "fp4" else prec.name
    key = {"vendor": gpu.vendor, "gpu": gpu.name, "compute": prec.compute, "precision": fmt}
    key.update(engine=engine, model=model)
    values = {**resolve_efficiency(key, profiles), **gpu.efficiency, **overrides}
    return Efficiency(**values)


ENGINES = ("vllm", "sglang", "trtllm")


def engine_family(engine: str) -> str:
    """The engine whose kernels and scheduler run: dynamo-sglang is SGLang's, "trt" TensorRT-LLM."""
    name = engine.strip().lower().split("-")[-1]
    return {"trt": "trtllm", "tensorrt": "trtllm", "tensorrt_llm": "trtllm"}.get(name, name)


def engine_defaults(engine: str = "vllm", gpu: GPUProfile | None = None) -> EngineDefaults:
    """An engine's own defaults on `gpu` (frozen, shared: the calibration asks ~100,000
    times): the batch limits it picks for that device where it picks by device (vLLM's and
    SGLang's by_device), else its base ones; gpu None = the base ones."""
    base = _engine_defaults(engine_family(engine))
    if gpu is None:
        return base
    rule = next((r for r in base.by_device if r.applies(gpu)), None)
    return base if rule is None else _device_defaults(base, rule)


@lru_cache(maxsize=8)
def _engine_defaults(family: str) -> EngineDefaults:
    raw = _read_yaml(ENGINES_YAML).get("engines") or {}
    if family not in raw:
        raise ProfileError(f"unknown engine {family!r}; known engines: {', '.join(raw)}")
    return _parse(EngineDefaults, family, raw[family], ENGINES_YAML)


@lru_cache(maxsize=16)
def _device_defaults(base: EngineDefaults, rule: DeviceDefaults) -> EngineDefaults:
    fields = ("max_num_seqs", "max_num_batched_tokens", "cuda_graph_max_bs")
    limits = {f: getattr(rule, f) for f in fields if getattr(rule, f) is not None}
    return base.model_copy(update=limits)


@lru_cache(maxsize=1)
def memory_constants() -> dict[str, Any]:
    """engines.yaml's non-torch memory and activation constants, by name (values only)."""
    data = _read_yaml(ENGINES_YAML)
    out: dict[str, Any] = {}
    for section in ("non_torch", "activations"):
        out.update({k: v["value"] for k, v in (data.get(section) or {}).items()})
    return out


__all__ = [
    "COMPUTE_PRECISIONS",
    "Efficiency",
    "GPUProfile",
    "ModelProfile",
    "Precision",
    "ProfileError",
    "EngineDefaults",
    "efficiency_for",
    "efficiency_profiles",
    "resolve_efficiency",
    "fitted_parameters",
    "get_gpu",
    "get_model",
    "get_precision",
    "load_gpus",
    "load_models",
    "engine_defaults",
    "engine_family",
    "memory_constants",
]
