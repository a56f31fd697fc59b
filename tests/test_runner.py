"""End-to-end: the runner against the deterministic fake server, checked against its truth."""

from __future__ import annotations

import json

import numpy as np
import pytest

from bench.metrics import summarize
from bench.records import (
    ERR_HTTP_4XX,
    ERR_HTTP_5XX,
    ERR_HTTP_429,
    ERR_MALFORMED,
    ERR_NO_DONE,
    ERR_RESET,
    ERR_RESET_MID_STREAM,
    ERR_STREAM_ERROR,
    ERR_TIMEOUT_BODY,
)
from bench.runner import run_blocking
from bench.workload import LengthDist, Workload
from tests.helpers import cpu_pressure, plan

# Every test runs against the fake server in a subprocess; the same accounting, decoding and
# definitions are checked without one in test_scripted_runs.py.
pytestmark = pytest.mark.slow


TTFT_MS, ITL_MS = 50.0, 10.0


def server_truth(server, log) -> list[list[float]]:
    """Stop a server started with --sends-log and read, per request in arrival order, the
    ms after the request's arrival at which the server wrote each token."""
    server.stop()
    return [[t / 1e6 for t in sends] for sends in json.loads(log.read_text())]


@pytest.mark.parametrize("transport", ["raw", "httpx"])
@pytest.mark.parametrize("endpoint", ["/v1/completions", "/v1/chat/completions"])
def test_timings_match_server_truth(server_factory, tmp_path, transport, endpoint):
    log = tmp_path / "sends.json"
    server = server_factory(
        "--ttft-ms", str(TTFT_MS), "--itl-ms", str(ITL_MS), "--sends-log", str(log)
    )
    with cpu_pressure() as pressure:
        result = run_blocking(
            plan(server.url, 40, out_len=20, endpoint=endpoint, transport=transport),
            handle_sigint=False,
        )
    s = summarize(
        result.records,
        loop_lag_p99_ms=result.loop_lag_p99_ms,
        loop_cpu_share=result.loop_cpu_share,
        late_read_share=result.late_read_share,
        merged_token_share=result.merged_token_share,
    )
    assert s.completed == 40 and s.failed == 0
    assert s.total_output_tokens == 40 * 20
    assert all(r.token_count_source == "usage" for r in result.records)
    assert all(len(r.chunk_times_ns) == 20 for r in result.records)
    assert all(r.prompt_tokens == 32 for r in result.records)
    # The truth is what the server actually did (it may itself run late on a busy machine):
    # requests reach it in send order, 20 ms apart, so its i-th log is our i-th request.
    truth = server_truth(server, log)
    records = sorted(result.records, key=lambda r: r.sent_ns)
    ttft_err = [r.ttft_ns / 1e6 - t[0] for r, t in zip(records, truth, strict=True)]
    itl_err = np.concatenate(
        [np.diff(r.chunk_times_ns) / 1e6 - np.diff(t) for r, t in zip(records, truth, strict=True)]
    )
    if s.client_limited:
        # On a starved machine the client must say so rather than report skewed figures.
        assert s.client_limited_reasons
        return
    # httpx stamps a send before its own request machinery (pool, h11) has run and a read
    # after its parser has: ~2 ms of its own per request on a slow 2-core machine. The raw
    # transport stamps at the socket and the kernel stamps arrivals.
    ttft_bar_ms = 2.0 if transport == "raw" else 4.0
    assert np.median(ttft_err) == pytest.approx(0, abs=ttft_bar_ms)
    assert np.median(np.abs(itl_err)) < 1.0
    assert s.metrics["tpot"].percentiles["p50"] == pytest.approx(ITL_MS, abs=1.0)
    # The tail is compared with the (Python) server's log of its sends; on a CPU-starved
    # machine that log is itself late by milliseconds now and then (it stamps, then waits
    # for a CPU to write), so the tail is only held to it when the machine was not starved.
    # httpx stamps a read after its own parser ran, so any wait for a CPU lands in its
    # tail (errors cluster at ~4.5 ms beside busy loops: 5.004 ms once against a 5 ms bar,
    # issue 23): its tail is held only where nothing waited for a CPU more than 5% of the
    # time, and to 6 ms (5.087 ms in a quiet clean CI, 2026-12-06: its parser's own time on
    # a slow core, half an inter-token gap of 10 ms still being far off). The raw
    # transport's kernel stamps do not move with the loop: 5 ms.
    quiet = (pressure.share or 0.0) < 0.05
    if not pressure.starved and (transport == "raw" or quiet):
        tail_bar_ms = 5.0 if transport == "raw" else 6.0
        assert np.percentile(np.abs(itl_err), 99) < tail_bar_ms


def test_every_fault_counted_under_its_kind(server_factory):
    faults = {
        2: "http_500",
        3: "http_429",
        5: "http_400",
        7: "reset_before",
        11: "reset_mid",
        13: "malformed",
        17: "stream_error",
        19: "stall",
        23: "no_done",
    }
    args = [a for every, kind in faults.items() for a in ("--fault", f"{every}:{kind}")]
    server = server_factory("--ttft-ms", "5", "--itl-ms", "2", *args)
    n = 60
    # Sequential requests (closed loop, one user) so request k is the server's k-th.
    result = run_blocking(
        plan(server.url, n, out_len=8, rate=None, concurrency=1, request_timeout_s=0.5),
        handle_sigint=False,
    )
    expected: dict[str, int] = {}
    ok = 0
    for k in range(1, n + 1):
        kind = next((kind for every, kind in faults.items() if k % every == 0), None)
        name = {
            "http_500": ERR_HTTP_5XX,
            "http_429": ERR_HTTP_429,
            "http_400": ERR_HTTP_4XX,
            "reset_before": ERR_RESET,
            "reset_mid": ERR_RESET_MID_STREAM,
            "malformed": ERR_MALFORMED,
            "stream_error": ERR_STREAM_ERROR,
            "stall": ERR_TIMEOUT_BODY,
            "no_done": ERR_NO_DONE,
            None: None,
        }[kind]
        if name is None:
            ok += 1
        else:
            expected[name] = expected.get(name, 0) + 1
    s = summarize(result.records)
    assert s.errors == expected
    assert s.completed == ok
    assert s.sent == n
    messages = {r.error_kind: r.error_message for r in result.records if not r.ok}
    assert "HTTP 500" in messages[ERR_HTTP_5XX]
    assert "stream" in messages[ERR_STREAM_ERROR]
    assert "--request-timeout" in messages[ERR_TIMEOUT_BODY]


def test_noisy_stream_and_close_delimited_body(server_factory):
    server = server_factory("--ttft-ms", "5", "--itl-ms", "2", "--fault", "1:noisy", "--no-chunked")
    for endpoint in ("/v1/completions", "/v1/chat/completions"):
        result = run_blocking(
            plan(server.url, 10, out_len=12, endpoint=endpoint), handle_sigint=False
        )
        s = summarize(result.records)
        assert s.completed == 10, s.errors
        wrong = [
            (
                r.index,
                r.state,
                r.error_kind,
                len(r.chunk_times_ns),
                r.output_tokens,
                r.error_message,
            )
            for r in result.records
            if len(r.chunk_times_ns) != 12 or r.output_tokens != 12
        ]
        assert not wrong


def test_tokens_counted_from_chunks_without_usage(server_factory, tmp_path):
    log = tmp_path / "sends.json"
    server = server_factory(
        "--ttft-ms", "5", "--itl-ms", "2", "--no-usage", "--sends-log", str(log)
    )
    result = run_blocking(plan(server.url, 5, out_len=9), handle_sigint=False)
    wrong = [
        (r.index, r.state, r.error_kind, r.token_count_source, r.output_tokens, r.error_message)
        for r in result.records
        if r.token_count_source != "chunks" or r.output_tokens != 9
    ]
    sent = [len(t) for t in server_truth(server, log)]
    assert not wrong, f"server wrote {sent} tokens per request"


def test_closed_loop_keeps_concurrency(fake_server):
    result = run_blocking(
        plan(fake_server.url, 24, out_len=10, rate=None, concurrency=8), handle_sigint=False
    )
    s = summarize(result.records)
    assert s.completed == 24
    # 8 users, 3 rounds of 50 + 9 * 10 = 140 ms each: never under 0.42 s (a loaded machine
    # only makes it longer, so no upper bound in time; the order of events is checked).
    assert result.duration_s > 0.38
    starts = np.array([r.sent_ns for r in result.records])
    ends = np.array([r.end_ns for r in result.records])
    assert np.sort(starts)[7] < ends.min()  # the first 8 start together: before any ends
    in_flight = [int(((starts <= t) & (ends > t)).sum()) for t in starts]
    assert max(in_flight) == 8  # and the loop keeps exactly 8 going, never more


def test_max_concurrency_queues_and_shows_in_ttft_from_schedule(fake_server):
    # All 12 at t=0 with only 3 in flight: later requests wait inside the client.
    result = run_blocking(
        plan(fake_server.url, 12, out_len=5, rate=float("inf"), max_concurrency=3),
        handle_sigint=False,
    )
    s = summarize(result.records)
    assert s.completed == 12
    # the server's TTFT at least (a loaded machine only makes it later)
    assert TTFT_MS - 1 <= s.metrics["ttft"].percentiles["p50"] < TTFT_MS + 100
    # 4 waves of 50 + 4 * 10 = 90 ms: the last wave waited ~270 ms before it was sent.
    assert s.ttft_from_intended.percentiles["p99"] > 250
    # That wait is the cap working, reported as the wait for a slot, not as send lag.
    assert s.slot_wait_ms["max"] > 250
    assert s.send_lag_ms["max"] < s.slot_wait_ms["max"] / 10
    assert not any("send lag" in r for r in s.client_limited_reasons)


def test_poisson_schedule_is_followed(fake_server):
    rng_plan = plan(fake_server.url, 60, out_len=4, rate=None)
    rng_plan.offsets_s = np.cumsum(np.random.default_rng(0).exponential(1 / 40, 60))
    result = run_blocking(rng_plan, handle_sigint=False)
    s = summarize(result.records)
    assert s.completed == 60
    # Generous bounds: the test machine may be busy; send lag itself is what flags that.
    assert s.send_lag_ms["p50"] < 5
    sent = np.array(sorted(r.sent_ns for r in result.records)) / 1e9
    assert np.median(np.abs(sent - np.sort(rng_plan.offsets_s))) < 0.005
    assert np.abs(sent - np.sort(rng_plan.offsets_s)).max() < 0.1


def test_multi_turn_sessions_send_turns_in_order(fake_server):
    workload = Workload(seed=2, input=LengthDist(mean=16), output=LengthDist(mean=4), turns=3)
    p = plan(fake_server.url, 12, out_len=4, rate=None, endpoint="/v1/chat/completions")
    p.workload, p.specs = workload, workload.specs(12)
    p.offsets_s = np.array([0.0, 0.01, 0.02, 0.03])  # one offset per 3-turn session
    result = run_blocking(p, handle_sigint=False)
    assert summarize(result.records).completed == 12
    by_session: dict[int, list] = {}
    for r in sorted(result.records, key=lambda r: r.index):
        by_session.setdefault(r.index // 3, []).append(r)
    for turns in by_session.values():
        assert [r.turn for r in turns] == [0, 1, 2]
        for earlier, later in zip(turns, turns[1:], strict=False):
            assert later.sent_ns >= earlier.end_ns
        # Later turns carry the conversation so far, so their prompts are longer.
        assert turns[2].prompt_tokens > turns[0].prompt_tokens


def test_closed_loop_ramp_up_spreads_the_users_starts(fake_server):
    # 40 tokens take 440 ms, longer than the ramp: each user's first request is its own.
    p = plan(fake_server.url, 8, out_len=40, rate=None, concurrency=8, ramp_up_s=0.4)
    result = run_blocking(p, handle_sigint=False)
    assert summarize(result.records).completed == 8
    starts = np.sort([r.sent_ns for r in result.records]) / 1e9
    # User k starts at k * 0.4 / 8 s: 0, 0.05, ..., 0.35.
    assert np.diff(starts).min() > 0.03
    assert starts[-1] - starts[0] == pytest.approx(0.35, abs=0.05)


def test_an_error_in_what_follows_a_request_stops_the_run_with_it(fake_server, monkeypatch):
    # Requests are driven by callbacks: an exception raised while starting the next one
    # (here: rendering request 3's prompt) must end the run with that error, not hang it.
    render = Workload.render

    def bad_render(self, spec):
        if spec.index == 3:
            raise RuntimeError("cannot render request 3")
        return render(self, spec)

    monkeypatch.setattr(Workload, "render", bad_render)
    with pytest.raises(RuntimeError, match="cannot render request 3"):
        run_blocking(
            plan(fake_server.url, 8, out_len=3, rate=None, concurrency=2, request_timeout_s=5),
            handle_sigint=False,
        )
