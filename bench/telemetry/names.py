"""One vocabulary for every engine: vLLM, SGLang, TensorRT-LLM, llama.cpp and DCGM names
mapped to tokenbench's own (requests_waiting, kv_cache_usage, gpu_power_w, ...).

Figures, the terminal digest and energy per token read the canonical names only, so a new
engine (or a renamed metric) is one entry in KNOWN_METRICS, not a change to every reader.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from bench.telemetry.prometheus import Sample, labels_text

# canonical name -> candidates (exposed name, required labels), first present one wins. One
# engine often exposes two names for one thing (vLLM's gpu_cache_usage_perc, renamed
# kv_cache_usage_perc, the only one left in vLLM 0.32); the first present is used and the
# other is kept raw. Names checked against the engines themselves: vLLM 0.32 (reference/
# real-servers.md), llama.cpp's llama-server as built from llama-cpp-python 0.3.36's sdist
# (tests/real_servers), SGLang and TensorRT-LLM from their docs.
KNOWN_METRICS: dict[str, tuple[tuple[str, dict[str, str]], ...]] = {
    "requests_running": (
        ("vllm:num_requests_running", {}),
        ("sglang:num_running_reqs", {}),
        ("nv_trt_llm_request_metrics", {"request_type": "active"}),  # Triton TRT-LLM backend
        ("llamacpp:requests_processing", {}),  # slots busy
    ),
    "requests_waiting": (
        ("vllm:num_requests_waiting", {}),
        ("sglang:num_queue_reqs", {}),
        ("nv_trt_llm_request_metrics", {"request_type": "waiting"}),
        ("llamacpp:requests_deferred", {}),  # waiting for a free slot
    ),
    "kv_cache_usage": (  # fraction of the KV cache in use, 0..1
        ("vllm:kv_cache_usage_perc", {}),
        ("vllm:gpu_cache_usage_perc", {}),
        ("sglang:token_usage", {}),
        ("trtllm_kv_cache_utilization", {}),  # trtllm-serve /prometheus/metrics
        ("trtllm:kv_cache_utilization", {}),  # the same through Dynamo
        ("nv_trt_llm_kv_cache_block_metrics", {"kv_cache_block_type": "fraction"}),
        ("llamacpp:kv_cache_usage_ratio", {}),  # older llama-server builds only
    ),
    # Every prompt token of every request, cached or not.
    "prompt_tokens_total": (
        ("vllm:prompt_tokens_total", {}),
        ("sglang:prompt_tokens_total", {}),
    ),
    # Prompt tokens the engine computed, the cached ones left out (llama.cpp counts these).
    "prompt_tokens_computed_total": (("llamacpp:prompt_tokens_total", {}),),
    # Prompt tokens answered from the prefix cache.
    "prompt_tokens_cached_total": (("llamacpp:prompt_tokens_cached_total", {}),),
    # vLLM's prefix cache, in tokens: looked up, and found.
    "prefix_cache_queries_total": (
        ("vllm:prefix_cache_queries_total", {}),
        ("vllm:gpu_prefix_cache_queries_total", {}),  # its name before vLLM 0.9
    ),
    "prefix_cache_hits_total": (
        ("vllm:prefix_cache_hits_total", {}),
        ("vllm:gpu_prefix_cache_hits_total", {}),
    ),
    # A recent hit rate, 0..1 (SGLang's gauge; vLLM's before the V1 engine).
    "prefix_cache_hit_rate": (
        ("sglang:cache_hit_rate", {}),
        ("vllm:gpu_prefix_cache_hit_rate", {}),
    ),
    "generation_tokens_total": (
        ("vllm:generation_tokens_total", {}),
        ("sglang:generation_tokens_total", {}),
        ("llamacpp:tokens_predicted_total", {}),
    ),
    "preemptions_total": (("vllm:num_preemptions_total", {}),),
    "gpu_power_w": (("DCGM_FI_DEV_POWER_USAGE", {}),),
    "gpu_sm_clock_mhz": (("DCGM_FI_DEV_SM_CLOCK", {}),),
    "gpu_memory_used_mib": (("DCGM_FI_DEV_FB_USED", {}),),
    "gpu_throttle_reasons": (  # bit mask, NVML's nvmlClocksEventReasons
        ("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", {}),
        ("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", {}),  # its name since DCGM 3.3
    ),
}

# Serving engines by the prefix of their metric names: a server /metrics that has none of
# these is an engine tokenbench cannot read (said once, with this list).
ENGINE_PREFIXES: dict[str, tuple[str, ...]] = {
    "vLLM": ("vllm:",),
    "SGLang": ("sglang:",),
    "TensorRT-LLM": ("trtllm", "nv_trt_llm"),
    "llama.cpp": ("llamacpp:",),
}


def engine_of(names: Iterable[str]) -> str | None:
    """The serving engine whose metric names these are, or None for none tokenbench knows."""
    for name in names:
        for engine, prefixes in ENGINE_PREFIXES.items():
            if name.startswith(prefixes):
                return engine
    return None


@dataclass(frozen=True, slots=True)
class Point:
    """One sample in the stored vocabulary: metric is canonical when known, else the name."""

    metric: str
    name: str
    labels: str
    value: float
    type: str


def canonicalize(samples: Sequence[Sample]) -> list[Point]:
    """Rename the samples KNOWN_METRICS knows; keep every other one raw under its name."""
    by_name: dict[str, list[int]] = {}
    for i, s in enumerate(samples):
        by_name.setdefault(s.name, []).append(i)
    metric_of: dict[int, tuple[str, tuple[str, ...]]] = {}
    for metric, candidates in KNOWN_METRICS.items():
        for name, required in candidates:
            hits = [
                i
                for i in by_name.get(name, ())
                if i not in metric_of
                and all(dict(samples[i].labels).get(k) == v for k, v in required.items())
            ]
            if hits:
                for i in hits:
                    metric_of[i] = (metric, tuple(required))
                break
    out = []
    for i, s in enumerate(samples):
        metric, drop = metric_of.get(i, (s.name, ()))
        labels = labels_text(kv for kv in s.labels if kv[0] not in drop)
        out.append(Point(metric, s.name, labels, s.value, s.type))
    return out
