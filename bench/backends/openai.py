"""The OpenAI streaming dialect: request bodies, and a captured stream's meaning.

vLLM, SGLang, TensorRT-LLM's trtllm-serve and OpenAI itself all stream
`data: {json}\\n\\n` events ending with `data: [DONE]`; they differ in which extra request
fields force the output length. The presets below say which fields each server honours.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Literal, get_args

import numpy as np

try:  # 2-3x faster than the standard library on a stream's events; optional
    from orjson import loads as _loads
except ImportError:  # pragma: no cover - depends on the environment
    from json import loads as _loads

from bench.backends.sse import SSEEvent, split_events, split_simple
from bench.records import (
    ERR_BAD_USAGE,
    ERR_MALFORMED,
    ERR_NO_DONE,
    ERR_NOT_SSE,
    ERR_STREAM_ERROR,
)

# The most tokens one response's usage may claim and still be believed: far above any
# context window, far below what breaks an int64 column or a sum over a run.
MAX_USAGE_TOKENS = 100_000_000

# The streaming endpoints tokenbench drives (scenario files, the API, the simulator).
Endpoint = Literal["/v1/completions", "/v1/chat/completions"]
ENDPOINTS: tuple[str, ...] = get_args(Endpoint)
COMPLETIONS, CHAT = ENDPOINTS
# Where a server lists its models, and where it serves Prometheus text: /metrics (vLLM,
# SGLang, llama.cpp, the simulator), then trtllm-serve's /prometheus/metrics.
MODELS_PATH = "/v1/models"
METRICS_PATHS = ("/metrics", "/prometheus/metrics")


def auth_headers(api_key: str | None) -> dict[str, str]:
    """The bearer header every OpenAI-compatible server reads; none without a key."""
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def server_url(base_url: str, path: str, api_key: str | None = None) -> tuple[str, dict]:
    """The URL of `path` ("/v1/...") on the server a base URL names, given with or without
    its /v1 (vLLM's --base-url has none, OpenAI clients' has one), and the request's auth
    header."""
    root = base_url.rstrip("/")
    root = root[: -len("/v1")] if root.endswith("/v1") else root
    return f"{root}{path}", auth_headers(api_key)


@dataclass(frozen=True)
class OpenAIDialect:
    """The OpenAI stream format, and what one server family accepts to force an exact
    output length. The presets (vllm, sglang, trtllm, openai) are registered as dialects by
    bench.backends.dialects.openai_family."""

    name: str
    ignore_eos: bool  # accepts "ignore_eos": true
    min_tokens: bool  # accepts "min_tokens": N
    include_usage: bool  # honours stream_options.include_usage
    chat_max_field: str = "max_tokens"  # chat's name for the output cap

    def build_body(self, **request) -> bytes:
        """One request body (the keywords of `build_body`)."""
        return build_body(dialect=self, **request)

    def decode(self, body: bytes | bytearray, ends: np.ndarray) -> StreamResult:
        """What a finished stream said (`decode_stream`)."""
        return decode_stream(body, ends)


# The OpenAI-format server families; bench.backends.dialects.openai_family registers them.
# vLLM: ignore_eos alone forces the length, and is all `vllm bench serve` sends for it.
VLLM = OpenAIDialect("vllm", ignore_eos=True, min_tokens=False, include_usage=True)
# SGLang's OpenAI server accepts ignore_eos and min_tokens as sampling extras.
SGLANG = OpenAIDialect("sglang", ignore_eos=True, min_tokens=True, include_usage=True)
# trtllm-serve: ignore_eos and min_tokens on its OpenAI protocol models.
TRTLLM = OpenAIDialect("trtllm", ignore_eos=True, min_tokens=True, include_usage=True)
# OpenAI proper: no way to force length; max_completion_tokens on chat.
OPENAI = OpenAIDialect(
    "openai",
    ignore_eos=False,
    min_tokens=False,
    include_usage=True,
    chat_max_field="max_completion_tokens",
)


def build_body(
    *,
    dialect: OpenAIDialect,
    endpoint: str,
    model: str,
    prompt: str | list[int] | None = None,
    messages: list[dict] | None = None,
    max_tokens: int,
    ignore_eos: bool,
    extra: dict | None = None,
) -> bytes:
    """Encode one request body; done before the run so the hot path only writes bytes.

    As `vllm bench serve` does, no sampling setting is sent unless asked for (`extra`:
    --temperature, --top-p, ..., --extra-body): the server's own defaults apply."""
    body: dict = {"model": model, "stream": True}
    if endpoint == CHAT:
        body["messages"] = (
            messages
            if messages is not None
            else [{"role": "user", "content": prompt if isinstance(prompt, str) else ""}]
        )
        body[dialect.chat_max_field] = max_tokens
    else:
        body["prompt"] = prompt if prompt is not None else ""
        body["max_tokens"] = max_tokens
    if dialect.include_usage:
        body["stream_options"] = {"include_usage": True, "continuous_usage_stats": False}
    if ignore_eos:
        if dialect.ignore_eos:
            body["ignore_eos"] = True
        if dialect.min_tokens:
            body["min_tokens"] = max_tokens
    if extra:
        body.update(extra)
    return json.dumps(body, separators=(",", ":")).encode()


@dataclass
class StreamResult:
    """What a finished stream said: which events carried content, usage, and any error."""

    content_reads: list[int] = field(default_factory=list)  # read index of each content event
    content_chars: int = 0
    content_text: list[str] = field(default_factory=list)  # to count tokens without usage
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_prompt_tokens: int | None = None  # usage.prompt_tokens_details.cached_tokens
    done: bool = False
    error_kind: str | None = None
    error_message: str | None = None
    model: str | None = None  # the model name the server answered with, if it said one


def interpret(events: list[SSEEvent]) -> StreamResult:
    """Read the events of one stream.

    All JSON events are decoded with one json.loads over an array (C speed, one call per
    stream); only if that fails are they decoded one by one to name the bad event.
    """
    result = StreamResult()
    payloads: list[bytes] = []
    reads: list[int] = []
    done = False
    for ev in events:
        data = ev.data.strip()
        if data == b"[DONE]":
            done = True
            break
        if not data:
            continue
        payloads.append(data)
        reads.append(ev.read_index)
    try:
        objects = json.loads(b"[" + b",".join(payloads) + b"]") if payloads else []
    except (ValueError, RecursionError):  # RecursionError: JSON nested 100k deep
        objects = _decode_each(payloads, result)
        if objects is None:
            result.done = done
            return result
    return interpret_objects(objects, reads, done)


def interpret_objects(objects: list, reads: list[int], done: bool) -> StreamResult:
    """The meaning of a stream's decoded JSON events; reads[i] is event i's read index.

    Shared by `interpret` and the fast path of bench.backends.capture, which decodes the
    common stream shape without building per-event objects.
    """
    try:
        return _interpret_objects(objects, reads, done)
    except (AttributeError, TypeError, RecursionError) as exc:  # e.g. a choice not an object
        result = StreamResult(done=done)
        result.error_kind = ERR_MALFORMED
        result.error_message = f"event does not have the OpenAI shape: {exc}"
        return result


def _interpret_objects(objects: list, reads: list[int], done: bool) -> StreamResult:
    result = StreamResult(done=done)
    content_reads = result.content_reads
    texts = result.content_text
    chars = 0
    for obj, read_index in zip(objects, reads, strict=True):
        if type(obj) is not dict:
            result.error_kind = ERR_MALFORMED
            result.error_message = f"event is not a JSON object: {str(obj)[:120]}"
            return result
        if "error" in obj or obj.get("object") == "error":
            err = obj.get("error", obj)
            message = err.get("message", err) if isinstance(err, dict) else err
            result.error_kind = ERR_STREAM_ERROR
            result.error_message = f"server error in stream: {str(message)[:300]}"
            return result
        usage = obj.get("usage")
        if usage.__class__ is dict:
            result.prompt_tokens = usage.get("prompt_tokens", result.prompt_tokens)
            result.completion_tokens = usage.get("completion_tokens", result.completion_tokens)
            details = usage.get("prompt_tokens_details")
            if details.__class__ is dict:
                result.cached_prompt_tokens = _token_count(details.get("cached_tokens"))
        if result.model is None:
            model = obj.get("model")
            result.model = model if model.__class__ is str else None
        for choice in obj.get("choices") or ():
            # completions' text inline (the common case), else chat's delta
            text = choice.get("text") if "text" in choice else _delta_text(choice)
            if text:
                content_reads.append(read_index)
                texts.append(text)
                chars += len(text)
                break
    result.content_chars = chars
    _check_usage(result)
    if not result.done and result.error_kind is None:
        result.error_kind = ERR_NO_DONE
        result.error_message = "stream closed without data: [DONE]"
    return result


def _check_usage(result: StreamResult) -> None:
    """Usage counts that are not token counts (a string, a negative, 1e30) fail the request
    as bad_usage and are dropped, so that nothing downstream sums or stores them."""
    bad = []
    for name in ("prompt_tokens", "completion_tokens"):
        given = value = getattr(result, name)
        if value is None:
            continue
        if value.__class__ is float and value.is_integer() and abs(value) < 2**53:
            value = int(value)
        if value.__class__ is not int or not 0 <= value <= MAX_USAGE_TOKENS:
            bad.append(f"usage.{name} = {json.dumps(given)[:40]}")
            value = None
        setattr(result, name, value)
    if bad and result.error_kind is None:
        result.error_kind = ERR_BAD_USAGE
        result.error_message = f"{', '.join(bad)} is not a token count"


def _token_count(value: object) -> int | None:
    """A token count a server reported, or None when it is not a plausible one."""
    if value.__class__ is int and 0 <= value <= MAX_USAGE_TOKENS:
        return value
    return None


def _delta_text(choice: dict) -> str:
    """Content of one chat choice: its delta's content or reasoning content."""
    delta = choice.get("delta") or {}
    return delta.get("content") or delta.get("reasoning_content") or delta.get("reasoning") or ""


def _decode_each(payloads: list[bytes], result: StreamResult) -> list | None:
    objects = []
    for i, data in enumerate(payloads):
        try:
            objects.append(json.loads(data))
        except (ValueError, RecursionError):
            result.error_kind = ERR_MALFORMED
            result.error_message = f"event {i} is not valid JSON: {data[:120]!r}"
            return None
    return objects


def decode_stream(body: bytes | bytearray, ends: np.ndarray) -> StreamResult:
    """What a captured body says; `ends[i]` is the body's length after read i.

    The fast path first (bench.backends.sse.split_simple and one JSON decode of every
    event), the general SSE parser if needed."""
    if not body:
        return interpret([])
    not_sse = _not_an_event_stream(body)
    if not_sse is not None:
        return StreamResult(error_kind=ERR_NOT_SSE, error_message=not_sse)
    fast = split_simple(body, ends)
    if fast is not None:
        array, reads, done = fast
        try:
            objects = _loads(array)
        except (ValueError, RecursionError):
            objects = None  # let the general path name the bad event
        if objects is not None and len(objects) == len(reads):
            return interpret_objects(objects, reads, done)
    return interpret(split_events(body, ends.tolist()))


def _not_an_event_stream(body: bytearray) -> str | None:
    """Why a 200 body cannot be a stream of events, or None when it may be one.

    An SSE body starts with a field (`data:`, `event:`, `id:`) or a `:` comment; a reply
    that starts like JSON, gzip or HTML is the server ignoring `stream: true` or compressing
    against `Accept-Encoding: identity`, which deserves its own name rather than no_done.
    """
    head = bytes(body[:512])
    if head[:2] == b"\x1f\x8b":
        return "the response is gzip-compressed though the request asked for identity encoding"
    start = head.lstrip()[:1]
    if start in (b"{", b"["):
        text = head.decode("utf-8", "replace").strip()
        return f"the server answered with plain JSON, not an event stream: {text[:300]}"
    if start == b"<":
        return f"the server answered with HTML, not an event stream: {head[:120]!r}"
    return None
