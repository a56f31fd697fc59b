"""SGLang's `python -m sglang.launch_server` (server arguments; /health)."""

from bench.launchers import LAUNCHERS, Launcher, Setting

LAUNCHERS.register(
    "sglang",
    "SGLang launch_server: TP/DP, max running requests, chunked prefill, KV dtype, memory",
    Launcher(
        command=(
            "python3",
            "-m",
            "sglang.launch_server",
            "--host",
            "127.0.0.1",
            "--port",
            "{port}",
        ),  # fmt: skip
        settings={
            "model": Setting("--model-path", "model name or path"),
            "tp_size": Setting("--tp-size", "TP degree"),
            "dp_size": Setting("--dp-size", "DP replicas"),
            "max_running_requests": Setting("--max-running-requests", "requests in a batch"),
            "chunked_prefill_size": Setting("--chunked-prefill-size", "prefill chunk tokens"),
            "max_prefill_tokens": Setting("--max-prefill-tokens", "prefill tokens per batch"),
            "context_length": Setting("--context-length", "context length"),
            "kv_cache_dtype": Setting("--kv-cache-dtype", "auto, fp8_e5m2, fp8_e4m3"),
            "mem_fraction_static": Setting("--mem-fraction-static", "weights + KV memory share"),
            "schedule_policy": Setting("--schedule-policy", "lpm, fcfs, ..."),
            "disable_radix_cache": Setting("--disable-radix-cache", "no prefix cache", switch=True),
        },
        version=("{argv0}", "-c", "import sglang; print('sglang', sglang.__version__)"),
    ),
)
