"""The OpenAI-format servers (bench.backends.openai): one stream format, different fields
to force the output length. Registered lazily, so listing them imports nothing heavy."""

from __future__ import annotations

from bench.backends.dialects import DIALECTS

for _name, _attr, _description in (
    ("vllm", "VLLM", "vLLM: OpenAI SSE; ignore_eos and min_tokens force the output length"),
    ("sglang", "SGLANG", "SGLang: OpenAI SSE; ignore_eos and min_tokens as sampling extras"),
    ("trtllm", "TRTLLM", "TensorRT-LLM's trtllm-serve: OpenAI SSE; ignore_eos and min_tokens"),
    ("openai", "OPENAI", "OpenAI itself: no field forces the length; max_completion_tokens"),
):
    DIALECTS.register_lazy(_name, _description, f"bench.backends.openai:{_attr}")
