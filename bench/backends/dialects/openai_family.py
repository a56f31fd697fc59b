"""The OpenAI-format servers: one stream format, different fields to force the length."""

from __future__ import annotations

from bench.backends.dialects import DIALECTS
from bench.backends.openai import OpenAIDialect

DIALECTS.register(
    "vllm",
    "vLLM: OpenAI SSE; ignore_eos and min_tokens force the output length",
    OpenAIDialect("vllm", ignore_eos=True, min_tokens=True, include_usage=True),
)
DIALECTS.register(
    "sglang",
    "SGLang: OpenAI SSE; ignore_eos and min_tokens as sampling extras",
    OpenAIDialect("sglang", ignore_eos=True, min_tokens=True, include_usage=True),
)
DIALECTS.register(
    "trtllm",
    "TensorRT-LLM's trtllm-serve: OpenAI SSE; ignore_eos and min_tokens",
    OpenAIDialect("trtllm", ignore_eos=True, min_tokens=True, include_usage=True),
)
DIALECTS.register(
    "openai",
    "OpenAI proper: no way to force the length; max_completion_tokens on chat",
    OpenAIDialect(
        "openai",
        ignore_eos=False,
        min_tokens=False,
        include_usage=True,
        chat_max_field="max_completion_tokens",
    ),
)
