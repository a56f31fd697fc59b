"""vLLM's --num-warmups and --ramp-up-strategy: the ramp's send times are vLLM's formula,
warm-up requests reach the server but no figure and no stored request, on every surface."""

from __future__ import annotations

import json
import math
import re

import numpy as np
import pytest

from bench.drive import choose_executor, measure
from bench.executor import plan_from_scenario, warmup_plan
from bench.overrides import Overrides, resolve_scenario
from bench.scenario import Scenario, ScenarioError, mean_rate, parse_scenario
from bench.store.read import get_run
from bench.sweep import PointSpec, scenario_at
from tests.test_cli import tokenbench


def vllm_send_times(strategy: str, start: float, end: float, n: int, burstiness: float, rng):
    """vLLM's get_request, written out request by request: the rate of request i, a gamma
    gap of mean 1 / rate (exactly that when burstiness is inf), the running sum."""
    t, out = 0.0, []
    for i in range(n):
        progress = i / max(n - 1, 1)
        if strategy == "linear":
            rate = start + (end - start) * progress
        else:
            rate = start * (end / start) ** progress
        if math.isinf(burstiness):
            t += 1.0 / rate
        else:
            t += rng.gamma(shape=burstiness, scale=1.0 / (rate * burstiness))
        out.append(t)
    return np.array(out)


def ramp_scenario(strategy: str, start: float, end: float, n: int, burstiness: float = 1.0,
                  **load) -> Scenario:  # fmt: skip
    return Scenario.model_validate(
        {
            "target": {"base_url": "http://127.0.0.1:9", "model": "fake-model"},
            "seed": 11,
            "load": {
                "shape": "ramp_up",
                "ramp_up": {"strategy": strategy, "start_rps": start, "end_rps": end},
                "burstiness": burstiness,
                "num_prompts": n,
                **load,
            },
            "workload": {"input": {"mean": 16}, "output": {"mean": 4}},
        }
    )


@pytest.mark.parametrize("strategy", ["linear", "exponential"])
@pytest.mark.parametrize("burstiness", [math.inf, 1.0, 0.5])
def test_ramp_offsets_are_vllms_formula(strategy, burstiness):
    sc = ramp_scenario(strategy, 2, 50, 40, burstiness)
    expected = vllm_send_times(
        strategy, 2, 50, 40, burstiness, np.random.default_rng([sc.run_seed(), 0])
    )
    np.testing.assert_allclose(sc.offsets(), expected, rtol=1e-12)
    if math.isinf(burstiness):  # the first request waits 1/start, the last gap is 1/end
        got = sc.offsets()
        assert got[0] == pytest.approx(1 / 2) and got[-1] - got[-2] == pytest.approx(1 / 50)


def test_ramp_mean_rate_and_a_sweep_point_keep_the_ramp():
    sc = ramp_scenario("linear", 1, 9, 5, math.inf)
    gaps = 1 / np.array([1, 3, 5, 7, 9])
    assert mean_rate(sc) == pytest.approx(5 / gaps.sum())
    point = scenario_at(sc, PointSpec("rate", 2 * mean_rate(sc)))
    assert point.load.shape == "ramp_up"  # scaled, not replaced by poisson
    assert (point.load.ramp_up.start_rps, point.load.ramp_up.end_rps) == pytest.approx((2, 18))
    assert mean_rate(point) == pytest.approx(2 * mean_rate(sc))


def test_ramp_flags_and_scenario_file_values():
    flags = Overrides(
        ramp_up_strategy="exponential", ramp_up_start_rps=1, ramp_up_end_rps=16, num_warmups=2,
        burstiness=math.inf, max_concurrency=3,
    )  # fmt: skip
    sc, _ = resolve_scenario("", "<flags>", flags, "run")
    assert sc.load.shape == "ramp_up" and sc.load.ramp_up.strategy == "exponential"
    assert sc.load.num_warmups == 2 and sc.load.max_concurrency == 3
    text = "load:\n  shape: ramp_up\n  ramp_up: {strategy: linear, start_rps: 1, end_rps: 4}\n"
    sc, _ = resolve_scenario(text, "f.yaml", Overrides(num_prompts=7), "run")
    assert sc.load.ramp_up.end_rps == 4 and sc.load.num_prompts == 7
    # --concurrency beside the ramp's flags caps in-flight requests, as beside a rate
    sc, notes = resolve_scenario(
        "", "<flags>", Overrides(ramp_up_strategy="linear", ramp_up_start_rps=1,
                                 ramp_up_end_rps=2, concurrency=2), "run",
    )  # fmt: skip
    assert sc.load.shape == "ramp_up" and sc.load.max_concurrency == 2 and notes


@pytest.mark.parametrize(
    "text, where",
    [
        ("load: {shape: ramp_up}", "shape 'ramp_up' needs ramp_up"),
        (
            "load: {shape: ramp_up, ramp_up: {strategy: cubic, start_rps: 1, end_rps: 2}}",
            "load.ramp_up.strategy",
        ),
        (
            "load: {shape: ramp_up, ramp_up: {strategy: linear, start_rps: 0, end_rps: 2}}",
            "load.ramp_up.start_rps",
        ),
        (
            "load: {shape: ramp_up, ramp_up: {strategy: linear, start_rps: 3, end_rps: 2}}",
            "only rises",
        ),
        ("load: {num_warmups: -1}", "load.num_warmups"),
    ],
)
def test_bad_scenario_values_name_the_field(text, where):
    with pytest.raises(ScenarioError, match=where) as info:
        parse_scenario(text, source="f.yaml")
    assert str(info.value).startswith("f.yaml line 1:") and "\n" not in str(info.value)


def test_a_ramp_with_only_a_duration_says_what_to_give():
    sc = ramp_scenario("linear", 1, 2, 5)
    sc.load.num_prompts, sc.load.duration_s = None, 10.0
    with pytest.raises(ScenarioError, match="give load.num_prompts"):
        sc.offsets()


@pytest.mark.parametrize(
    "args, message",
    [
        (["--ramp-up-strategy", "linear", "--ramp-up-start-rps", "5"], "needs both"),
        (["--ramp-up-start-rps", "1", "--ramp-up-end-rps", "5"], "go with --ramp-up-strategy"),
        (
            ["--ramp-up-strategy", "cubic", "--ramp-up-start-rps", "1", "--ramp-up-end-rps", "5"],
            "linear or exponential",
        ),
        (
            ["--ramp-up-strategy", "linear", "--ramp-up-start-rps", "5", "--ramp-up-end-rps", "1"],
            "only rises",
        ),
        (
            [
                "--ramp-up-strategy",
                "exponential",
                "--ramp-up-start-rps",
                "0",
                "--ramp-up-end-rps",
                "1",
            ],
            "above 0",
        ),  # fmt: skip
        (
            [
                "--ramp-up-strategy",
                "linear",
                "--ramp-up-start-rps",
                "1",
                "--ramp-up-end-rps",
                "5",
                "--request-rate",
                "3",
            ],
            "leave out --request-rate",
        ),  # fmt: skip
    ],
)
def test_bad_ramp_flags_are_one_line_errors(args, message):
    proc = tokenbench("run", "--base-url", "http://127.0.0.1:9", *args)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and message in lines[0], lines


def test_warmup_plan_is_the_first_requests_shape_with_fresh_prompts():
    sc = ramp_scenario("linear", 1, 2, 5, num_warmups=3, max_concurrency=2)
    plan = plan_from_scenario(sc)
    warm = warmup_plan(plan)
    first = plan.specs[0]
    assert len(warm.specs) == 3 and list(warm.offsets_s) == [0, 0, 0]
    assert {(s.input_len, s.output_len) for s in warm.specs} == {
        (first.input_len, first.output_len)
    }
    assert {s.index for s in warm.specs}.isdisjoint(s.index for s in plan.specs)
    assert warm.max_concurrency == 2 and warm.num_warmups == 0
    sc.load.num_warmups = 0
    assert warmup_plan(plan_from_scenario(sc)) is None


def fresh_scenario(url: str, **load) -> Scenario:
    return Scenario.model_validate(
        {
            "target": {"base_url": url, "model": "fake-model"},
            "load": {"num_prompts": 6, **load},
            "workload": {"input": {"mean": 16}, "output": {"mean": 4}},
        }
    )


@pytest.mark.slow
def test_warmups_reach_the_server_but_no_figure_and_no_stored_request(server_factory, tmp_path):
    server = server_factory("--ttft-ms", "5", "--itl-ms", "1")
    out, db = tmp_path / "s.json", f"sqlite:///{tmp_path / 'tb.db'}"
    proc = tokenbench(
        "run", "--base-url", server.url, "--num-prompts", "6", "--num-warmups", "3",
        "--request-rate", "200", "--random-input-len", "16", "--random-output-len", "4",
        "--db", db, "--summary-json", str(out), "--no-scrape-metrics",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert server.stats()["requests"] == 3 + 6  # the server's own count
    doc = json.loads(out.read_text())
    assert doc["completed"] == 6 and doc["warmups"] == {"sent": 3, "completed": 3}
    assert doc["load"]["num_warmups"] == 3 and doc["load"]["ramp_up"] is None
    run = get_run(doc["run_id"], db)
    assert run.request_count == 6 and run.load_points[0].summary_json["warmups"]["sent"] == 3
    assert "Warm-up: 3 requests sent" in proc.stdout + proc.stderr


@pytest.mark.slow
def test_a_ramped_run_writes_vllms_result_file(server_factory, tmp_path):
    """vLLM's result JSON of a ramp: its ramp_up_* keys, request_rate inf, and its name."""
    server = server_factory("--ttft-ms", "2", "--itl-ms", "1")
    proc = tokenbench(
        "run", "--base-url", server.url, "--num-prompts", "5", "--ramp-up-strategy", "linear",
        "--ramp-up-start-rps", "50", "--ramp-up-end-rps", "100", "--random-output-len", "3",
        "--save-result", "--result-dir", str(tmp_path / "res"), "--no-store",
        "--no-scrape-metrics",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    (path,) = (tmp_path / "res").iterdir()
    assert re.fullmatch(
        r"vllm-ramp-up-linear-50qps-100qps-fake-model-\d{8}-\d{6}\.json", path.name
    ), path.name
    doc = json.loads(path.read_text())
    assert (doc["ramp_up_strategy"], doc["ramp_up_start_rps"], doc["ramp_up_end_rps"]) == (
        "linear", 50, 100,
    )  # fmt: skip
    assert doc["request_rate"] == "inf" and doc["completed"] == 5


@pytest.mark.slow
def test_ramp_sends_at_vllms_times_on_the_wire(server_factory):
    """The runner sends each request at the ramp's offset (intended == formula); lateness
    is the client's send lag, judged elsewhere."""
    server = server_factory("--ttft-ms", "2", "--itl-ms", "1")
    sc = ramp_scenario("linear", 20, 200, 12, math.inf)
    sc.target.base_url = server.url
    sc.load.num_warmups = 2
    res = measure(sc, executor=choose_executor(handle_sigint=False), store=False, probe=None)
    records = sorted(res.points[0].run.records, key=lambda r: r.index)
    expected = vllm_send_times("linear", 20, 200, 12, math.inf, None)
    intended = np.array([r.intended_ns for r in records]) / 1e9
    np.testing.assert_allclose(intended, expected, atol=2e-9)
    # sent when due (asyncio may wake a timer up to its clock's resolution early; a busy
    # machine late, which the self-check reports as send lag)
    assert all(r.sent_ns - r.intended_ns > -2_000_000 for r in records)
    assert len(records) == 12 and server.stats()["requests"] == 14


@pytest.mark.slow
def test_a_sweep_warms_up_and_ramps_at_every_point(server_factory):
    from bench.sweep import SweepPlan

    server = server_factory("--ttft-ms", "2", "--itl-ms", "1")
    sc = ramp_scenario("linear", 20, 60, 6, math.inf, num_warmups=2)
    sc.target.base_url = server.url
    base = mean_rate(sc)
    plan = SweepPlan(specs=[PointSpec("rate", base), PointSpec("rate", 2 * base)], slo_draws=0)
    res = measure(sc, plan, executor=choose_executor(handle_sigint=False), store=False,
                  probe=None)  # fmt: skip
    assert server.stats()["requests"] == 2 * (2 + 6)
    for point, factor in zip(res.points, (1, 2), strict=True):
        assert point.summary.completed == 6 and point.summary.warmups["sent"] == 2
        intended = sorted(r.intended_ns / 1e9 for r in point.run.records)
        want = vllm_send_times("linear", 20 * factor, 60 * factor, 6, math.inf, None)
        np.testing.assert_allclose(intended, want, atol=2e-9)


def test_warmups_in_virtual_time_are_simulated_and_left_out():
    sc = fresh_scenario("http://sim.virtual", request_rate=5, num_warmups=4)
    virtual = choose_executor(virtual={"gpu": "H100-SXM", "model": "llama-3.1-8b"})
    sc = virtual.adopt(sc)
    res = measure(sc, executor=virtual, store=False, probe=None)
    point = res.points[0]
    assert len(point.run.records) == 6 and point.summary.completed == 6
    assert point.summary.warmups == {"sent": 4, "completed": 4}


@pytest.mark.slow
def test_sim_run_takes_the_flags(tmp_path):
    db = f"sqlite:///{tmp_path / 'tb.db'}"
    out = tmp_path / "s.json"
    proc = tokenbench(
        "sim", "run", "--gpu", "H100-SXM", "--model", "llama-3.1-8b", "--num-prompts", "8",
        "--num-warmups", "2", "--ramp-up-strategy", "exponential", "--ramp-up-start-rps", "1",
        "--ramp-up-end-rps", "8", "--db", db, "--summary-json", str(out),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(out.read_text())
    run = get_run(doc["run_id"], db)
    assert run.request_count == 8
    load = run.scenario()["load"]
    assert load["shape"] == "ramp_up" and load["num_warmups"] == 2
    assert run.load_points[0].summary_json["warmups"] == {"sent": 2, "completed": 2}


@pytest.mark.slow
def test_workers_each_send_their_share_of_the_ramp_after_the_warmups(server_factory):
    server = server_factory("--ttft-ms", "2", "--itl-ms", "1")
    sc = ramp_scenario("exponential", 10, 80, 16, math.inf, num_warmups=4)
    sc.target.base_url = server.url
    executor = choose_executor(workers=2, handle_sigint=False)
    res = measure(sc, executor=executor, store=False, probe=None)
    run = res.points[0].run
    records = sorted(run.records, key=lambda r: r.index)
    expected = vllm_send_times("exponential", 10, 80, 16, math.inf, None)
    np.testing.assert_allclose(
        np.array([r.intended_ns for r in records]) / 1e9, expected, atol=2e-9
    )
    assert [w.planned_sessions for w in run.workers] == [8, 8]
    assert server.stats()["requests"] == 4 + 16 and res.points[0].summary.completed == 16


@pytest.fixture
async def api(tmp_path):
    import httpx

    from tests.test_server_api import make_app

    db = f"sqlite:///{tmp_path / 'api.db'}"
    app = make_app(db)
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://test"
    ) as client:
        client.db = db
        yield client
    app.state.tb.jobs.shutdown()


async def test_the_api_refuses_a_bad_ramp_naming_it(api):
    from tests.test_server_api import AUTH

    body = {"kind": "run", "simulate": {}, "ramp_up_strategy": "linear", "ramp_up_start_rps": 5,
            "ramp_up_end_rps": 1}  # fmt: skip
    r = await api.post("/api/jobs", json=body, headers=AUTH)
    assert r.status_code == 422 and "only rises" in r.text
    r = await api.post("/api/jobs", json={**body, "ramp_up_strategy": "cubic"}, headers=AUTH)
    assert r.status_code == 422 and "ramp_up_strategy" in r.text
    r = await api.post("/api/jobs", json={"kind": "run", "num_warmups": -1}, headers=AUTH)
    assert r.status_code == 422 and "num_warmups" in r.text


@pytest.mark.slow
async def test_an_api_job_ramps_and_warms_up(api):
    from tests.test_server_api import AUTH, sse_events

    body = {
        "kind": "run", "simulate": {"gpu": "H100-SXM", "model": "llama-3.1-8b"},
        "num_prompts": 10, "num_warmups": 3, "ramp_up_strategy": "linear",
        "ramp_up_start_rps": 2, "ramp_up_end_rps": 20,
    }  # fmt: skip
    r = await api.post("/api/jobs", json=body, headers=AUTH)
    assert r.status_code == 202, r.text
    final = sse_events((await api.get(f"/api/jobs/{r.json()['id']}/events")).text)[-1][1]
    assert final["status"] == "completed", final
    run = get_run(final["run_id"], api.db)
    assert run.request_count == 10 and run.scenario()["load"]["shape"] == "ramp_up"
    assert run.load_points[0].summary_json["warmups"] == {"sent": 3, "completed": 3}
