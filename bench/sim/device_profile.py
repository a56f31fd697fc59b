"""A device profile of this host's CPU, measured, so a CPU engine (llama.cpp's llama-server)
can be simulated and calibrated like a GPU.

The simulator reads a device as the hardware catalogue describes one (bench.hardware
GPUProfile: memory, bandwidth, dense peak FLOP/s). For a CPU those figures are measured here,
not looked up: memory bandwidth by a numpy copy of arrays far larger than the caches (bytes
read + written per second), and the FP32 matrix-product rate by numpy's matmul (BLAS), both
with the thread count the engine will use (llama-server --threads), in a child process whose
BLAS was started with that many threads. The FP32 figure goes in the catalogue's `bf16` slot:
the unit the fp32 precision's GEMMs run on (models.yaml). The file written is the hardware
catalogue's own layout, so `--device FILE` reads it with the catalogue's reader and errors.
"""

from __future__ import annotations

import json
import os
import platform
import socket
import subprocess
import sys
from pathlib import Path

import yaml

from bench.hardware import GPUProfile, ProfileError, load_gpus

COPY_BYTES = 256 << 20  # each array of the copy: far above any CPU cache
MATMUL_N = 1024
REPEATS = 5  # the best of REPEATS: the machine's rate, not a neighbour's interruption

_PROBE = """
import json, time, numpy as np
n_bytes, n, reps, cache_bytes = {n_bytes}, {n}, {reps}, {cache_bytes}
def copy_rate(n_bytes, reps):
    a = np.ones(n_bytes // 8); b = np.empty_like(a)
    bw = 0.0
    for _ in range(reps):
        t = time.perf_counter(); np.copyto(b, a); dt = time.perf_counter() - t
        bw = max(bw, 2 * a.nbytes / dt)
    return bw
bw = copy_rate(n_bytes, reps)
cache_bw = copy_rate(cache_bytes // 4, 20 * reps) if cache_bytes else 0.0
x = np.random.default_rng(0).random((n, n), dtype=np.float32); y = x.copy()
x @ y
fl = 0.0
for _ in range(reps):
    t = time.perf_counter(); x @ y; dt = time.perf_counter() - t
    fl = max(fl, 2 * n**3 / dt)
print(json.dumps({{"bandwidth_bytes_s": bw, "fp32_flops": fl, "cache_bytes": cache_bytes,
                  "cache_bandwidth_bytes_s": cache_bw}}))
"""


def last_level_cache_bytes() -> int:
    """Size of the CPU's last-level cache (Linux sysfs, cpu0's highest level), 0 if unknown."""
    best_level, size = 0, 0
    for index in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
        try:
            level = int((index / "level").read_text())
            kind = (index / "type").read_text().strip()
            text = (index / "size").read_text().strip().upper()
        except (OSError, ValueError):
            continue
        units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
        value = int(text[:-1]) * units[text[-1]] if text[-1] in units else int(text)
        if kind != "Instruction" and level > best_level:
            best_level, size = level, value
    return size


def measure_host(threads: int = 1) -> dict[str, float]:
    """Memory bandwidth (bytes/s) and FP32 matmul rate (FLOP/s) with `threads` threads."""
    env = {**os.environ}
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        env[var] = str(threads)
    code = _PROBE.format(
        n_bytes=COPY_BYTES, n=MATMUL_N, reps=REPEATS, cache_bytes=last_level_cache_bytes()
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300
    )
    if proc.returncode != 0:
        raise RuntimeError(f"measuring the host failed: {proc.stderr.strip()[-500:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _memory_bytes() -> float:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 8e9


def host_device(
    name: str = "host-cpu",
    threads: int = 1,
    bandwidth_gbs: float | None = None,
    gflops: float | None = None,
) -> dict:
    """The catalogue entry of this host's CPU: measured, or the figures given (GB/s, GFLOP/s)."""
    measured = {} if bandwidth_gbs and gflops else measure_host(threads)
    bw = bandwidth_gbs * 1e9 if bandwidth_gbs else measured["bandwidth_bytes_s"]
    fl = gflops * 1e9 if gflops else measured["fp32_flops"]
    how = []
    how.append(
        f"bandwidth {bw / 1e9:.1f} GB/s "
        + ("given" if bandwidth_gbs else f"measured (numpy copy of {COPY_BYTES >> 20} MiB)")
    )
    how.append(
        f"FP32 {fl / 1e9:.1f} GFLOP/s "
        + ("given" if gflops else f"measured (numpy float32 matmul {MATMUL_N}^2)")
    )
    cpu = platform.processor() or platform.machine()
    cache = _cache_entry(measured)
    if cache:
        how.append(
            f"last-level cache {cache['cache_mb']:g} MiB at {cache['cache_bw_tbs'] * 1e3:.1f} GB/s "
            "measured (numpy copy within it; weights that fit stream at this rate)"
        )
    return {
        "vendor": "cpu",
        "hbm_gb": round(_memory_bytes() / 1e9, 1),
        "memory_source": "physical memory (sysconf)",
        "hbm_bw_tbs": float(f"{bw / 1e12:.4g}"),
        "tflops": {"bf16": float(f"{fl / 1e12:.4g}"), "fp8": None, "fp4": None},
        "tdp_w": 0.0,
        "world_size": 1,
        "notes": f"{cpu} with {threads} thread(s); the bf16 slot holds the FP32 rate",
        "source": f"tokenbench sim device on {socket.gethostname()}: " + "; ".join(how),
        **cache,
    }


def _cache_entry(measured: dict[str, float]) -> dict[str, float]:
    """The device's cache fields from a measurement ({} when figures were given, the cache's
    size is unknown, or it measured no faster than memory)."""
    cache_bw = measured.get("cache_bandwidth_bytes_s", 0.0)
    llc = measured.get("cache_bytes", 0)
    if not llc or cache_bw <= measured.get("bandwidth_bytes_s", 0.0):
        return {}
    return {"cache_mb": round(llc / (1 << 20), 1), "cache_bw_tbs": float(f"{cache_bw / 1e12:.4g}")}


def write_device(path: Path, name: str, entry: dict) -> Path:
    """Write one device in the hardware catalogue's layout, and check it reads back."""
    path = Path(path)
    path.write_text(
        "# A device profile (hardware catalogue layout, bench/hardware/gpus.yaml), written by\n"
        "# `tokenbench sim device`. Use: tokenbench sim calibrate ... --device THIS_FILE\n"
        + yaml.safe_dump({"gpus": {name: entry}}, sort_keys=False, width=100)
    )
    load_device(path)
    return path


def load_device(path: str | Path, name: str | None = None) -> GPUProfile:
    """The device a catalogue-layout file describes: `name`, or its only entry."""
    path = Path(path)
    if not path.is_file():
        raise ProfileError(f"{path}: no such device file (write one with `tokenbench sim device`)")
    from bench.hardware import read_yaml

    own = list((read_yaml(path).get("gpus") or {}).keys())
    if not own:
        raise ProfileError(f"{path}: field gpus: no device in the file")
    if name is None and len(own) > 1:
        raise ProfileError(f"{path}: {len(own)} devices ({', '.join(own)}); pick one with --gpu")
    devices = load_gpus(path)
    key = name or own[0]
    if key not in devices:
        raise ProfileError(f"{path}: no device {key!r}; it holds {', '.join(own)}")
    return devices[key]
