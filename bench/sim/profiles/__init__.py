"""Hardware and model profiles for the simulated endpoint, read from the YAML files beside this.

The YAML files are the single source of truth for every GPU and model figure (each entry
carries its source); this module only parses and validates them and derives the quantities
the engine needs (weight bytes, KV bytes per token, expert bytes), so no number is typed twice.
Users extend the catalogue by passing their own YAML file with the same layout.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field

HERE = Path(__file__).parent
GPUS_YAML = HERE / "gpus.yaml"
MODELS_YAML = HERE / "models.yaml"
EFFICIENCY_YAML = HERE / "efficiency.yaml"

COMPUTE_PRECISIONS = ("bf16", "fp8", "fp4")


class ProfileError(ValueError):
    """A profile name is unknown or a profile file is malformed."""


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class GPUProfile(_Frozen):
    """One accelerator: memory, bandwidth, dense peak per precision, power, scale-up link."""

    name: str
    vendor: str
    hbm_gb: float
    hbm_bw_tbs: float
    tflops: dict[str, float | None]
    tdp_w: float
    scale_up_gbps: float
    scale_up_tech: str = ""
    world_size: int = 8
    rack_gpus: int = 0
    aliases: tuple[str, ...] = ()
    notes: str = ""
    source: str
    efficiency: dict[str, float] = Field(default_factory=dict)

    @property
    def hbm_bytes(self) -> float:
        return self.hbm_gb * 1e9

    @property
    def hbm_bw_bytes_s(self) -> float:
        return self.hbm_bw_tbs * 1e12

    @property
    def scale_up_bytes_s(self) -> float:
        return self.scale_up_gbps * 1e9

    @property
    def supported_precisions(self) -> list[str]:
        """Compute precisions this GPU has tensor-core peak figures for."""
        return [p for p in COMPUTE_PRECISIONS if self.tflops.get(p)]

    def peak_flops(self, compute: str) -> float:
        """Dense peak FLOP/s at a compute precision; ValueError when the GPU has no such unit."""
        tf = self.tflops.get(compute)
        if not tf:
            raise ValueError(
                f"{self.name} has no {compute.upper()} tensor cores; "
                f"it supports {', '.join(self.supported_precisions)}"
            )
        return tf * 1e12


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
    sliding_window_layers: int = 0
    sliding_window: int | None = None
    ffn: int | None = None
    dense_layers: int = 0
    expert_ffn: int | None = None
    experts: int = 0
    experts_per_token: int = 0
    shared_experts: int = 0
    vocab: int
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

    def kv_bytes_per_token(self, kv_precision: str) -> float:
        return self.kv_elements_per_token() * get_precision(kv_precision).bytes_per_param

    def weight_bytes(self, precision: str) -> float:
        return self.params_b * 1e9 * get_precision(precision).bytes_per_param

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
    mfu: float
    mfu_prefill: float
    mfu_attn: float
    t_fix_s: float
    t_tok_s: float
    t_moe_tok_s: float
    moe_imbalance: float
    moe_mfu_ratio: float
    allreduce_latency_s: float
    alltoall_latency_s: float
    nvlink_efficiency: float
    mtp_tokens: int
    mtp_draft_tokens: int
    mtp_acceptance: float


class ServingDefaults(_Frozen):
    """vLLM's serving defaults used when the caller does not override them."""

    gpu_memory_utilization: float
    kv_block_size: int
    max_num_seqs: int
    max_num_batched_tokens: int
    kv_watermark: float


def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ProfileError(f"cannot read profile file {path}: {exc}") from exc
    if not isinstance(data, dict):
        raise ProfileError(f"profile file {path} must be a mapping at the top level")
    return data


def _parse(cls: type[BaseModel], name: str, body: Any, path: Path) -> Any:
    if not isinstance(body, dict):
        raise ProfileError(f"{path}: entry {name!r} must be a mapping")
    try:
        return cls(name=name, **body)
    except Exception as exc:  # pydantic.ValidationError: point at the file and entry
        raise ProfileError(f"{path}: entry {name!r} is invalid: {exc}") from exc


@lru_cache(maxsize=8)
def _load_gpus_cached(extra: Path | None) -> dict[str, GPUProfile]:
    gpus: dict[str, GPUProfile] = {}
    for path in [GPUS_YAML] + ([extra] if extra else []):
        for name, body in (_read_yaml(path).get("gpus") or {}).items():
            gpus[name] = _parse(GPUProfile, name, body, path)
    return gpus


@lru_cache(maxsize=8)
def _load_models_cached(extra: Path | None) -> dict[str, ModelProfile]:
    models: dict[str, ModelProfile] = {}
    for path in [MODELS_YAML] + ([extra] if extra else []):
        for name, body in (_read_yaml(path).get("models") or {}).items():
            models[name] = _parse(ModelProfile, name, body, path)
    return models


def load_gpus(extra_path: Path | None = None) -> dict[str, GPUProfile]:
    """All GPU profiles by canonical name; entries in extra_path add to or replace shipped ones."""
    return dict(_load_gpus_cached(Path(extra_path) if extra_path else None))


def load_models(extra_path: Path | None = None) -> dict[str, ModelProfile]:
    """All model profiles by canonical name; entries in extra_path add to or replace shipped ones."""
    return dict(_load_models_cached(Path(extra_path) if extra_path else None))


def _lookup(kind: str, name: str, table: dict[str, Any]) -> Any:
    key = name.strip().lower()
    for canonical, prof in table.items():
        if key == canonical.lower() or key in (a.lower() for a in prof.aliases):
            return prof
    known = ", ".join(f"{c} ({'/'.join(p.aliases)})" if p.aliases else c for c, p in table.items())
    raise ProfileError(f"unknown {kind} {name!r}; known {kind}s: {known}")


def get_gpu(name: str, extra_path: Path | None = None) -> GPUProfile:
    """A GPU by canonical name or alias, case-insensitive ("b200" -> B200-SXM, "h100" -> H100-SXM)."""
    return _lookup("GPU", name, load_gpus(extra_path))


def get_model(name: str, extra_path: Path | None = None) -> ModelProfile:
    """A model by canonical name, alias or Hugging Face id, case-insensitive."""
    return _lookup("model", name, load_models(extra_path))


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


@lru_cache(maxsize=1)
def _section_values(section: str) -> dict[str, Any]:
    raw = _read_yaml(GPUS_YAML).get(section) or {}
    return {k: v["value"] for k, v in raw.items()}


@lru_cache(maxsize=4)
def _efficiency_file(path: Path) -> dict[str, Any]:
    return _read_yaml(path)


def efficiency_sources() -> dict[str, str]:
    """Where each efficiency parameter's default comes from (for docs and `sim gpus`)."""
    raw = _efficiency_file(EFFICIENCY_YAML).get("parameters") or {}
    return {k: v["source"] for k, v in raw.items()}


def efficiency_profiles(path: Path = EFFICIENCY_YAML) -> list[dict[str, Any]]:
    """Hand-set `profiles` then fitted entries, each {match, set, source}."""
    data = _efficiency_file(path)
    return list(data.get("profiles") or []) + list(data.get("fitted") or [])


def _matches(match: dict[str, str], key: dict[str, str]) -> bool:
    return all(str(key.get(k, "")).lower() == str(v).lower() for k, v in match.items())


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
    **overrides: float,
) -> Efficiency:
    """Defaults, then the matching efficiency profiles, then the GPU's own overrides, then the
    caller's."""
    prec = get_precision(precision) if isinstance(precision, str) else precision
    fmt = "nvfp4" if prec.name == "fp4" else prec.name
    key = {"vendor": gpu.vendor, "gpu": gpu.name, "compute": prec.compute, "precision": fmt}
    key.update(engine=engine, model=model)
    values = {**resolve_efficiency(key, profiles), **gpu.efficiency, **overrides}
    return Efficiency(**values)


@lru_cache(maxsize=1)
def serving_defaults() -> ServingDefaults:
    """vLLM serving defaults (gpu_memory_utilization, block size, batch limits); frozen, so one
    instance is shared (the calibration fit asks for it ~100,000 times)."""
    return ServingDefaults(**_section_values("serving"))


__all__ = [
    "Efficiency",
    "GPUProfile",
    "ModelProfile",
    "Precision",
    "ProfileError",
    "ServingDefaults",
    "efficiency_for",
    "efficiency_profiles",
    "resolve_efficiency",
    "efficiency_sources",
    "get_gpu",
    "get_model",
    "get_precision",
    "load_gpus",
    "load_models",
    "serving_defaults",
]
