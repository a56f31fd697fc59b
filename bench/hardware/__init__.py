"""The hardware catalogue: accelerators, the systems they come in and their interconnects.

One YAML file (gpus.yaml beside this) holds every hardware figure the project uses, each with
its source: memory as the device reports it (nvidia-smi / rocm-smi, in MiB), bandwidth, dense
peak FLOP/s per precision, board power, and the scale-up link. The simulator (bench.sim),
pricing (bench.cost) and planning (bench.plan) read it from here; nothing here imports them,
so the catalogue sits below all three. Users extend it with their own file of the same layout.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict

HERE = Path(__file__).parent
GPUS_YAML = HERE / "gpus.yaml"

COMPUTE_PRECISIONS = ("bf16", "fp8", "fp4")
MIB = 1 << 20


class ProfileError(ValueError):
    """A profile name is unknown or a profile file is malformed."""


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Interconnect(_Frozen):
    """A link: bandwidth per GPU, one direction (GB/s), and a transfer's set-up latency."""

    name: str
    gbps: float
    latency_us: float = 0.0
    source: str

    @property
    def bytes_s(self) -> float:
        return self.gbps * 1e9


class GPUProfile(_Frozen):
    """One accelerator: reported memory, bandwidth, dense peak per precision, power, link.

    hbm_gb is the marketed capacity (a label); memory_mib is what the device reports and what
    an engine can allocate from. A user file may give only hbm_gb (then capacity is
    hbm_gb x 1e9 bytes); give memory_mib from nvidia-smi or rocm-smi for accuracy.
    """

    name: str
    vendor: str
    hbm_gb: float
    memory_mib: float | None = None
    memory_source: str = ""
    hbm_bw_tbs: float
    tflops: dict[str, float | None]
    tdp_w: float
    scale_up: str = ""
    scale_up_gbps: float = 0.0
    scale_out: str = ""  # the network NIC per GPU (interconnects), for transfers between nodes
    world_size: int = 8
    rack_gpus: int = 0
    aliases: tuple[str, ...] = ()
    notes: str = ""
    source: str
    # efficiency overrides; a calibrated device's step_shape is a tuple (bench.sim.profiles)
    efficiency: dict[str, float | tuple[tuple[int, bool, float], ...]] = {}
    # A CPU device (`tokenbench sim device`): its last-level cache and the bandwidth measured
    # within it. Weights that fit stay there between steps and stream at that rate, not at
    # DRAM's. 0 = not modelled (GPU entries: their L2 is far smaller than any model).
    cache_mb: float = 0.0
    cache_bw_tbs: float = 0.0

    @property
    def hbm_bytes(self) -> float:
        """Bytes the device reports (the engines' "total memory")."""
        return self.memory_mib * MIB if self.memory_mib else self.hbm_gb * 1e9

    @property
    def hbm_bw_bytes_s(self) -> float:
        return self.hbm_bw_tbs * 1e12

    def stream_bw_bytes_s(self, resident_bytes: float) -> float:
        """Peak rate at which `resident_bytes` read every step stream in: the measured cache
        bandwidth when they fit in three quarters of the last-level cache (the rest holds a
        step's activations, KV and the engine's own data), else the memory bandwidth."""
        if self.cache_bw_tbs and resident_bytes <= self.cache_mb * MIB * 0.75:
            return self.cache_bw_tbs * 1e12
        return self.hbm_bw_bytes_s

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


def read_yaml(path: Path) -> dict[str, Any]:
    """A profile file as a mapping; ProfileError naming the file when it is not one."""
    try:
        data = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ProfileError(f"cannot read profile file {path}: {exc}") from exc
    if not isinstance(data, dict):
        raise ProfileError(f"profile file {path} must be a mapping at the top level")
    return data


def parse_entry(cls: type[BaseModel], name: str, body: Any, path: Path) -> Any:
    """One named entry of a profile file, with errors that point at the file and entry."""
    if not isinstance(body, dict):
        raise ProfileError(f"{path}: entry {name!r} must be a mapping")
    try:
        return cls(name=name, **body)
    except Exception as exc:  # pydantic.ValidationError: point at the file and entry
        raise ProfileError(f"{path}: entry {name!r} is invalid: {exc}") from exc


@lru_cache(maxsize=1)
def interconnects() -> dict[str, Interconnect]:
    """Scale-up links by name (NVLink4, NVLink5, ...), each typed once."""
    raw = read_yaml(GPUS_YAML).get("interconnects") or {}
    return {n: parse_entry(Interconnect, n, b, GPUS_YAML) for n, b in raw.items()}


def _gpu(name: str, body: Any, path: Path) -> GPUProfile:
    if isinstance(body, dict) and body.get("scale_up") and not body.get("scale_up_gbps"):
        link = interconnects().get(body["scale_up"])
        if link is None:
            raise ProfileError(
                f"{path}: GPU {name!r} names scale_up {body['scale_up']!r}; known links: "
                f"{', '.join(interconnects())} (or give scale_up_gbps)"
            )
        body = {**body, "scale_up_gbps": link.gbps}
    return parse_entry(GPUProfile, name, body, path)


@lru_cache(maxsize=8)
def _load_gpus_cached(extra: Path | None) -> dict[str, GPUProfile]:
    gpus: dict[str, GPUProfile] = {}
    for path in [GPUS_YAML] + ([extra] if extra else []):
        for name, body in (read_yaml(path).get("gpus") or {}).items():
            gpus[name] = _gpu(name, body, path)
    return gpus


def load_gpus(extra_path: Path | None = None) -> dict[str, GPUProfile]:
    """All GPU profiles by canonical name; entries in extra_path add to or replace shipped ones."""
    return dict(_load_gpus_cached(Path(extra_path) if extra_path else None))


def lookup(kind: str, name: str, table: dict[str, Any]) -> Any:
    """An entry by canonical name or alias, case-insensitive; the error lists the known ones."""
    key = name.strip().lower()
    for canonical, prof in table.items():
        if key == canonical.lower() or key in (a.lower() for a in prof.aliases):
            return prof
    known = ", ".join(f"{c} ({'/'.join(p.aliases)})" if p.aliases else c for c, p in table.items())
    raise ProfileError(f"unknown {kind} {name!r}; known {kind}s: {known}")


def get_gpu(name: str, extra_path: Path | None = None) -> GPUProfile:
    """A GPU by canonical name or alias, case-insensitive ("b200" -> B200-SXM, "h100" -> H100-SXM)."""
    return lookup("GPU", name, load_gpus(extra_path))


__all__ = [
    "COMPUTE_PRECISIONS",
    "GPUProfile",
    "Interconnect",
    "ProfileError",
    "get_gpu",
    "interconnects",
    "load_gpus",
    "lookup",
    "parse_entry",
    "read_yaml",
]
