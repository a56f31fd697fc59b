"""TensorRT-LLM's `trtllm-serve MODEL` (its flags use underscores; KV dtype and other LLM API
options go in a YAML file: the `--extra_llm_api_options` setting; /health)."""

from bench.launchers import LAUNCHERS, Launcher, Setting

LAUNCHERS.register(
    "trtllm-serve",
    "TensorRT-LLM trtllm-serve: TP/PP/EP, max batch size, max tokens, KV memory fraction",
    Launcher(
        command=("trtllm-serve", "--host", "127.0.0.1", "--port", "{port}"),
        settings={
            "model": Setting("", "model name or path (trtllm-serve's positional MODEL)"),
            "backend": Setting("--backend", "pytorch, tensorrt or _autodeploy"),
            "tp_size": Setting("--tp_size", "TP degree"),
            "pp_size": Setting("--pp_size", "PP degree"),
            "ep_size": Setting("--ep_size", "EP degree (MoE)"),
            "max_batch_size": Setting("--max_batch_size", "requests the engine schedules"),
            "max_num_tokens": Setting("--max_num_tokens", "batched input tokens per step"),
            "max_seq_len": Setting("--max_seq_len", "prompt + output length"),
            "kv_cache_free_gpu_memory_fraction": Setting(
                "--kv_cache_free_gpu_memory_fraction", "free memory share for the KV cache"
            ),
            "extra_llm_api_options": Setting(
                "--extra_llm_api_options", "YAML of LLM API options (kv_cache_config.dtype)"
            ),
        },
        version=("python3", "-c", "import tensorrt_llm as t; print('tensorrt_llm', t.__version__)"),
    ),
)
