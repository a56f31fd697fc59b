"""A `vllm bench serve` user's command line works with only the URL changed, and its result
JSON has vLLM's field names and units (vllm/benchmarks/serve.py)."""

from __future__ import annotations

import json
import re
import statistics

import numpy as np
import pytest

from bench.vllm_compat import spread_multi_values
from bench.vllm_result import parse_metadata
from tests.test_cli import tokenbench

# What `vllm bench serve --save-result --save-detailed` writes for a generation run with
# --percentile-metrics ttft,tpot,itl,e2el --metric-percentiles 50,90,99.
VLLM_KEYS = {
    "date", "endpoint_type", "backend", "label", "model_id", "tokenizer_id", "num_prompts",
    "request_rate", "burstiness", "max_concurrency", "duration", "completed", "failed",
    "total_input_tokens", "total_output_tokens", "request_throughput", "request_goodput",
    "output_throughput", "total_token_throughput", "input_lens", "output_lens", "ttfts", "itls",
    "latencies", "start_times", "queue_times", "generated_texts", "errors",
    "max_output_tokens_per_s", "max_concurrent_requests", "rtfx",
    *(f"{stat}_{m}_ms" for m in ("ttft", "tpot", "itl", "e2el")
      for stat in ("mean", "median", "std", "p50", "p90", "p99")),
}  # fmt: skip


def test_several_values_after_one_flag_become_one_flag_each():
    args = ["--goodput", "ttft:500", "tpot:50", "--metadata", "a=1", "b=2", "--seed", "3"]
    assert spread_multi_values(args) == [
        "--goodput", "ttft:500", "--goodput", "tpot:50",
        "--metadata", "a=1", "--metadata", "b=2", "--seed", "3",
    ]  # fmt: skip
    assert spread_multi_values(["--goodput=ttft:5", "--num-prompts", "4"]) == [
        "--goodput=ttft:5", "--num-prompts", "4",
    ]  # fmt: skip
    assert parse_metadata(["version=0.3.3", "tp = 1"]) == {"version": "0.3.3", "tp": "1"}
    with pytest.raises(ValueError, match="KEY=VALUE"):
        parse_metadata(["oops"])


@pytest.mark.slow
def test_a_vllm_command_line_writes_a_vllm_result_json(fake_server, tmp_path):
    out = tmp_path / "vllm-results"
    proc = tokenbench(
        "run", "--base-url", fake_server.url, "--backend", "vllm", "--model", "fake-model",
        "--endpoint", "/v1/completions", "--dataset-name", "random", "--random-input-len", "16",
        "--random-output-len", "8", "--num-prompts", "20", "--request-rate", "inf",
        "--max-concurrency", "4", "--ignore-eos", "--percentile-metrics", "ttft,tpot,itl,e2el",
        "--metric-percentiles", "50,90,99", "--goodput", "ttft:500", "tpot:50", "--seed", "0",
        "--save-result", "--save-detailed", "--result-dir", str(out), "--result-filename",
        "r.json", "--metadata", "version=0.11.0", "tp=2", "--disable-tqdm",
        "--db", f"sqlite:///{tmp_path / 'tb.db'}",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    r = json.loads((out / "r.json").read_text())
    assert set(r) >= VLLM_KEYS, VLLM_KEYS - set(r)
    assert not any(k.startswith("p99.9") or k.startswith("p95") for k in r)
    assert r["version"] == "0.11.0" and r["tp"] == "2"
    assert r["backend"] == "vllm" and r["model_id"] == "fake-model"
    assert r["tokenizer_id"] == "fake-model"  # vLLM: the model's when --tokenizer is not given
    assert r["request_rate"] == "inf" and r["max_concurrency"] == 4 and r["num_prompts"] == 20
    assert r["completed"] == 20 and r["failed"] == 0
    assert r["total_output_tokens"] == 20 * 8 and r["output_lens"] == [8] * 20
    assert r["max_concurrent_requests"] <= 4
    # units: summaries in ms, per-request lists in seconds (the fake server: TTFT 50, ITL 10).
    # A loaded machine (two busy loops) makes the server late, and it then catches up to
    # its schedule (a 6 ms gap after a 14 ms one), so the figures are held to each other
    # and to the right order of magnitude, not to a window around 10 ms.
    gaps = sorted(g for per_request in r["itls"] for g in per_request)
    assert r["median_itl_ms"] == pytest.approx(statistics.median(gaps) * 1000, rel=1e-6)
    assert 5 <= r["median_itl_ms"] < 100 and 5 <= r["mean_tpot_ms"] < 100
    assert r["p90_ttft_ms"] >= r["median_ttft_ms"] >= 45
    assert all(0.045 < t < 5 for t in r["ttfts"])
    assert all(len(gaps) == 7 for gaps in r["itls"])
    assert 0.001 <= sorted(r["itls"][0])[3] < 0.1  # seconds
    assert r["latencies"][0] == pytest.approx(r["ttfts"][0] + sum(r["itls"][0]), abs=0.002)
    assert r["request_goodput"] == pytest.approx(r["request_throughput"])  # all meet the SLOs
    assert r["errors"] == [""] * 20
    assert r["output_throughput"] == pytest.approx(160 / r["duration"], rel=0.01)
    assert r["tokenbench"]["run_id"] in proc.stdout


@pytest.mark.slow
def test_vllm_result_default_name_and_summary_only_without_save_detailed(fake_server, tmp_path):
    proc = tokenbench(
        "run", "--base-url", fake_server.url, "--num-prompts", "5", "--request-rate", "50",
        "--random-output-len", "4", "--save-result", "--result-dir", str(tmp_path / "res"),
        "--label", "mylabel", "--no-store",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    (path,) = (tmp_path / "res").iterdir()
    # vLLM's {label}-{request_rate}qps-{model}-{date}.json
    assert re.fullmatch(r"mylabel-50\.0qps-fake-model-\d{8}-\d{6}\.json", path.name), path.name
    r = json.loads(path.read_text())
    assert "ttfts" not in r and "itls" not in r and "input_lens" not in r
    assert {"mean_ttft_ms", "median_ttft_ms", "std_ttft_ms", "p99_ttft_ms"} <= set(r)
    assert "p99_e2el_ms" not in r  # vLLM's default --percentile-metrics: ttft,tpot,itl
    assert r["request_goodput"] is None and r["label"] == "mylabel" and r["request_rate"] == 50


@pytest.mark.parametrize(
    "flag, hint",
    [
        (["--random-prefix-len", "3"], "prefix_ratio"),
        (["--trust-remote-code"], "--tokenizer"),
    ],
)
def test_a_vllm_only_flag_names_our_equivalent(flag, hint):
    proc = tokenbench("run", "--base-url", "http://127.0.0.1:9", *flag)
    assert proc.returncode == 2
    assert "vllm bench serve" in proc.stderr and hint in proc.stderr, proc.stderr
    assert "Did you mean" not in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.slow
def test_concurrency_with_a_rate_caps_in_flight_requests(fake_server, tmp_path):
    out = tmp_path / "s.json"
    proc = tokenbench(
        "run", "--base-url", fake_server.url, "--concurrency", "4", "--request-rate", "200",
        "--num-prompts", "24", "--random-output-len", "5", "--summary-json", str(out),
        "--save-result", "--save-detailed", "--result-filename", str(tmp_path / "v.json"),
        "--percentile-metrics", "ttft,client_queue_time,e2el_including_client_queue",
        "--no-store",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "at most 4 requests in flight" in proc.stderr
    s = json.loads(out.read_text())
    assert s["load"]["shape"] == "poisson" and s["load"]["request_rate"] == 200
    assert s["load"]["max_concurrency"] == 4 and s["completed"] == 24
    v = json.loads((tmp_path / "v.json").read_text())
    assert v["max_concurrent_requests"] <= 4
    # at 200 req/s with at most 4 in flight (each ~90 ms), requests waited in the client
    assert max(v["queue_times"]) > 0.05
    assert v["p99_client_queue_time_ms"] == pytest.approx(
        float(np.percentile(v["queue_times"], 99)) * 1e3, rel=1e-6
    )
    assert v["mean_e2el_including_client_queue_ms"] == pytest.approx(
        (np.mean(v["latencies"]) + np.mean(v["queue_times"])) * 1e3, rel=1e-6
    )
    conflict = tokenbench(
        "run", "--base-url", fake_server.url, "--concurrency", "4", "--request-rate", "2",
        "--max-concurrency", "8", "--no-store",
    )  # fmt: skip
    assert conflict.returncode == 2 and "give one of them" in conflict.stderr


@pytest.mark.slow
def test_sweep_summary_json_and_fail_on(fake_server, tmp_path):
    out = tmp_path / "sweep.json"
    args = ["sweep", "--base-url", fake_server.url, "--request-rates", "20,40", "--num-prompts",
            "10", "--random-output-len", "4", "--db", f"sqlite:///{tmp_path / 'tb.db'}",
            "--summary-json", str(out)]  # fmt: skip
    broken = tokenbench(*args, "--fail-on", "p99_ttft_ms<1")
    assert broken.returncode == 1, broken.stderr
    assert "FAIL point 1 (rate 20 req/s): p99_ttft_ms<1 broken" in broken.stderr
    s = json.loads(out.read_text())
    assert [p["index"] for p in s["points"]] == [0, 1]
    assert s["run_id"] and s["model"] == "fake-model" and s["base_url"] == fake_server.url
    assert len(s["failed_gates"]) == 2
    assert all(p["completed"] == 10 and p["total_output_tokens"] == 40 for p in s["points"])
    assert s["points"][1]["load"]["point"] == "rate 40 req/s"
    ok = tokenbench(*args, "--fail-on", "p99_ttft_ms<5000,error_rate<0.01")
    assert ok.returncode == 0, ok.stderr
    assert json.loads(out.read_text())["failed_gates"] == []


@pytest.mark.slow
def test_failure_examples_name_each_kind_once(server_factory, tmp_path):
    server = server_factory("--ttft-ms", "5", "--itl-ms", "1", "--fault", "3:http_500")
    out = tmp_path / "s.json"
    proc = tokenbench(
        "run", "--base-url", server.url, "--num-prompts", "9", "--request-rate", "inf",
        "--random-output-len", "3", "--summary-json", str(out), "--no-store",
    )  # fmt: skip
    assert proc.returncode == 1, proc.stderr  # a third failed: over the default share
    s = json.loads(out.read_text())  # written all the same
    assert s["errors"] == {"http_5xx": 3}
    assert set(s["failure_examples"]) == {"http_5xx"}
    assert "500" in s["failure_examples"]["http_5xx"]
