"""vLLM's `vllm serve` (engine arguments; booleans take --no- forms; /health)."""

from bench.launchers import LAUNCHERS, Launcher, Setting


def _switch(flag: str, help: str) -> Setting:
    return Setting(flag, help, switch=True, off=flag.replace("--", "--no-", 1))


LAUNCHERS.register(
    "vllm",
    "vLLM vllm serve: TP/PP/DP, max-num-seqs, batched tokens, chunked prefill, KV dtype",
    Launcher(
        command=("vllm", "serve", "--host", "127.0.0.1", "--port", "{port}"),
        settings={
            "model": Setting("", "model name or path (vllm serve's positional model_tag)"),
            "served_model_name": Setting("--served-model-name", "model name the API reports"),
            "tensor_parallel_size": Setting("--tensor-parallel-size", "TP degree"),
            "pipeline_parallel_size": Setting("--pipeline-parallel-size", "PP degree"),
            "data_parallel_size": Setting("--data-parallel-size", "DP replicas"),
            "max_num_seqs": Setting("--max-num-seqs", "sequences per iteration"),
            "max_num_batched_tokens": Setting("--max-num-batched-tokens", "tokens per step"),
            "max_model_len": Setting("--max-model-len", "context length"),
            "gpu_memory_utilization": Setting("--gpu-memory-utilization", "share of GPU memory"),
            "kv_cache_dtype": Setting("--kv-cache-dtype", "auto, fp8, fp8_e4m3, ..."),
            "enable_chunked_prefill": _switch("--enable-chunked-prefill", "chunked prefill"),
            "enable_prefix_caching": _switch("--enable-prefix-caching", "prefix caching"),
            "quantization": Setting("--quantization", "weight quantization method"),
        },
        version=("{argv0}", "--version"),
    ),
)
