"""The shipped vocabularies. Names checked against the engines themselves: vLLM 0.32
(reference/real-servers.md), llama.cpp's llama-server as built from llama-cpp-python
0.3.36's sdist (tests/real_servers), SGLang and TensorRT-LLM from their docs. One engine
often exposes two names for one thing (vLLM's gpu_cache_usage_perc, renamed
kv_cache_usage_perc, the only one left in vLLM 0.32); the first present is used and the
other is kept raw."""

from __future__ import annotations

from bench.telemetry.engines import ENGINES, EngineNames

ENGINES.register(
    "vllm",
    "vLLM's vllm:* metrics: queue, KV cache, prefix cache, tokens, preemptions, spec decode",
    EngineNames(
        "vLLM",
        ("vllm:",),
        {
            "requests_running": (("vllm:num_requests_running", {}),),
            "requests_waiting": (("vllm:num_requests_waiting", {}),),
            "kv_cache_usage": (  # fraction of the KV cache in use, 0..1
                ("vllm:kv_cache_usage_perc", {}),
                ("vllm:gpu_cache_usage_perc", {}),
            ),
            # Every prompt token of every request, cached or not.
            "prompt_tokens_total": (("vllm:prompt_tokens_total", {}),),
            # vLLM's prefix cache, in tokens: looked up, and found.
            "prefix_cache_queries_total": (
                ("vllm:prefix_cache_queries_total", {}),
                ("vllm:gpu_prefix_cache_queries_total", {}),  # its name before vLLM 0.9
            ),
            "prefix_cache_hits_total": (
                ("vllm:prefix_cache_hits_total", {}),
                ("vllm:gpu_prefix_cache_hits_total", {}),
            ),
            # A recent hit rate, 0..1 (vLLM's before the V1 engine).
            "prefix_cache_hit_rate": (("vllm:gpu_prefix_cache_hit_rate", {}),),
            "generation_tokens_total": (("vllm:generation_tokens_total", {}),),
            "preemptions_total": (("vllm:num_preemptions_total", {}),),
            # Speculative decoding (vLLM V1's SpecDecodingProm): verify steps that carried
            # drafts, draft tokens proposed, draft tokens accepted, and accepted per draft
            # position (label position="0".."k-1").
            "spec_decode_drafts_total": (("vllm:spec_decode_num_drafts_total", {}),),
            "spec_decode_draft_tokens_total": (("vllm:spec_decode_num_draft_tokens_total", {}),),
            "spec_decode_accepted_tokens_total": (
                ("vllm:spec_decode_num_accepted_tokens_total", {}),
            ),
            "spec_decode_accepted_per_position_total": (
                ("vllm:spec_decode_num_accepted_tokens_per_pos_total", {}),
            ),
        },
    ),
)
ENGINES.register(
    "sglang",
    "SGLang's sglang:* metrics: queue, token usage, cache hit rate, tokens, accept length",
    EngineNames(
        "SGLang",
        ("sglang:",),
        {
            "requests_running": (("sglang:num_running_reqs", {}),),
            "requests_waiting": (("sglang:num_queue_reqs", {}),),
            "kv_cache_usage": (("sglang:token_usage", {}),),
            "prompt_tokens_total": (("sglang:prompt_tokens_total", {}),),
            "prefix_cache_hit_rate": (("sglang:cache_hit_rate", {}),),
            "generation_tokens_total": (("sglang:generation_tokens_total", {}),),
            # A recent mean acceptance length of speculative decoding (a gauge; no counters).
            # The name is one of the essential metrics SGLang's own test_metrics.py checks.
            "spec_decode_accept_length": (("sglang:spec_accept_length", {}),),
        },
    ),
)
ENGINES.register(
    "trtllm",
    "TensorRT-LLM: trtllm-serve's /prometheus/metrics, Dynamo's and Triton's backend",
    EngineNames(
        "TensorRT-LLM",
        ("trtllm", "nv_trt_llm"),
        {
            "requests_running": (  # Triton TRT-LLM backend
                ("nv_trt_llm_request_metrics", {"request_type": "active"}),
            ),
            "requests_waiting": (("nv_trt_llm_request_metrics", {"request_type": "waiting"}),),
            "kv_cache_usage": (
                ("trtllm_kv_cache_utilization", {}),  # trtllm-serve /prometheus/metrics
                ("trtllm:kv_cache_utilization", {}),  # the same through Dynamo
                ("nv_trt_llm_kv_cache_block_metrics", {"kv_cache_block_type": "fraction"}),
            ),
        },
    ),
)
ENGINES.register(
    "llamacpp",
    "llama.cpp's llama-server llamacpp:* metrics: slots, prompt cache, tokens",
    EngineNames(
        "llama.cpp",
        ("llamacpp:",),
        {
            "requests_running": (("llamacpp:requests_processing", {}),),  # slots busy
            "requests_waiting": (("llamacpp:requests_deferred", {}),),  # waiting for a slot
            "kv_cache_usage": (("llamacpp:kv_cache_usage_ratio", {}),),  # older builds only
            # Prompt tokens the engine computed, the cached ones left out.
            "prompt_tokens_computed_total": (("llamacpp:prompt_tokens_total", {}),),
            # Prompt tokens answered from the prefix cache.
            "prompt_tokens_cached_total": (("llamacpp:prompt_tokens_cached_total", {}),),
            "generation_tokens_total": (("llamacpp:tokens_predicted_total", {}),),
        },
    ),
)
ENGINES.register(
    "dcgm",
    "NVIDIA's DCGM exporter: board power, SM clock, memory used, throttle reasons",
    EngineNames(
        "DCGM",
        (),
        {
            "gpu_power_w": (("DCGM_FI_DEV_POWER_USAGE", {}),),
            "gpu_sm_clock_mhz": (("DCGM_FI_DEV_SM_CLOCK", {}),),
            "gpu_memory_used_mib": (("DCGM_FI_DEV_FB_USED", {}),),
            "gpu_throttle_reasons": (  # bit mask, NVML's nvmlClocksEventReasons
                ("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", {}),
                ("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", {}),  # its name since DCGM 3.3
            ),
        },
    ),
)
