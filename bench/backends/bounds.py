"""How much a response may hold, and how many tokens it may claim: nothing from a server is
believed blindly (DESIGN.md). One place for every bound, read by both transports (while
the bytes stream) and by capture (once the stream has ended).

While streaming, a transport compares the body's length with `Capture.check_at` after
each read (one integer comparison: the hot path only sends, reads and timestamps) and
calls `check_stream` only when the body has grown past it. `check_stream` then looks at
the whole body with C-level passes (`rfind`, `count`) and sets the next check point
further on, geometrically, so the checks of one stream cost a few passes over its bytes
in all. Beyond a bound the request fails as `oversized` (or `protocol_violation` for too
many content events) and the connection is dropped, so memory stays bounded whatever the server
sends: comments and keep-alives, one endless line, one endless event, or endless tokens
(stopped by the size bound, then named `protocol_violation` when decoded: more content
events than max_tokens allows).
"""

from __future__ import annotations

import re

from bench.records import ERR_OVERSIZED

# The most body bytes one response may hold: a base for the head events, the usage and
# error texts, plus this much per max_tokens (a streamed token is ~150-400 bytes of JSON
# on vLLM, SGLang, TensorRT-LLM and OpenAI; 4 KiB leaves room for logprobs).
RESPONSE_BASE_BYTES = 2 << 20
RESPONSE_BYTES_PER_TOKEN = 4 << 10
# The bound when the request's max_tokens is not known (a capture made outside the runner).
RESPONSE_MAX_UNKNOWN = 64 << 20
# No line, no event and no run of comments or keep-alives may be longer than this: every
# window of this many bytes must hold the start of a `data:` event.
EVENT_MAX_BYTES = 2 << 20
# A stream may carry this many content events beyond max_tokens before it is a protocol
# violation: TOKEN_SLACK_FIXED + TOKEN_SLACK_SHARE of max_tokens (no server we know sends
# more content events than tokens; each content event holds at least one token).
TOKEN_SLACK_FIXED = 2
TOKEN_SLACK_SHARE = 0.01
# The first check comes after this many bytes; each next one after a quarter more.
FIRST_CHECK_BYTES = 64 << 10

_EVENT_STARTS = (b"\ndata:", b"\rdata:")  # after LF or CRLF, and after CR alone
# A stream's last event is [DONE] (any of SSE's line-break styles, optional space).
_DONE_TAIL = re.compile(rb"(?:^|[\r\n])data: ?\[DONE\][ \t]*(?:\r\n\r\n|\n\n|\r\r|\r\n\n|\n\r\n)$")


# Events on the wire that carry no token: a role delta, a final finish_reason event, the
# usage event and [DONE] (allowed for when events are counted without decoding them).
NON_TOKEN_EVENTS = 8


def data_events(body: bytearray) -> int:
    """How many `data:` events a body holds, counted without decoding (C-level passes)."""
    after_lf = body.count(_EVENT_STARTS[0])
    return body.startswith(b"data:") + (after_lf or body.count(_EVENT_STARTS[1]))


def token_slack(max_tokens: int) -> int:
    """How many content events (or claimed tokens) past max_tokens are still believed."""
    return TOKEN_SLACK_FIXED + int(max_tokens * TOKEN_SLACK_SHARE)


def response_limit(max_tokens: int) -> int:
    """The most body bytes a response to a request for max_tokens tokens may hold."""
    if max_tokens <= 0:
        return RESPONSE_MAX_UNKNOWN
    return RESPONSE_BASE_BYTES + RESPONSE_BYTES_PER_TOKEN * max_tokens


def first_check_at(max_tokens: int) -> int:
    """Body length after which the first check runs."""
    return min(FIRST_CHECK_BYTES, response_limit(max_tokens))


def check_stream(body: bytearray, max_tokens: int) -> tuple[int, str | None, str | None]:
    """Check a streaming body that has grown past its check point.

    Returns (next check point, error kind, message); the kind is None while within bounds.
    Cheap on an honest stream: the last event start is found by a backward search that
    stops a few hundred bytes from the end. An endless stream of tokens is stopped by the
    size bound and named `protocol_violation` once decoded (capture: stream_overrun).
    """
    n = len(body)
    limit = response_limit(max_tokens)
    if n > limit:
        message = (
            f"response body over {limit} bytes (the bound for max_tokens {max_tokens}): "
            "dropped; see README, 'Hostile endpoints'"
        )
        return n, ERR_OVERSIZED, message
    window_start = max(0, n - EVENT_MAX_BYTES)
    # the last event start (the body's start counts as one) within the last window; after
    # LF (or CRLF) first, after a lone CR only where there is none
    last = body.rfind(_EVENT_STARTS[0], window_start)
    if last < 0:
        last = body.rfind(_EVENT_STARTS[1], window_start)
    if last < 0 and window_start > 0:
        message = (
            f"{EVENT_MAX_BYTES} bytes without a data event (one line, one event or a run of "
            "comments and keep-alives longer than that): dropped"
        )
        return n, ERR_OVERSIZED, message
    # Next: when the body could first break a bound, or after a quarter more bytes.
    next_at = min(limit, max(last, 0) + EVENT_MAX_BYTES, n + max(FIRST_CHECK_BYTES, n // 4))
    return max(next_at, n + 1), None, None


def ends_with_done(body: bytearray) -> bool:
    """Whether the body's last event is `data: [DONE]`: the stream is complete, whether or
    not the server ends the HTTP response or closes the connection."""
    return _DONE_TAIL.search(body, max(0, len(body) - 40)) is not None


def stream_overrun(content_events: int, max_tokens: int | None) -> str | None:
    """Why a finished stream broke the protocol by streaming past max_tokens (plus slack),
    or None. Each content event holds at least one token."""
    if max_tokens is None or max_tokens <= 0:
        return None
    allowed = max_tokens + token_slack(max_tokens)
    if content_events > allowed:
        return (
            f"{content_events} content events for max_tokens {max_tokens} (at most "
            f"{allowed} with slack): the stream ran past max_tokens"
        )
    return None


def usage_disbelieved(
    claimed: int, content_events: int, max_tokens: int | None, counted: int | None = None
) -> str | None:
    """Why a server's usage.completion_tokens cannot be true, or None when it is plausible.

    Each content event carries at least one token, so fewer tokens than content events is
    impossible; more than max_tokens (plus slack) is impossible; and where a tokenizer
    counted the streamed text, a claim off by more than USAGE_TOKENIZER_TOLERANCE is not
    believed either (the tokenizer file may differ from the server's a little, not more).
    """
    if claimed < content_events:
        return f"usage says {claimed} output tokens but {content_events} content events came"
    if max_tokens is not None and max_tokens > 0:
        allowed = max_tokens + token_slack(max_tokens)
        if claimed > allowed:
            return f"usage says {claimed} output tokens for max_tokens {max_tokens}"
    if counted is not None and abs(claimed - counted) > usage_tolerance(counted):
        return f"usage says {claimed} output tokens; the tokenizer counts {counted}"
    return None


# A tokenizer count and a server's usage may differ by this share plus a few tokens (a
# local tokenizer file that is not exactly the server's, special tokens).
USAGE_TOKENIZER_TOLERANCE = 0.10
USAGE_TOKENIZER_SLACK = 4


def usage_tolerance(counted: int) -> int:
    return USAGE_TOKENIZER_SLACK + int(counted * USAGE_TOKENIZER_TOLERANCE)


# ---------------------------------------------------------------- small GETs to a target

# The most a small answer (a model list, a /metrics page) may hold once decoded: a gzip bomb
# or an endless body is cut here, not read whole into memory.
SMALL_RESPONSE_MAX = 8 << 20


class ResponseTooLarge(ValueError):
    """A small answer from a target grew past its bound."""


def bounded_get(
    url: str,
    *,
    timeout_s: float,
    headers: dict | None = None,
    max_bytes: int = SMALL_RESPONSE_MAX,
    client=None,  # noqa: ANN001 - an httpx.Client to reuse; a new one when None
) -> tuple[int, bytes]:
    """GET url with one deadline for the whole exchange and a cap on the decoded body; the
    status and the body. httpx's own timeout is per read, so a server trickling a byte at a
    time (or streaming forever) would hold a plain `httpx.get` for ever, and a gzip bomb
    would be inflated whole. Raises httpx.HTTPError, TimeoutError or ResponseTooLarge."""
    return bounded_request(
        "GET", url, timeout_s=timeout_s, headers=headers, max_bytes=max_bytes, client=client
    )


def bounded_request(
    method: str,
    url: str,
    *,
    timeout_s: float,
    headers: dict | None = None,
    json_body: dict | None = None,
    max_bytes: int = SMALL_RESPONSE_MAX,
    client=None,  # noqa: ANN001 - an httpx.Client to reuse; a new one when None
) -> tuple[int, bytes]:
    """bounded_get for any method, with an optional JSON body (the same one deadline and
    body cap)."""
    import time

    import httpx

    deadline = time.monotonic() + timeout_s
    own = client is None
    if own:
        client = httpx.Client(timeout=timeout_s)
    try:
        with client.stream(method, url, headers=headers, json=json_body) as response:
            body = bytearray()
            for chunk in response.iter_bytes():
                body += chunk
                if len(body) > max_bytes:
                    raise ResponseTooLarge(f"{method} {url}: body over {max_bytes} bytes")
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{method} {url}: no complete answer within {timeout_s:g} s")
            return response.status_code, bytes(body)
    finally:
        if own:
            client.close()
