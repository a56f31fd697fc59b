"""The REST API through httpx against the ASGI app: reads, auth, 422s, allow-list, jobs."""

from __future__ import annotations

import json
import time

import httpx
import pytest

from bench.curves import run_curves
from bench.store.read import get_run, list_runs
from server.app import create_app
from tests.helpers import store_sweep

TOKEN = "test-token-123"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
FAST_SCENARIO = """
name: api-test
load: {shape: poisson, request_rate: 80, num_prompts: 16}
workload: {input: {mean: 32}, output: {mean: 6}}
"""


@pytest.fixture(scope="module")
def db(tmp_path_factory):
    url = f"sqlite:///{tmp_path_factory.mktemp('api') / 'runs.db'}"
    store_sweep(url, gpu="B200-SXM", per_point=30, failures=1)
    store_sweep(url, gpu="H100-SXM", gpu_count=2, per_point=30, simulated=False, seed=2)
    return url


def make_app(db, **kw):
    options = {
        "api_token": TOKEN,
        "allow_hosts": [],
        "open_reads": True,
        "server_names": ["test", "t"],  # the test clients' base URLs
        **kw,
    }
    return create_app(db, **options)


@pytest.fixture
async def client(db):
    app = make_app(db)
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://test"
    ) as c:
        c.app = app
        yield c
    app.state.tb.jobs.shutdown()


def field_of(response) -> list:
    detail = response.json()["detail"]
    assert isinstance(detail, list), detail
    return [d["loc"] for d in detail]


async def test_runs_list_detail_and_filters(client, db):
    runs = (await client.get("/api/runs")).json()
    assert len(runs) == 2 and {r["gpu_type"] for r in runs} == {"B200-SXM", "H100-SXM"}
    assert [r["id"] for r in (await client.get("/api/runs?gpu=b200")).json()] == [
        r.id for r in list_runs(db, gpu="b200")
    ]
    sim = (await client.get("/api/runs?simulated=true")).json()
    assert [r["gpu_type"] for r in sim] == ["B200-SXM"]
    assert (await client.get("/api/runs?since=2999-01-01T00:00:00")).json() == []
    rid = sim[0]["id"]
    detail = (await client.get(f"/api/runs/{rid[:8]}")).json()
    assert detail["id"] == rid and len(detail["load_points"]) == 3
    lp = detail["load_points"][0]
    assert lp["target_rate"] == 1.0 and lp["summary"]["failed"] == 1
    assert lp["summary"]["metrics"]["ttft_ms"]["p99"] > 0
    r = await client.get("/api/runs/nope-nope")
    assert r.status_code == 404 and "no run matches" in r.json()["detail"]


async def test_requests_are_paged_by_keyset(client, db):
    rid = list_runs(db, gpu="h100")[0].id
    seen, after = [], 0
    for _ in range(20):
        page = (await client.get(f"/api/runs/{rid}/requests?limit=25&after={after}")).json()
        seen += page["items"]
        if page["next_after"] is None:
            break
        after = page["next_after"]
    assert len(seen) == 90 and len({r["id"] for r in seen}) == 90
    one = (await client.get(f"/api/runs/{rid}/requests?load_point=2&limit=1000")).json()
    assert {r["load_point"] for r in one["items"]} == {2} and len(one["items"]) == 30
    failed = list_runs(db, gpu="b200")[0].id
    bad = (await client.get(f"/api/runs/{failed}/requests?state=failed")).json()
    assert [r["error_kind"] for r in bad["items"]] == ["http_5xx"]


async def test_curves_compare_costs_match_the_library(client, db):
    ids = [r.id for r in list_runs(db, gpu="b200")] + [r.id for r in list_runs(db, gpu="h100")]
    query = "&".join(f"run={i}" for i in ids)
    curves = (await client.get(f"/api/curves?{query}")).json()
    lib = run_curves(ids, db)
    for got, want in zip(curves, lib, strict=True):
        assert got["colour"] == want.colour and got["legend"] == want.legend
        assert [p["output_tps_per_gpu"] for p in got["points"]] == pytest.approx(
            [p.output_tps_per_gpu for p in want.points]
        )
    comp = (await client.get(f"/api/compare?{query}&slo=p99_ttft_ms<=400")).json()
    assert comp["slo"] == ["p99_ttft_ms<=400"] and comp["slo_source"] == "given"
    # Every rate meets 400 ms on both: two lower bounds, so no ratio is claimed.
    assert "both capacities are lower bounds" in comp["sentence"] and comp["ratio"] is None
    assert comp["runs"][0]["basis"] == "SLO capacity" and comp["runs"][0]["cost"]
    costs = (await client.get(f"/api/costs?{query}&tier=hyperscaler-on-demand")).json()
    assert [len(c["rows"]) for c in costs] == [1, 1]
    every = (await client.get(f"/api/costs?run={ids[0]}&at=all")).json()
    assert [c["point_title"] for c in every] == [p.title for p in lib[0].points]
    tiers = (await client.get("/api/prices?gpu=h100")).json()
    assert tiers and all(t["gpu"] == "H100-SXM" for t in tiers)
    ts = (await client.get(f"/api/runs/{ids[0]}/timeseries")).json()
    assert len(ts["load_points"]) == 3 and sum(ts["offered_rps"]) == pytest.approx(90)


async def test_bad_queries_and_bodies_are_422_naming_the_field(client, db):
    rid = list_runs(db)[0].id
    r = await client.get(f"/api/compare?run={rid}&slo=p99_bogus<=3")
    assert r.status_code == 422 and field_of(r) == [["query", "slo"]]
    r = await client.get(f"/api/compare?run={rid}&utilisation=0")
    assert r.status_code == 422 and field_of(r) == [["query", "utilisation"]]
    cases = [
        ({"kind": "run", "num_prompts": -1, "simulate": {}}, ["body", "num_prompts"]),
        ({"kind": "run", "bogus": 1}, ["body", "bogus"]),
        ({"kind": "sweep", "simulate": {}}, ["body"]),
        (
            {"kind": "run", "scenario": "load: {request_rate: -2}", "simulate": {}},
            ["body", "scenario"],
        ),
        ({"kind": "run", "scenario": "load: [", "simulate": {}}, ["body", "scenario"]),
        ({"kind": "run", "scenario_name": "no-such", "simulate": {}}, ["body", "scenario_name"]),
        ({"kind": "run", "simulate": {"gpu": "TPU-9"}}, ["body", "simulate"]),
        (
            {"kind": "sweep", "simulate": {}, "sweep": {"request_rates": [1], "slo": "x<1"}},
            ["body", "sweep", "slo"],
        ),
        ({"kind": "run"}, ["body", "target", "base_url"]),
        (  # virtual time is single-turn: a multi-turn scenario needs the real-time endpoint
            {"kind": "run", "scenario": "workload: {turns: 2}", "simulate": {}},
            ["body", "simulate", "clock"],
        ),
        ({"kind": "run", "simulate": {"clock": "sundial"}}, ["body", "simulate", "clock"]),
    ]
    for body, loc in cases:
        r = await client.post("/api/jobs", json=body, headers=AUTH)
        assert r.status_code == 422, (body, r.text)
        assert loc in field_of(r) or any(loc == x[: len(loc)] for x in field_of(r)), (body, r.text)
    r = await client.post(
        "/api/jobs", content=b"{not json", headers={**AUTH, "Content-Type": "application/json"}
    )
    assert r.status_code == 422
    bad_scenario = await client.post(
        "/api/jobs",
        json={"kind": "run", "scenario": "load: {request_rate: -2}", "simulate": {}},
        headers=AUTH,
    )
    assert "load.request_rate" in bad_scenario.json()["detail"][0]["msg"]


async def test_writes_need_the_token(client, db):
    rid = list_runs(db)[0].id
    for method, url, body in [
        ("POST", "/api/jobs", {"kind": "run", "simulate": {}}),
        ("DELETE", f"/api/runs/{rid}", None),
        ("POST", "/api/prices/tiers", {}),
        ("POST", "/api/jobs/x/cancel", None),
    ]:
        for headers in (
            {},
            {"Authorization": "Bearer wrong"},
            {"Cookie": f"tokenbench_token={TOKEN}"},
        ):
            r = await client.request(method, url, json=body, headers=headers)
            assert r.status_code == 401, (method, url, headers)
            assert r.headers["www-authenticate"] == "Bearer"
    assert get_run(rid, db).id == rid  # nothing was deleted


async def test_reads_need_the_token_off_loopback(db):
    app = make_app(db, open_reads=False)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as c:
        assert (await c.get("/api/runs")).status_code == 401
        assert (await c.get("/api/runs", headers=AUTH)).status_code == 200
        page = await c.get("/runs")
        assert page.status_code == 303 and page.headers["location"].startswith("/login")
        wrong = await c.post("/login", data={"token": "nope", "next": "/runs"})
        assert "not the service" in wrong.text
        ok = await c.post("/login", data={"token": TOKEN, "next": "/runs"})
        assert ok.status_code == 303 and ok.headers["location"] == "/runs"
        assert (await c.get("/runs")).status_code == 200  # the cookie now
        assert (await c.get("/api/runs")).status_code == 200
        assert (await c.get("/static/plotly.min.js")).status_code == 200  # assets stay open


async def test_allow_list_keeps_runs_on_listed_hosts(client, db):
    body = {"kind": "run", "scenario": FAST_SCENARIO}
    for url in ("http://10.1.2.3:8000", "http://example.com", "file:///etc/passwd"):
        r = await client.post("/api/jobs", json={**body, "target": {"base_url": url}}, headers=AUTH)
        assert r.status_code in (403, 422), url
        assert "allow-list" in r.text or "http(s)" in r.text
    app = make_app(db, allow_hosts=["10.0.0.0/8", "gpu-box.lab"])
    allow = app.state.tb.allow
    assert allow.check("http://10.255.255.1:9") is None
    assert allow.check("http://GPU-box.lab:8000/v1") is None
    assert allow.check("http://[::1]:8000") is None and allow.check("http://127.0.0.5") is None
    assert "allow-list" in allow.check("http://11.0.0.1")
    assert "allow-list" in allow.check("http://gpu-box.lab.evil.com")
    assert "allow-list" in allow.check("http://0x7f000001")  # names are never resolved
    app.state.tb.jobs.shutdown()


@pytest.mark.slow
async def test_a_listed_host_gets_its_job(db):
    """Submitting starts a job process (seconds), so this half of the allow-list is slow."""
    body = {"kind": "run", "scenario": FAST_SCENARIO}
    app = make_app(db, allow_hosts=["10.0.0.0/8"])
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
        r = await c.post(
            "/api/jobs",
            json={**body, "target": {"base_url": "http://10.255.255.1:9"}},
            headers=AUTH,
        )
        assert r.status_code != 403  # allowed: whether it is reachable depends on the network
        if r.status_code == 202:
            await c.post(f"/api/jobs/{r.json()['id']}/cancel", headers=AUTH)
    app.state.tb.jobs.shutdown()


async def test_delete_run_and_add_tier(tmp_path):
    db = f"sqlite:///{tmp_path / 'w.db'}"
    rid = store_sweep(db, gpu="B200-SXM", per_point=5)
    prices = tmp_path / "prices.yaml"
    app = make_app(db, prices_file=prices)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
        tier = {
            "gpu": "b200",
            "name": "my-deal",
            "price_usd_per_gpu_hr": 2.25,
            "source": "vendor quote",
            "date": "2026-05",
        }
        r = await c.post("/api/prices/tiers", json=tier, headers=AUTH)
        assert r.status_code == 201 and r.json()["gpu"] == "B200-SXM"
        assert r.json()["price_usd_per_gpu_hr"] == 2.25
        assert "my-deal" in prices.read_text()
        costs = (await c.get(f"/api/costs?run={rid}&tier=my-deal")).json()
        assert costs[0]["rows"][0]["price_usd_per_gpu_hr"] == 2.25
        r = await c.post("/api/prices/tiers", json={**tier, "date": "May 2026"}, headers=AUTH)
        assert r.status_code == 422 and field_of(r) == [["body", "date"]]
        r = await c.post("/api/prices/tiers", json={**tier, "kind": "owned"}, headers=AUTH)
        assert r.status_code == 422

        r = await c.delete(f"/api/runs/{rid}", headers=AUTH)
        assert r.status_code == 200 and r.json()["deleted_requests"] == 15
        assert (await c.get(f"/api/runs/{rid}")).status_code == 404
    again = make_app(db, prices_file=prices)  # the tier survives a restart
    assert again.state.tb.catalogue.tier("B200-SXM", "my-deal").price_usd_per_gpu_hr == 2.25


def sse_events(text: str) -> list[tuple[str, dict]]:
    out = []
    for block in text.strip().split("\n\n"):
        lines = block.splitlines()
        if not lines or lines[0].startswith(":"):
            continue
        kind = lines[0].removeprefix("event: ")
        data = "\n".join(x.removeprefix("data: ") for x in lines if x.startswith("data: "))
        out.append((kind, json.loads(data)))
    return out


@pytest.mark.slow
async def test_background_run_and_sweep_with_progress_events(client, fake_server, db):
    body = {
        "kind": "run",
        "scenario": FAST_SCENARIO,
        "target": {"base_url": fake_server.url},
        "gpu": "H100-SXM",
        "label": "api run",
    }
    r = await client.post("/api/jobs", json=body, headers=AUTH)
    assert r.status_code == 202, r.text
    job = r.json()
    assert job["status"] in ("queued", "running") and job["target"] == fake_server.url
    events = sse_events((await client.get(f"/api/jobs/{job['id']}/events")).text)
    assert events[-1][0] == "end" and events[-1][1]["status"] == "completed"
    final = events[-1][1]
    assert final["progress"]["completed"] == 16 and final["points"][0]["failed"] == 0
    run = get_run(final["run_id"], db)
    assert (run.status, run.request_count, run.label) == ("completed", 16, "api run")

    sweep = {
        **body,
        "kind": "sweep",
        "label": "api sweep",
        "sweep": {"request_rates": [40, 80], "slo": "p99_ttft_ms<=5000", "slo_iterations": 1},
    }
    r = await client.post("/api/jobs", json=sweep, headers=AUTH)
    assert r.status_code == 202, r.text
    events = sse_events((await client.get(f"/api/jobs/{r.json()['id']}/events")).text)
    final = events[-1][1]
    assert final["status"] == "completed" and [p["title"] for p in final["points"]][:2] == [
        "rate 40 req/s",
        "rate 80 req/s",
    ]
    run = get_run(final["run_id"], db)
    assert len(run.load_points) == len(final["points"]) and run.extra_json["sweep"]["slo"]
    listed = (await client.get("/api/jobs")).json()
    assert [j["label"] for j in listed][:2] == ["api sweep", "api run"]
    for rid in (final["run_id"], events[0][1]["run_id"]):
        if rid:
            await client.delete(f"/api/runs/{rid}", headers=AUTH)


@pytest.mark.slow
async def test_cancel_stops_gently_and_keeps_the_data(client, server_factory, db):
    slow = server_factory("--ttft-ms", "20", "--itl-ms", "50")
    body = {
        "kind": "run",
        "scenario": FAST_SCENARIO.replace("num_prompts: 16", "num_prompts: 400").replace(
            "request_rate: 80", "request_rate: 20"
        ),
        "target": {"base_url": slow.url},
        "label": "to cancel",
    }
    job = (await client.post("/api/jobs", json=body, headers=AUTH)).json()
    for _ in range(600):  # until some requests finished (the job's process starts first)
        state = (await client.get(f"/api/jobs/{job['id']}")).json()
        if state["progress"] and state["progress"]["completed"] >= 5:
            break
        time.sleep(0.05)
    r = await client.post(f"/api/jobs/{job['id']}/cancel", headers=AUTH)
    assert r.status_code == 200 and r.json()["cancel_requested"]
    events = sse_events((await client.get(f"/api/jobs/{job['id']}/events")).text)
    final = events[-1][1]
    assert final["status"] == "cancelled"
    run = get_run(final["run_id"], db)
    assert run.status == "interrupted" and 5 <= run.request_count < 400
    assert (await client.get("/api/jobs/nope")).status_code == 404
    await client.delete(f"/api/runs/{run.id}", headers=AUTH)


@pytest.mark.slow
async def test_a_simulation_job_runs_in_virtual_time_and_can_be_cancelled(client, db):
    """`simulate` jobs run in virtual time, as `sim run` does, through the same chooser of
    executors; a cancel stops the point in flight at once and keeps what it measured."""
    simulate = {"gpu": "H100-SXM", "model": "llama-3.1-8b", "tp": 1}
    body = {"kind": "run", "scenario": FAST_SCENARIO, "simulate": simulate, "label": "v run"}
    r = await client.post("/api/jobs", json=body, headers=AUTH)
    assert r.status_code == 202, r.text
    final = sse_events((await client.get(f"/api/jobs/{r.json()['id']}/events")).text)[-1][1]
    assert final["status"] == "completed" and final["points"][0]["failed"] == 0
    run = get_run(final["run_id"], db)
    assert (run.status, run.request_count, run.simulated) == ("completed", 16, True)
    assert run.endpoint == "sim://virtual" and run.extra_json["sim"]["clock"] == "virtual"
    assert (run.gpu_type, run.gpu_count, run.label) == ("H100-SXM", 1, "v run")
    first_run = run.id

    rates = list(range(1, 17))  # 600 virtual seconds each: far longer than a cancel takes
    sweep = {**body, "kind": "sweep", "sweep": {"request_rates": rates, "point_duration_s": 600}}
    job = (await client.post("/api/jobs", json=sweep, headers=AUTH)).json()
    for _ in range(2400):  # until its first point is done (the job's process starts first)
        state = (await client.get(f"/api/jobs/{job['id']}")).json()
        if state["points"] or state["status"] in ("completed", "failed"):
            break
        time.sleep(0.05)
    r = await client.post(f"/api/jobs/{job['id']}/cancel", headers=AUTH)
    assert r.status_code == 200 and r.json()["cancel_requested"]
    final = sse_events((await client.get(f"/api/jobs/{job['id']}/events")).text)[-1][1]
    assert final["status"] == "cancelled", final
    run = get_run(final["run_id"], db)
    assert run.status == "interrupted" and 1 <= len(run.load_points) < len(rates)
    assert run.request_count >= 600  # the first point's requests are kept
    for rid in (first_run, run.id):
        assert (await client.delete(f"/api/runs/{rid}", headers=AUTH)).status_code == 200


async def test_export_download_from_the_compare_page(client, db):
    from io import BytesIO

    from pptx import Presentation

    runs = [r.id for r in list_runs(db, gpu="b200")] + [r.id for r in list_runs(db, gpu="h100")]
    query = "&".join(f"run={r}" for r in runs)
    page = await client.get(f"/compare?{query}")
    assert page.status_code == 200 and "/api/export?" in page.text
    r = await client.get(f"/api/export?{query}&format=pptx")
    assert r.status_code == 200
    assert r.headers["content-disposition"].startswith("attachment;")
    deck = Presentation(BytesIO(r.content))
    assert len(deck.slides) >= 6
    x = await client.get(f"/api/export?{query}&format=xlsx")
    assert x.status_code == 200 and x.content[:2] == b"PK"
    bad = await client.get(f"/api/export?{query}&format=doc")
    assert bad.status_code == 422


async def test_compare_and_plan_answer_what_the_library_computes(client, db):
    from bench.cost import load_catalogue
    from bench.curves import compare_runs, resolve_slo
    from bench.plan import Demand, plan_capacity

    # The module's two stored sweeps (other tests add runs of their own).
    by_name = {r.name: r.id for r in list_runs(db)}
    ids = [by_name["synthetic-B200-SXM"], by_name["synthetic-H100-SXM"]]
    query = "&".join(f"run={i}" for i in ids)
    comp = (await client.get(f"/api/compare?{query}&slo=ttft:150")).json()
    lib = compare_runs(run_curves(ids, db), resolve_slo("ttft:150", [])[0], load_catalogue())
    assert comp["slo"] == ["p99_ttft_ms<=150"] and comp["slo_source"] == "given"
    assert [c.at_slo.kind for c in lib] == ["at_least", "interpolated"]
    assert comp["ratio"]["bound"] == "at least" and comp["ratio"]["value"] == pytest.approx(
        lib[0].at_slo.value / lib[1].at_slo.value
    )
    for got, want in zip(comp["runs"], lib, strict=True):
        assert got["at_slo"]["kind"] == want.at_slo.kind
        assert got["at_slo"]["output_tps_per_gpu"] == pytest.approx(want.at_slo.value)
        assert got["at_slo"]["flags"] == want.at_slo.flags
    r = await client.get(f"/api/plan?{query}&requests_per_s=12&peak_factor=2&slo=ttft:150")
    assert r.status_code == 200, r.text
    plan = r.json()
    want = plan_capacity(lib, Demand(requests_per_s=12, peak_factor=2), load_catalogue())
    assert [s["gpus"] for s in plan["systems"]] == [s.gpus for s in want.systems]
    assert plan["sentence"] == want.sentence and plan["assumptions"] == want.assumptions
    both = await client.get(f"/api/plan?{query}&requests_per_s=1&tokens_per_day=5")
    assert both.status_code == 422 and field_of(both) == [["query", "tokens_per_day"]]
    # Without an SLO, the one stored with the runs (as the CLI and the exports do).
    stored = (await client.get(f"/api/compare?{query}")).json()
    assert stored["slo"] == ["p99_ttft_ms<=400"] and stored["slo_source"] == "stored with the runs"
