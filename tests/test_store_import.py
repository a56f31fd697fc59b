"""Importers: vLLM, guidellm and aiperf sample files (tests/data/README.md) become runs."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.store import get_run, load_records
from bench.store.engine import dispose_all
from bench.store.importers import ImportFormatError, detect_format, import_file

DATA = Path(__file__).resolve().parent / "data"


@pytest.fixture
def db(tmp_path):
    yield str(tmp_path / "imp.db")
    dispose_all()


def test_vllm(db):
    run = get_run(import_file(DATA / "vllm_bench_serve.json", db=db), db)
    assert (run.imported_from, run.model, run.request_count) == (
        "vllm",
        "meta-llama/Llama-3.1-8B-Instruct",
        4,
    )
    assert run.load_points[0].target_rate == 2.0 and run.load_points[0].duration_s == 2.5
    s = run.summary_json
    assert (s["completed"], s["failed"]) == (3, 1)
    src = run.extra_json["source_summary"]
    assert s["metrics"]["ttft_ms"]["mean"] == pytest.approx(src["mean_ttft_ms"])
    assert s["metrics"]["itl_ms"]["mean"] == pytest.approx(src["mean_itl_ms"])
    assert s["throughput"]["requests_per_s"] == pytest.approx(src["request_throughput"])
    records = load_records(run.id, db=db)
    assert records[0].chunk_times_ns.tolist() == [50_000_000, 70_000_000, 90_000_000, 110_000_000]
    assert records[3].state == "failed" and "context length" in records[3].error_message


def test_guidellm(db):
    run = get_run(import_file(DATA / "guidellm_benchmarks.json", db=db), db)
    assert run.imported_from == "guidellm" and run.endpoint == "http://localhost:8000"
    assert [(lp.mode, lp.target_rate) for lp in run.load_points] == [
        ("synchronous", None),
        ("constant", 2.0),
    ]
    records = load_records(run.id, db=db)
    assert [r.state for r in records] == ["ok", "ok", "ok", "failed", "cancelled"]
    assert [r.load_point for r in records] == [0, 0, 1, 1, 1]
    assert records[0].ttft_ns == pytest.approx(50_000_000, abs=1000)
    assert "503" in records[3].error_message


@pytest.mark.parametrize("name", ["profile_export_aiperf.json", "profile_export.jsonl"])
def test_aiperf(db, name):
    run = get_run(import_file(DATA / "aiperf" / name, db=db), db)
    assert (run.imported_from, run.model, run.request_count) == (
        "aiperf",
        "Qwen/Qwen3-0.6B",
        3,
    )  # warm-up skipped
    assert run.load_points[0].concurrency == 2
    records = load_records(run.id, db=db)
    assert records[0].ttft_ns == 40_000_000 and len(records[0].chunk_times_ns) == 5
    assert records[2].state == "failed" and records[2].http_status == 500
    assert run.extra_json["source_summary"]["records"]["time_to_first_token"]["avg"] == 45.0


def test_unknown_format_is_a_clear_error(tmp_path, db):
    path = tmp_path / "x.json"
    path.write_text('{"hello": 1}')
    with pytest.raises(ImportFormatError, match="--format"):
        import_file(path, db=db)
    path.write_text("not json at all {")
    with pytest.raises(ImportFormatError, match="not JSON"):
        import_file(path, db=db)
    with pytest.raises(ImportFormatError, match="not a vllm result"):
        path.write_text('{"ttfts": 5}')
        import_file(path, "vllm", db=db)


def test_detect_format():
    assert detect_format({"benchmarks": []}) == "guidellm"
    assert detect_format({"ttfts": [], "itls": []}) == "vllm"


def test_vllm_detailed_file_of_the_current_format(db):
    # tests/data/vllm_bench_serve_detailed.json: written from vLLM's serve.py result dict
    # (README there): start_times on perf_counter, latencies (E2EL), queue_times (the wait
    # for a --max-concurrency slot), one failed request.
    run = get_run(import_file(DATA / "vllm_bench_serve_detailed.json", db=db), db)
    assert (run.model, run.request_count, run.load_points[0].concurrency) == ("tiny-llama", 4, 2)
    s, src = run.summary_json, run.extra_json["source_summary"]
    assert (s["completed"], s["failed"]) == (src["completed"], src["failed"]) == (3, 1)
    for metric in ("ttft", "tpot", "itl", "e2el"):
        for stat, theirs in (("mean", "mean"), ("p50", "median"), ("p99", "p99")):
            assert s["metrics"][f"{metric}_ms"][stat] == pytest.approx(
                src[f"{theirs}_{metric}_ms"], rel=1e-6
            ), (metric, stat)
    assert s["throughput"]["output_tokens_per_s"] == pytest.approx(src["output_throughput"])
    records = load_records(run.id, db=db)
    assert records[2].slot_wait_ns == 82_100_000  # queue_times, seconds
    assert records[2].sent_ns - records[2].intended_ns == 82_100_000
    assert s["slot_wait_ms"]["max"] == pytest.approx(86.5)
    assert s["send_lag_ms"]["max"] == pytest.approx(0.0, abs=1e-6)


def test_an_import_without_timings_says_so_and_stores_nothing(db, tmp_path):
    from bench.store import list_runs

    with pytest.raises(ImportFormatError, match="--save-detailed"):
        import_file(DATA / "vllm_bench_serve_aggregates.json", db=db)
    empty = tmp_path / "benchmarks.json"
    empty.write_text('{"benchmarks": [{"config": {"strategy": {"type_": "synchronous"}}}]}')
    with pytest.raises(ImportFormatError, match="nothing was imported"):
        import_file(empty, db=db)
    assert list_runs(db) == []


def test_guidellm_0_8_1_real_file_imports_with_the_latencies_guidellm_printed(db):
    # Made by guidellm 0.8.1 itself (tests/data/README.md): `guidellm run` against a real
    # llama-server, concurrent@4, 24 requests; console.txt is what it printed:
    # | concurrent@4 | 0.2 ± 0.03 | 0.1 | 0.3* | 42.4 ± 26.0 | 17.8 | 196.2* | ... | 7.1 | 6.9 | ...
    import json

    path = DATA / "guidellm_0.8.1" / "benchmarks.json"
    theirs = json.loads(path.read_text())["benchmarks"][0]["metrics"]
    run = get_run(import_file(path, db=db), db)
    assert (run.imported_from, run.model, run.endpoint) == (
        "guidellm",
        "tiny-llama",
        "http://127.0.0.1:18431",
    )
    lp = run.load_points[0]
    assert (lp.mode, lp.concurrency, run.request_count) == ("concurrent", 4, 24)
    s = run.summary_json
    assert (s["completed"], s["failed"]) == (24, 0)
    ttft = theirs["time_to_first_token_ms"]["successful"]
    assert s["metrics"]["ttft_ms"]["mean"] == pytest.approx(ttft["mean"], rel=1e-6)
    assert round(s["metrics"]["ttft_ms"]["mean"], 1) == 42.4  # as printed
    # The same 24 samples; the percentile methods differ at an even count: guidellm takes
    # the lower middle sample (17.8 printed), tokenbench (like vLLM, numpy) interpolates.
    records = load_records(run.id, db=db)
    ttfts = sorted(r.ttft_ns / 1e6 for r in records)
    assert ttft["median"] == pytest.approx(ttfts[11], abs=1e-3)
    assert round(ttft["median"], 1) == 17.8
    middle = (ttfts[11] + ttfts[12]) / 2
    assert s["metrics"]["ttft_ms"]["p50"] == pytest.approx(middle, rel=1e-6)
    e2e = theirs["request_latency"]["successful"]
    assert s["metrics"]["e2el_ms"]["mean"] == pytest.approx(e2e["mean"] * 1000, rel=1e-6)
    # guidellm's "ITL" is each request's (last token - first token) / (tokens - 1): TPOT as
    # vLLM and tokenbench define it, (E2EL - TTFT) / (tokens - 1), but from the last token
    # rather than the stream's end (~2 ms later here, the usage event and [DONE]). It has
    # no per-chunk times, so tokenbench's ITL is empty rather than made up.
    reqs = json.loads(path.read_text())["benchmarks"][0]["requests"]["successful"]
    timings = [q["info"]["timings"] for q in reqs]
    ours = [(t["request_end"] - t["first_token_iteration"]) * 1000 / 15 for t in timings]
    assert s["metrics"]["tpot_ms"]["mean"] == pytest.approx(sum(ours) / len(ours), rel=1e-6)
    itl = theirs["inter_token_latency_ms"]["successful"]["mean"]
    assert round(itl, 1) == 7.1  # as printed
    assert 0 < s["metrics"]["tpot_ms"]["mean"] - itl < 0.25
    assert s["metrics"]["itl_ms"]["mean"] is None
    assert {(r.prompt_tokens, r.output_tokens) for r in records} == {(65, 16)}
    assert sum(r.cached_prompt_tokens for r in records) == sum(
        q["cached_tokens"]
        for q in json.loads(path.read_text())["benchmarks"][0]["requests"]["successful"]
    )


@pytest.mark.parametrize("name", ["profile_export_aiperf.json", "profile_export.jsonl"])
def test_aiperf_0_13_real_files_import_with_the_latencies_aiperf_printed(db, name):
    # Made by aiperf 0.13.0 itself against a real llama-server (tests/data/README.md);
    # console.txt is what it printed: TTFT avg 57.12, p50 25.64, p99 170.13; Request
    # Latency avg 121.63, p50 126.19, p99 202.60 (ms).
    import json

    folder = DATA / "aiperf_0.13.0"
    theirs = json.loads((folder / "profile_export_aiperf.json").read_text())
    run = get_run(import_file(folder / name, db=db), db)
    assert (run.model, run.endpoint, run.load_points[0].concurrency) == (
        "tiny-llama",
        "http://127.0.0.1:18431",
        4,
    )
    s = run.summary_json
    assert (s["completed"], s["failed"]) == (16, 0)
    for ours, key in (("ttft_ms", "time_to_first_token"), ("e2el_ms", "request_latency")):
        for stat, their_stat in (("mean", "avg"), ("p50", "p50"), ("p99", "p99")):
            assert s["metrics"][ours][stat] == pytest.approx(theirs[key][their_stat], rel=1e-6)
    chunk = theirs["inter_chunk_latency"]
    assert s["metrics"]["itl_ms"]["mean"] == pytest.approx(chunk["avg"], rel=1e-6)
    assert s["metrics"]["itl_ms"]["p99"] == pytest.approx(chunk["p99"], rel=1e-6)
    assert round(s["metrics"]["ttft_ms"]["p99"], 2) == 170.13  # as printed
    # Token counts are the server's usage (16 out per request, as asked with ignore_eos),
    # not aiperf's own tokenizer's (8.44 on average here, which it warned about).
    records = load_records(run.id, db=db)
    assert {r.output_tokens for r in records} == {16}
    assert sum(r.output_tokens for r in records) == theirs["total_usage_completion_tokens"]["avg"]
    assert (
        sum(r.cached_prompt_tokens for r in records)
        == theirs["total_usage_prompt_cache_read_tokens"]["avg"]
    )
