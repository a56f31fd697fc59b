"""Secrets scrubbed by structure: a stored scenario always parses back, old damage is repaired."""

from __future__ import annotations

import json

import httpx
import pytest
import yaml
from sqlalchemy import update

from bench.curves import run_curve
from bench.export.report import build_report
from bench.store import RunWriter, get_engine, get_run
from bench.store.engine import dispose_all
from bench.store.models import Run
from bench.store.redact import Redactor, repair_scenario_text, scenario_mapping
from tests.test_store_helpers import make_records

KEY = "sk-live-0123456789abcdef"

SCENARIO = {
    "name": "redaction",
    "label": "h100 token=fast",
    "description": "api_key: lives in env; password: none here",
    "target": {
        "base_url": f"http://bob:{KEY}@127.0.0.1:8000/v1?api_key={KEY}&model=m",
        "api_key_env": "OPENAI_API_KEY",
        "headers": {"Authorization": f"Bearer {KEY}"},
    },
    "percentiles": [50, 99],
    "workload": {"max_tokens": 128},
}


@pytest.fixture
def db(tmp_path):
    yield str(tmp_path / "r.db")
    dispose_all()


def store(db, scenario, **meta) -> str:
    writer = RunWriter(db, scenario=scenario, secrets=[KEY], **meta)
    writer.start_load_point(0, target_rate=1.0, started_ns=0)
    for r in make_records(20):
        r.intended_ns = max(r.intended_ns, 0)  # the run page's time series starts at 0
        writer.submit(r)
    writer.finish("completed")
    return writer.run_id


def test_structured_scenario_is_scrubbed_and_parses_back(db):
    run_id = store(db, SCENARIO, name="redaction", label="h100 token=fast")
    info = get_run(run_id, db)
    parsed = json.loads(info.scenario_text)  # strict JSON: no eaten quote
    assert parsed["label"] == "h100 token=fast" and info.label == "h100 token=fast"
    assert parsed["description"] == SCENARIO["description"]
    assert parsed["target"]["base_url"] == "http://***@127.0.0.1:8000/v1?api_key=***&model=m"
    assert parsed["target"]["headers"]["Authorization"] == "***"
    assert parsed["target"]["api_key_env"] == "OPENAI_API_KEY"
    assert parsed["workload"]["max_tokens"] == 128 and parsed["percentiles"] == [50, 99]
    assert KEY not in info.scenario_text
    curve = run_curve(run_id, db)  # reads the scenario's percentiles back
    point = curve.points[0]
    assert point.latency("ttft", "p99") is not None and point.latency("ttft", "p90") is None


def test_text_scenario_keeps_its_layout_when_that_parses():
    text = f"# my scenario\nname: t\nlabel: h100 token=fast\napi_key: {KEY}\n"
    out = Redactor([KEY]).scenario(text)
    assert out.startswith("# my scenario\n") and KEY not in out
    assert yaml.safe_load(out) == {"name": "t", "label": "h100 token=fast", "api_key": "***"}


@pytest.mark.parametrize(
    "text",
    [
        '{"label": "a token=b\\"c", "k": 1}',
        "label: 'x password: y'\nurl: http://u:pw@h/x?sig=1\n",
        "- token: abc\n- {secret: 'q'}\n",
        "just words token=abc and more",
    ],
)
def test_any_scenario_text_parses_back_after_scrubbing(text):
    out = Redactor().scenario(text)
    try:
        before = yaml.safe_load(text)
    except yaml.YAMLError:
        before = None
    if isinstance(before, dict | list):
        assert yaml.safe_load(out) is not None


# What the old pattern redaction stored for `--label 'h100 token=fast'` and an api_key field.
DAMAGED = """{
  "name": "old",
  "label": "h100 token=***,
  "target": {
    "base_url": "http://127.0.0.1:8000/v1",
    "api_key": ***
  },
  "percentiles": [50, 90, 99]
}"""


def test_damaged_runs_are_repaired_at_read_time(db, tmp_path):
    run_id = store(db, {"name": "old"}, name="old")
    with get_engine(db).begin() as conn:
        conn.execute(update(Run).where(Run.id == run_id).values(scenario_text=DAMAGED))
    with pytest.raises(yaml.YAMLError):
        yaml.safe_load(DAMAGED)
    info = get_run(run_id, db)
    fixed = json.loads(info.scenario_text)
    assert fixed["label"] == "h100 token=***" and fixed["target"]["api_key"] == "***"
    assert run_curve(run_id, db).points[0].latency("ttft", "p90") is not None
    report = build_report([run_id], db, None, None, 1.0)
    assert report is not None


def test_unrepairable_scenario_reads_as_empty_not_an_error():
    assert scenario_mapping('{"a": "b\n  c: [') == {}
    assert repair_scenario_text("name: ok\n") == "name: ok\n"


async def test_damaged_run_serves_every_endpoint(db):
    from server.app import create_app

    run_id = store(db, {"name": "old"}, name="old")
    with get_engine(db).begin() as conn:
        conn.execute(update(Run).where(Run.id == run_id).values(scenario_text=DAMAGED))
    app = create_app(db, api_token="t" * 12, allow_hosts=[], open_reads=True)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as c:
        for path in (
            f"/api/runs/{run_id}",
            f"/api/curves?run={run_id}",
            f"/api/compare?run={run_id}",
            f"/api/costs?run={run_id}",
            f"/api/export?run={run_id}&format=html",
            f"/runs/{run_id}",
        ):
            r = await c.get(path)
            assert r.status_code == 200, (path, r.text[:300])
    app.state.tb.jobs.shutdown()
