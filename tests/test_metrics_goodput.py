"""Goodput SLOs judge the metric they name: an `itl:` SLO is the mean chunk gap, not TPOT."""

from __future__ import annotations

import numpy as np

from bench.metrics import Columns, summarize
from bench.records import RequestRecord

MS = 1_000_000


def chunked(index: int, chunk_gaps_ms: list[float], tokens: int) -> RequestRecord:
    """A completed request: TTFT 10 ms, then chunks the given gaps apart, `tokens` in all."""
    first = 10 * MS
    times = first + np.concatenate([[0], np.cumsum(chunk_gaps_ms) * MS]).astype(np.int64)
    return RequestRecord(
        index=index,
        first_token_ns=first,
        end_ns=int(times[-1]),
        chunk_times_ns=times,
        output_tokens=tokens,
    )


def test_itl_slo_reads_chunk_gaps_while_tpot_reads_tokens():
    # 11 tokens in 3 chunks 40 ms apart: TPOT 8 ms, but the user waits 40 ms between chunks.
    bursty = chunked(0, [40, 40], tokens=11)
    # 11 tokens in 11 chunks 8 ms apart: TPOT 8 ms and ITL 8 ms.
    smooth = chunked(1, [8] * 10, tokens=11)
    records = [bursty, smooth]
    assert bursty.tpot_ns == smooth.tpot_ns == 8 * MS
    assert summarize(records, goodput={"tpot": 10}, duration_s=1).goodput_requests_per_s == 2
    assert summarize(records, goodput={"itl": 10}, duration_s=1).goodput_requests_per_s == 1
    # The same from the columns the store path builds (no per-request means carried).
    cols = Columns.from_records(records)
    assert summarize(cols, goodput={"itl": 39.9}, duration_s=1).goodput_requests_per_s == 1
    assert summarize(cols, goodput={"itl": 40}, duration_s=1).goodput_requests_per_s == 2
