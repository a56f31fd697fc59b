"""Server telemetry: Prometheus parsing, scraping the simulated endpoint during real runs,
a fake DCGM exporter with known power -> joules per output token, broken /metrics only warns.
"""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
import threading
import types
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest

from bench.cost import JOULES_PER_KWH, load_catalogue
from bench.drive import measure
from bench.executor import plan_from_scenario
from bench.records import OK
from bench.scenario import Scenario
from bench.session import RunSession
from bench.store.read import get_run, load_records
from bench.telemetry import (
    COLUMNS,
    GIVE_UP_AFTER,
    NvmlSource,
    PrometheusSource,
    Scraper,
    TelemetryConfig,
    canonicalize,
    energy_per_output_token,
    kv_cache_usage,
    labels_text,
    load_telemetry,
    mean_power,
    parse_labels_text,
    parse_prometheus,
    power_w,
    queue_depth,
    start_scraper,
    telemetry_warnings,
)

# ------------------------------------------------------------------ fixtures


POWER_W = {"0": 300.0, "1": 500.0}  # the fake exporter's two GPUs


def dcgm_text() -> str:
    """What dcgm-exporter serves, trimmed to the fields tokenbench reads (and one it does not)."""
    lines = []
    for field, kind, values in (
        ("DCGM_FI_DEV_POWER_USAGE", "gauge", POWER_W),
        ("DCGM_FI_DEV_SM_CLOCK", "gauge", {"0": 1980, "1": 1755}),
        ("DCGM_FI_DEV_FB_USED", "gauge", {"0": 70000, "1": 71234}),
        ("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", "gauge", {"0": 0, "1": 4}),
        ("DCGM_FI_DEV_GPU_TEMP", "gauge", {"0": 61, "1": 64}),
    ):
        lines += [f"# HELP {field} fake", f"# TYPE {field} {kind}"]
        for gpu, v in values.items():
            lines.append(
                f'{field}{{gpu="{gpu}",UUID="GPU-{gpu}abc",device="nvidia{gpu}",'
                f'modelName="NVIDIA H100 80GB HBM3",Hostname="fake"}} {v}'
            )
    return "\n".join(lines) + "\n"


class _Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        if self.path == "/metrics":
            self._reply(200, dcgm_text(), "text/plain; version=0.0.4")
        elif self.path == "/garbage":
            self._reply(200, "<html><body>Login required</body></html>\n", "text/html")
        else:
            self._reply(404, "not found\n", "text/plain")

    def _reply(self, status: int, body: str, ctype: str) -> None:
        data = body.encode()
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args) -> None:
        pass


@pytest.fixture(scope="module")
def exporter() -> Iterator[str]:
    """A fake DCGM exporter on 127.0.0.1: /metrics (known power), /garbage (HTML), else 404."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()
    thread.join(timeout=5)


@pytest.fixture(scope="module")
def sim() -> Iterator[str]:
    from bench.sim.server import start_sim_server_in_thread

    url, stop = start_sim_server_in_thread("H100-SXM", "llama-3.1-8b", "fp8", 1)
    yield url
    stop()


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def scenario(url: str, n: int = 40, rate: float = 40.0) -> Scenario:
    return Scenario.model_validate(
        {
            "name": "telemetry",
            "target": {"base_url": url, "model": "llama-3.1-8b"},
            "load": {"shape": "constant", "request_rate": rate, "num_prompts": n},
            "workload": {"input": {"mean": 64}, "output": {"mean": 32}},
            "gpu": {"type": "H100-SXM", "count": 2},
        }
    )


def run(url: str, db: str, telemetry: TelemetryConfig | None, n: int = 40):
    sc = scenario(url, n)
    measured = measure(sc, db=db, telemetry=telemetry)
    (point,) = measured.points
    return point.run, point.summary, measured.run_id


# ------------------------------------------------------------------ the text format


VLLM_TEXT = r"""# HELP vllm:num_requests_running Number of requests running.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="m"} 7.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="m"} 3
# TYPE vllm:gpu_cache_usage_perc gauge
vllm:gpu_cache_usage_perc{model_name="m"} 0.25
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{model_name="m"} 0.5
# TYPE vllm:generation_tokens counter
vllm:generation_tokens_total{model_name="m"} 1.5e+04
vllm:generation_tokens_created{model_name="m"} 1.7e9
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{le="0.1",model_name="m"} 4
vllm:time_to_first_token_seconds_bucket{le="+Inf",model_name="m"} 9
vllm:time_to_first_token_seconds_sum{model_name="m"} 1.25
vllm:time_to_first_token_seconds_count{model_name="m"} 9
odd_labels{path="a,b}c",quote="say \"hi\"",nl="x\ny",back="c:\\t"} NaN 1700000000000
no_labels 42
not a metric line at all {
"""


def test_parser_reads_types_labels_and_special_values():
    samples = parse_prometheus(VLLM_TEXT)
    by = {(s.name, labels_text(s.labels)): s for s in samples}
    assert by[("vllm:num_requests_running", 'model_name="m"')].type == "gauge"
    assert by[("vllm:generation_tokens_total", 'model_name="m"')].value == 15000
    assert by[("vllm:generation_tokens_total", 'model_name="m"')].type == "counter"
    inf = by[("vllm:time_to_first_token_seconds_bucket", 'le="+Inf",model_name="m"')]
    assert inf.type == "histogram" and inf.value == 9
    assert by[("vllm:time_to_first_token_seconds_sum", 'model_name="m"')].type == "histogram"
    odd = next(s for s in samples if s.name == "odd_labels")
    assert dict(odd.labels) == {"path": "a,b}c", "quote": 'say "hi"', "nl": "x\ny", "back": "c:\\t"}
    assert np.isnan(odd.value)
    assert by[("no_labels", "")].value == 42 and by[("no_labels", "")].type == "untyped"
    assert not any(s.name == "not" for s in samples)  # the broken line is skipped
    assert parse_labels_text(labels_text(odd.labels)) == dict(odd.labels)


def test_parser_refuses_text_that_is_not_prometheus():
    with pytest.raises(ValueError, match="not Prometheus text"):
        parse_prometheus("<html><body>Login required</body></html>\n")
    with pytest.raises(ValueError, match="not Prometheus text"):
        parse_prometheus('{"error": "nope"}')
    assert parse_prometheus("") == [] and parse_prometheus("# only a comment\n") == []


def test_known_metrics_for_vllm_sglang_trtllm_and_dcgm():
    vllm = {(p.metric, p.name) for p in canonicalize(parse_prometheus(VLLM_TEXT))}
    assert ("requests_running", "vllm:num_requests_running") in vllm
    assert ("requests_waiting", "vllm:num_requests_waiting") in vllm
    # kv_cache_usage_perc is the current name and wins; the old one is kept raw
    assert ("kv_cache_usage", "vllm:kv_cache_usage_perc") in vllm
    assert ("vllm:gpu_cache_usage_perc", "vllm:gpu_cache_usage_perc") in vllm
    assert ("generation_tokens_total", "vllm:generation_tokens_total") in vllm
    assert ("vllm:time_to_first_token_seconds_bucket",) * 2 in vllm  # unknown: raw

    sglang = canonicalize(
        parse_prometheus(
            'sglang:num_running_reqs{model_name="m",tp_rank="0"} 12\n'
            'sglang:num_queue_reqs{model_name="m",tp_rank="0"} 30\n'
            'sglang:token_usage{model_name="m",tp_rank="0"} 0.91\n'
            'sglang:generation_tokens_total{model_name="m"} 99\n'
        )
    )
    assert {p.metric: p.value for p in sglang} == {
        "requests_running": 12,
        "requests_waiting": 30,
        "kv_cache_usage": 0.91,
        "generation_tokens_total": 99,
    }

    triton = canonicalize(
        parse_prometheus(
            'nv_trt_llm_request_metrics{model="tensorrt_llm",request_type="waiting",version="1"} 5\n'
            'nv_trt_llm_request_metrics{model="tensorrt_llm",request_type="active",version="1"} 8\n'
            'nv_trt_llm_request_metrics{model="tensorrt_llm",request_type="max",version="1"} 256\n'
            'nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="fraction",model="tensorrt_llm",version="1"} 0.4875\n'
            'nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="used",model="tensorrt_llm",version="1"} 39\n'
        )
    )
    got = {(p.metric, p.labels): p.value for p in triton}
    assert got[("requests_waiting", 'model="tensorrt_llm",version="1"')] == 5
    assert got[("requests_running", 'model="tensorrt_llm",version="1"')] == 8
    assert got[("kv_cache_usage", 'model="tensorrt_llm",version="1"')] == 0.4875
    raw = 'model="tensorrt_llm",request_type="max",version="1"'
    assert got[("nv_trt_llm_request_metrics", raw)] == 256
    serve = canonicalize(parse_prometheus('trtllm_kv_cache_utilization{model_name="m"} 0.3\n'))
    assert serve[0].metric == "kv_cache_usage"

    dcgm = canonicalize(parse_prometheus(dcgm_text()))
    metrics = {p.metric for p in dcgm}
    assert {"gpu_power_w", "gpu_sm_clock_mhz", "gpu_memory_used_mib"} <= metrics
    assert "gpu_throttle_reasons" in metrics and "DCGM_FI_DEV_GPU_TEMP" in metrics


def test_mean_power_is_time_weighted_over_the_window():
    t = np.array([-0.5, 0.0, 1.0, 3.0, 4.5])
    w = np.array([999.0, 100.0, 100.0, 300.0, 999.0])
    # window [0, 4]: 100 W for 1 s, ramp 100->300 over 2 s (avg 200), then 300 held 1 s
    assert mean_power(t, w, 4.0) == pytest.approx((100 + 400 + 300) / 4)
    assert mean_power(np.array([2.0]), np.array([250.0]), 4.0) == 250.0
    assert mean_power(np.array([9.0]), np.array([250.0]), 4.0) is None


# ------------------------------------------------------------------ real scraping, sim endpoint


@pytest.mark.slow
def test_run_against_the_simulator_stores_server_samples(sim, tmp_path):
    db = f"sqlite:///{tmp_path / 't.db'}"
    result, summary, run_id = run(sim, db, TelemetryConfig(interval_s=0.2), n=60)
    assert summary.completed == 60
    df = load_telemetry(run_id, db)
    assert list(df.columns) == COLUMNS
    assert set(df["source"]) == {"server"} and set(df["load_point"]) == {0}
    q = queue_depth(df)
    n_scrapes = len(q)
    assert n_scrapes >= result.duration_s / 0.2  # one at start, every 0.2 s, one at the end
    assert q["t_s"].iloc[0] <= 0.05  # the baseline is taken before the first request
    assert q["t_s"].iloc[-1] >= result.duration_s - 0.05  # ... and the last after the end
    assert q["requests_running"].max() > 0
    assert q["requests_running"].iloc[0] == 0 and q["requests_running"].iloc[-1] == 0
    kv = kv_cache_usage(df)
    assert len(kv) == n_scrapes and kv["kv_cache_usage"].max() > 0
    # the server's generation counter grew by exactly the tokens the client received
    gen = df[df["metric"] == "generation_tokens_total"].sort_values("t_s")["value"]
    records = load_records(run_id, db=db)
    assert gen.iloc[-1] - gen.iloc[0] == sum(r.output_tokens for r in records)
    assert "tokenbench_sim_steps_total" in set(df["metric"])  # unknown metrics kept raw
    assert energy_per_output_token(run_id, db).empty  # no GPU telemetry: no measured energy
    assert load_telemetry(run_id, db, load_point=1).empty


@pytest.mark.slow
def test_fake_dcgm_exporter_gives_joules_per_output_token(sim, exporter, tmp_path):
    db = f"sqlite:///{tmp_path / 'e.db'}"
    config = TelemetryConfig(scrape_metrics=False, dcgm_url=f"{exporter}/metrics", interval_s=0.2)
    result, summary, run_id = run(sim, db, config)
    df = load_telemetry(run_id, db)
    assert set(df["source"]) == {"dcgm"}
    p = power_w(df)
    assert sorted(set(p["gpu"])) == ["0", "1"]
    assert p.groupby("gpu")["power_w"].mean().to_dict() == POWER_W
    clocks = df[df["metric"] == "gpu_sm_clock_mhz"]
    assert set(clocks["value"]) == {1980, 1755}

    (row,) = energy_per_output_token(run_id, db).to_dict("records")
    lp = get_run(run_id, db).load_points[0]
    duration = lp.ended_ns / 1e9
    tokens = sum(r.output_tokens for r in load_records(run_id, db=db) if r.state == OK)
    # by hand: 300 W + 500 W for the whole point, over the tokens it delivered
    joules = (300 + 500) * duration
    assert row["gpus"] == 2 and row["source"] == "dcgm"
    assert row["mean_power_w_per_gpu"] == pytest.approx(400)
    assert row["duration_s"] == pytest.approx(result.duration_s, abs=1e-6)
    assert row["output_tokens"] == tokens == summary.total_output_tokens
    assert row["energy_j"] == pytest.approx(joules)
    assert row["joules_per_output_token"] == pytest.approx(joules / tokens)
    assert row["kwh_per_mtok"] == pytest.approx(joules / tokens * 1e6 / JOULES_PER_KWH)
    d = load_catalogue().tco_defaults
    kwh, pue = d.usd_per_kwh.value, (d.pue.value if d.pue else 1.0)
    assert row["energy_usd_per_mtok"] == pytest.approx(
        joules / tokens * 1e6 * pue / JOULES_PER_KWH * kwh
    )


@pytest.mark.slow
@pytest.mark.parametrize("broken", ["404", "garbage", "refused"])
def test_broken_metrics_endpoint_only_warns(broken, sim, exporter, tmp_path, caplog):
    url = {
        "404": f"{exporter}/nope",
        "garbage": f"{exporter}/garbage",
        "refused": f"http://127.0.0.1:{closed_port()}/metrics",
    }[broken]
    expected = {"404": "HTTP 404", "garbage": "not Prometheus text", "refused": "ConnectError"}
    db = f"sqlite:///{tmp_path / 'b.db'}"
    sc = scenario(sim, n=20)
    session = RunSession(
        sc,
        plan_from_scenario(sc),
        db_url=db,
        telemetry=TelemetryConfig(metrics_url=url, interval_s=0.1),
    )
    with caplog.at_level(logging.WARNING, logger="tokenbench.telemetry"):
        _, summary = session.point(plan_from_scenario(sc))
        session.finish("completed", summary)
    assert summary.completed == 20 and summary.failed == 0
    assert get_run(session.run_id, db).status == "completed"
    assert any(expected[broken] in w for w in session.telemetry_warnings)
    assert any(expected[broken] in r.getMessage() for r in caplog.records)
    assert any(expected[broken] in w for w in telemetry_warnings(session.run_id, db)[0])
    df = load_telemetry(session.run_id, db)
    assert df.empty and list(df.columns) == COLUMNS
    assert queue_depth(df).empty and power_w(df).empty


def test_a_source_that_never_answers_is_dropped():
    source = PrometheusSource("server", [f"http://127.0.0.1:{closed_port()}/metrics"], 0.5)
    scraper = Scraper([source], interval_s=0.05, on_warning=lambda m: None)
    for _ in range(3 * GIVE_UP_AFTER):  # the ticks its thread would make, without waiting
        scraper.tick()
    recording = scraper.stop()
    assert recording.sources[0].failed == GIVE_UP_AFTER
    assert recording.scrapes == 0
    assert any("not scraped for the rest" in w for w in recording.warnings)


def test_default_url_falls_back_to_trtllm_serve_path(exporter):
    # {base}/metrics is the exporter's; a base whose /metrics is 404 tries /prometheus/metrics
    (source,) = TelemetryConfig(interval_s=0.2).sources(f"{exporter}/x", lambda m: None)
    assert source.urls == [f"{exporter}/x/metrics", f"{exporter}/x/prometheus/metrics"]
    with pytest.raises(Exception, match="HTTP 404"):
        source.read()
    source.close()
    (ok,) = TelemetryConfig().sources(exporter, lambda m: None)
    assert ok.read() and ok.where == f"{exporter}/metrics"
    ok.close()


def test_bad_interval_is_refused():
    with pytest.raises(ValueError, match="--metrics-interval"):
        TelemetryConfig(interval_s=0)


# ------------------------------------------------------------------ NVML


def test_nvml_missing_is_a_clear_warning(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml -> ImportError
    said: list[str] = []
    scraper = start_scraper(
        TelemetryConfig(scrape_metrics=False, nvml=True), "http://127.0.0.1:1", said.append
    )
    assert said == ["--nvml needs nvidia-ml-py (pip install 'tokenbench[gpu]'); no GPU telemetry"]
    assert scraper is not None and scraper.sources == []
    assert scraper.stop().warnings == said


def test_nvml_reader_converts_units(monkeypatch):
    class NVMLError(Exception):
        pass

    mem = types.SimpleNamespace(used=3 * 2**30)

    def no_clocks(handle, clock):
        raise NVMLError("not supported")

    fake = types.SimpleNamespace(
        NVMLError=NVMLError,
        NVML_CLOCK_SM=1,
        nvmlInit=lambda: None,
        nvmlShutdown=lambda: None,
        nvmlDeviceGetCount=lambda: 2,
        nvmlDeviceGetHandleByIndex=lambda i: i,
        nvmlDeviceGetPowerUsage=lambda h: 350_500 + h * 1000,  # milliwatts
        nvmlDeviceGetClockInfo=no_clocks,
        nvmlDeviceGetMemoryInfo=lambda h: mem,
        nvmlDeviceGetCurrentClocksThrottleReasons=lambda h: 0x4,
    )
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    points = {(p.metric, p.labels): p.value for p in NvmlSource().read()}
    assert points[("gpu_power_w", 'gpu="0"')] == 350.5
    assert points[("gpu_power_w", 'gpu="1"')] == 351.5
    assert points[("gpu_memory_used_mib", 'gpu="1"')] == 3072
    assert points[("gpu_throttle_reasons", 'gpu="0"')] == 4
    assert not any(m == "gpu_sm_clock_mhz" for m, _ in points)  # unsupported: left out


# ------------------------------------------------------------------ CLI, sweep, figure


def tokenbench(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "bench", *args], capture_output=True, text=True, timeout=120,
        env={**os.environ, "COLUMNS": "200"},
    )  # fmt: skip


@pytest.mark.slow
def test_cli_run_and_sweep_scrape_by_default(sim, exporter, tmp_path):
    db = f"sqlite:///{tmp_path / 'cli.db'}"
    common = ["--base-url", sim, "--random-input-len", "64", "--random-output-len", "16"]
    common += ["--db", db, "--metrics-interval", "0.2"]
    proc = tokenbench("run", *common, "--request-rate", "30", "--num-prompts", "30",
                      "--dcgm-url", f"{exporter}/metrics")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "server telemetry: waiting max" in proc.stdout
    assert "GPU power 400 W/GPU x2" in proc.stdout
    proc = tokenbench("run", *common, "--request-rate", "30", "--num-prompts", "5",
                      "--no-scrape-metrics", "--label", "quiet")  # fmt: skip
    assert proc.returncode == 0 and "server telemetry" not in proc.stdout
    proc = tokenbench("sweep", *common, "--request-rates", "10,40", "--num-prompts", "10",
                      "--label", "swept")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    from typer.testing import CliRunner

    from bench.cli import app

    bad = CliRunner().invoke(app, ["run", *common, "--metrics-interval", "0", "--num-prompts", "1"])
    assert bad.exit_code == 2 and "--metrics-interval" in bad.output

    from bench.store.read import list_runs

    runs = {r.label or r.name: r for r in list_runs(db)}
    first = next(r for r in runs.values() if r.label not in ("quiet", "swept"))
    assert set(load_telemetry(first.id, db)["source"]) == {"server", "dcgm"}
    assert load_telemetry(runs["quiet"].id, db).empty
    swept = load_telemetry(runs["swept"].id, db)
    assert set(swept["load_point"]) == {0, 1}

    from dashboards.telemetry import run_telemetry_figure

    fig = run_telemetry_figure(runs["swept"].id, db)
    names = [t.name for t in fig.data]
    assert names[:2] == ["P99 TTFT per second", "waiting (queued on the server)"]
    assert "KV-cache use" in names and all(t.meta == runs["swept"].id for t in fig.data)
    spans = [s for s in fig.layout.shapes if s.type == "rect"]
    assert len(spans) == 2  # the two load points, laid end to end
    lp1_start = spans[1].x0
    kv_x = next(t for t in fig.data if t.name == "KV-cache use").x
    assert min(kv_x) >= 0 and max(kv_x) > lp1_start  # the second point sits after the first
    one = run_telemetry_figure(first.id, db)
    assert any(t.name == "GPU 0 power" for t in one.data)


def test_figure_without_telemetry_says_so_and_labels_simulated():
    from dashboards.telemetry import telemetry_figure

    empty = load_telemetry.__globals__["frame_from_payloads"]([])
    fig = telemetry_figure(empty, {"t_s": [0.0, 1.0], "p99_ttft_ms": [10.0, None]}, simulated=True)
    texts = [a.text for a in fig.layout.annotations]
    assert "SIMULATED" in texts and "no server telemetry recorded for this run" in texts
    assert list(fig.data[0].x) == [0.5, 1.5]  # client values at the middle of their second


# ---------------------------------------------------------------- llama.cpp, vLLM 0.32, unknown

# Scraped from llama-server (llama-cpp-python 0.3.36's llama.cpp) while 8 slots were busy
# and 8 requests deferred; HELP lines left out.
LLAMACPP_TEXT = """\
# TYPE llamacpp:prompt_tokens_total counter
llamacpp:prompt_tokens_total 3080
# TYPE llamacpp:prompt_tokens_cached_total counter
llamacpp:prompt_tokens_cached_total 16
# TYPE llamacpp:prompt_seconds_total counter
llamacpp:prompt_seconds_total 0.412
# TYPE llamacpp:tokens_predicted_total counter
llamacpp:tokens_predicted_total 384
# TYPE llamacpp:n_decode_total counter
llamacpp:n_decode_total 71
# TYPE llamacpp:requests_processing gauge
llamacpp:requests_processing 8
# TYPE llamacpp:requests_deferred gauge
llamacpp:requests_deferred 8
# TYPE llamacpp:n_busy_slots_per_decode gauge
llamacpp:n_busy_slots_per_decode 5.2
"""


def _points(text: str) -> dict[str, float]:
    return {p.metric: p.value for p in canonicalize(parse_prometheus(text))}


def test_llama_cpp_metrics_map_to_queue_depth_tokens_and_cache():
    got = _points(LLAMACPP_TEXT)
    assert got["requests_running"] == 8 and got["requests_waiting"] == 8
    assert got["generation_tokens_total"] == 384
    # llama.cpp's prompt_tokens_total leaves cached tokens out: not vLLM's prompt_tokens_total
    assert got["prompt_tokens_computed_total"] == 3080 and "prompt_tokens_total" not in got
    assert got["prompt_tokens_cached_total"] == 16
    assert got["llamacpp:n_decode_total"] == 71  # unknown names are kept raw
    older = _points("llamacpp:kv_cache_usage_ratio 0.25\nllamacpp:kv_cache_tokens 512\n")
    assert older["kv_cache_usage"] == 0.25  # builds that still have the gauge


def test_vllm_0_32_names_including_its_prefix_cache_counters():
    # vLLM 0.32 (reference/real-servers.md): kv_cache_usage_perc only, prefix-cache
    # counters in tokens (prometheus_client adds _total to counters).
    got = _points(
        'vllm:num_requests_running{engine="0",model_name="m"} 3\n'
        'vllm:num_requests_waiting{engine="0",model_name="m"} 1\n'
        'vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.12\n'
        'vllm:prefix_cache_queries_total{engine="0",model_name="m"} 4096\n'
        'vllm:prefix_cache_hits_total{engine="0",model_name="m"} 3968\n'
        'vllm:prompt_tokens_total{engine="0",model_name="m"} 4096\n'
    )
    assert got["requests_running"] == 3 and got["kv_cache_usage"] == 0.12
    assert got["prefix_cache_queries_total"] == 4096 and got["prefix_cache_hits_total"] == 3968
    assert got["prompt_tokens_total"] == 4096
    assert _points("sglang:cache_hit_rate 0.75\n")["prefix_cache_hit_rate"] == 0.75


class _Stub:
    """A Source that answers with fixed Prometheus texts, one per read (the last repeats)."""

    name = "server"
    where = "http://stub/metrics"

    def __init__(self, *texts: str) -> None:
        self.texts = list(texts)

    def read(self):
        text = self.texts.pop(0) if len(self.texts) > 1 else self.texts[0]
        return canonicalize(parse_prometheus(text))

    def close(self) -> None:
        pass


def _record(*texts: str) -> tuple[list[str], object]:
    warned: list[str] = []
    scraper = Scraper([_Stub(*texts)], on_warning=warned.append)
    for _ in texts:
        scraper.tick()
    return warned, scraper.stop()


def test_a_metrics_endpoint_of_no_known_engine_is_one_warning_naming_those_known():
    warned, recording = _record(
        "myengine_queue_len 3\nmyengine_tokens_total 10\n", "myengine_queue_len 4\n"
    )
    assert len(warned) == 1
    for engine in ("vLLM", "SGLang", "TensorRT-LLM", "llama.cpp"):
        assert engine in warned[0]
    assert "stored raw" in warned[0]
    assert recording.sources[0].engine is None
    known, recording = _record(LLAMACPP_TEXT)
    assert known == [] and recording.sources[0].engine == "llama.cpp"
    assert recording.to_payload(0, 0)["sources"]["server"]["engine"] == "llama.cpp"


def test_prompt_cache_share_from_each_engines_counters():
    from bench.telemetry import prompt_cache, recording_frame

    def share(*texts: str) -> dict | None:
        return prompt_cache(recording_frame(_record(*texts)[1], 0))

    llama = share(
        "llamacpp:prompt_tokens_total 100\nllamacpp:prompt_tokens_cached_total 10\n",
        "llamacpp:prompt_tokens_total 116\nllamacpp:prompt_tokens_cached_total 2058\n",
    )
    assert (llama["cached_tokens"], llama["prompt_tokens"]) == (2048, 2064)
    assert llama["share"] == pytest.approx(2048 / 2064)
    vllm = share(
        "vllm:prefix_cache_queries_total 0\nvllm:prefix_cache_hits_total 0\n",
        "vllm:prefix_cache_queries_total 4096\nvllm:prefix_cache_hits_total 1024\n",
    )
    assert vllm["share"] == 0.25 and vllm["prompt_tokens"] == 4096
    assert share("sglang:cache_hit_rate 0.5\n", "sglang:cache_hit_rate 0.7\n")["share"] == 0.6
    assert share("vllm:num_requests_running 1\n") is None
