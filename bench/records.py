"""RequestRecord: the one per-request fact that everything downstream reads.

All times are integer nanoseconds since the run's start instant (time.perf_counter_ns at t0),
so they are durations, never wall-clock readings: records from different processes or
machines can be merged without clock skew corrupting TTFT. Metrics, storage, exports and the
dashboard derive everything from these fields and nothing else.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

# Final states of a request. sent = completed + failed + cancelled.
OK = "ok"
FAILED = "failed"
CANCELLED = "cancelled"

# How output/prompt token counts were obtained.
COUNT_USAGE = "usage"  # the server's usage field
COUNT_CHUNKS = "chunks"  # one token per content chunk (no usage reported)
COUNT_TOKENIZER = "tokenizer"  # counted client-side with a tokenizer (imports, simulator)

# Error kinds: one name per way a request can fail, so error counts are comparable.
ERR_HTTP_429 = "http_429"
ERR_HTTP_4XX = "http_4xx"
ERR_HTTP_5XX = "http_5xx"
ERR_HTTP_3XX = "http_3xx"  # a redirect: tokenbench never follows one (wrong URL?)
ERR_HTTP_OTHER = "http_other"  # any other status but 200 (1xx, 2xx without a body to stream)
ERR_CONNECT = "connect_error"  # refused, unreachable, DNS
ERR_RESET = "connection_reset"  # closed or reset before any response byte
ERR_RESET_MID_STREAM = "reset_mid_stream"  # closed or reset after the stream began
ERR_MALFORMED = "malformed_sse"  # an event that is not valid JSON / not an SSE event
ERR_STREAM_ERROR = "stream_error"  # the server sent an error object inside the stream
ERR_TIMEOUT = "timeout"  # past --request-timeout (runs stored before the phase was named)
# Past --request-timeout, named by the phase the request was in: one deadline per request,
# kept from the first connect attempt to the last byte, however the server stalls.
ERR_TIMEOUT_CONNECT = "timeout_connect"  # resolving the name or opening TCP
ERR_TIMEOUT_TLS = "timeout_tls"  # the TLS handshake never finished
ERR_TIMEOUT_HEADERS = "timeout_headers"  # sent, but no complete response head
ERR_TIMEOUT_BODY = "timeout_body"  # the stream began but did not end
ERR_NO_DONE = "no_done"  # the stream closed cleanly but without data: [DONE]
ERR_NOT_SSE = "not_event_stream"  # a 200 that is not SSE: plain JSON, gzip, HTML
ERR_BAD_FRAMING = "bad_framing"  # HTTP framing broken: a chunk size, Content-Length, head
ERR_BAD_USAGE = "bad_usage"  # usage token counts that are not counts (a string, <0, 1e30)
ERR_OVERSIZED = "oversized"  # the response outgrew a bound (bench.backends.bounds); dropped
ERR_PROTOCOL = "protocol_violation"  # more content than max_tokens allows (plus stated slack)
ERR_CLIENT = "client_error"  # decoding this response raised in tokenbench itself (a bug)
ERR_CANCELLED = "cancelled"  # stopped by the user (Ctrl-C) or the run's end
ERR_IMPORTED = "imported_error"  # failed in another tool's run (importers keep its message)

EMPTY_TIMES = np.zeros(0, dtype=np.int64)


@dataclass(slots=True)
class RequestRecord:
    """One request, as measured.

    `chunk_times_ns` holds the arrival time of every SSE event that carried output content,
    in order; ITL is the gaps between them. A chunk may carry more than one token (a server
    that batches its output): `output_tokens` counts tokens, the chunk times count chunks.
    """

    index: int
    load_point: int = 0
    turn: int = 0
    intended_ns: int = 0
    sent_ns: int = 0
    first_byte_ns: int | None = None
    first_token_ns: int | None = None
    end_ns: int | None = None
    chunk_times_ns: np.ndarray = field(default_factory=lambda: EMPTY_TIMES)
    prompt_tokens: int | None = None
    output_tokens: int | None = None
    token_count_source: str = COUNT_CHUNKS
    http_status: int | None = None
    state: str = OK
    error_kind: str | None = None
    error_message: str | None = None
    expected_input_len: int | None = None
    expected_output_len: int | None = None
    # times the request was sent again because a reused keep-alive connection turned out to
    # be closed before any response byte (it never reached the server); timed from the resend
    retries: int = 0
    # Prompt tokens the server answered from its prefix cache, as it reported them
    # (usage.prompt_tokens_details.cached_tokens); None when it did not say.
    cached_prompt_tokens: int | None = None
    # Time spent waiting for a --max-concurrency slot between the intended send time and
    # the send: the cap working, not the client lagging (so not part of the send lag).
    slot_wait_ns: int = 0
    # The server's usage.completion_tokens when it was not believed (bench.backends.bounds'
    # usage check: more than max_tokens allowed, or fewer than the content events received):
    # output_tokens then holds the count from the stream. None when usage was believed.
    claimed_output_tokens: int | None = None
    # The traffic class the request belonged to (a scenario's `classes:`, e.g. "chat" or
    # "agent"); None for a run of one class. Stored (schema 0003) so per-class summaries and
    # per-class SLOs can be judged again from the store.
    traffic_class: str | None = None

    @property
    def usage_mismatch(self) -> bool:
        """The server's usage disagreed with the stream beyond tolerance (see above)."""
        return self.claimed_output_tokens is not None

    @property
    def ok(self) -> bool:
        return self.state == OK

    @property
    def ttft_ns(self) -> int | None:
        if self.first_token_ns is None:
            return None
        return self.first_token_ns - self.sent_ns

    @property
    def ttft_from_intended_ns(self) -> int | None:
        """TTFT against the schedule: includes time the request waited inside the client."""
        if self.first_token_ns is None:
            return None
        return self.first_token_ns - self.intended_ns

    @property
    def e2el_ns(self) -> int | None:
        if self.end_ns is None:
            return None
        return self.end_ns - self.sent_ns

    @property
    def send_lag_ns(self) -> int:
        """How late the client sent it: after its intended time and any slot wait."""
        return self.sent_ns - self.intended_ns - self.slot_wait_ns

    @property
    def tpot_ns(self) -> float | None:
        """(E2E - TTFT) / (output_tokens - 1), as vLLM defines it; None for one-token outputs."""
        ttft, e2e, n = self.ttft_ns, self.e2el_ns, self.output_tokens
        if ttft is None or e2e is None or n is None or n < 2:
            return None
        return (e2e - ttft) / (n - 1)

    def itl_ns(self) -> np.ndarray:
        """Gaps between successive content chunks (one gap per chunk after the first)."""
        if len(self.chunk_times_ns) < 2:
            return EMPTY_TIMES
        return np.diff(self.chunk_times_ns)
