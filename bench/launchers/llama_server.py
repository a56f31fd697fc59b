"""llama.cpp's llama-server (tools/server/README.md's flags; /health answers 503 while the
model loads, 200 once it serves)."""

from bench.launchers import LAUNCHERS, Launcher, Setting

LAUNCHERS.register(
    "llama-server",
    "llama.cpp llama-server: slots (--parallel), context, threads, batch sizes, KV cache type",
    Launcher(
        command=("llama-server", "--host", "127.0.0.1", "--port", "{port}"),
        settings={
            "model": Setting("--model", "GGUF file"),
            "alias": Setting("--alias", "model name the API reports"),
            "parallel": Setting("--parallel", "slots: requests decoded together"),
            "ctx_size": Setting("--ctx-size", "context tokens, shared by all slots"),
            "threads": Setting("--threads", "CPU threads for generation"),
            "batch_size": Setting("--batch-size", "logical batch (prompt tokens per step)"),
            "ubatch_size": Setting("--ubatch-size", "physical batch"),
            "n_gpu_layers": Setting("--n-gpu-layers", "layers offloaded to the GPU"),
            "cache_type_k": Setting("--cache-type-k", "KV cache dtype of K (f16, q8_0, ...)"),
            "cache_type_v": Setting("--cache-type-v", "KV cache dtype of V"),
            "flash_attn": Setting("--flash-attn", "on, off or auto"),
            "cont_batching": Setting(
                "--cont-batching", "continuous batching", switch=True, off="--no-cont-batching"
            ),
            "metrics": Setting("--metrics", "serve /metrics", switch=True),
        },
        version=("{argv0}", "--version"),
        start_timeout_s=300.0,
    ),
)
