"""Traffic classes (issue 29 item 5) and speculative decoding measured (item 6)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from bench.metrics import Threshold, parse_slo, summarize, with_error_bound
from bench.records import RequestRecord
from bench.scenario import ScenarioError, load_scenario, parse_scenario
from tests.conftest import start_fake_server

ROOT = Path(__file__).resolve().parents[1]
MIX = ROOT / "scenarios" / "chat-agent-mix.yaml"


def tokenbench(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "bench", *args], capture_output=True, text=True, timeout=180,
        env={**os.environ, "COLUMNS": "250", "PYTHONPATH": str(ROOT)}, cwd=ROOT,
    )  # fmt: skip


def invoke(*args: str):
    """The CLI in this process (no subprocess: the fast subset starts none), with
    `returncode`, `stdout` and `stderr` as tokenbench() gives them."""
    from types import SimpleNamespace

    from typer.testing import CliRunner

    from bench.cli import app

    res = CliRunner().invoke(app, list(args), env={"COLUMNS": "250"})
    return SimpleNamespace(returncode=res.exit_code, stdout=res.output, stderr=repr(res.exception))


def test_shipped_mix_gives_each_request_a_class_with_its_own_lengths():
    sc = load_scenario(MIX)
    assert sc.class_shares() == pytest.approx({"chat": 2 / 3, "agent": 1 / 3})
    specs = sc.workload_plan().specs(300)
    names = [s.traffic_class for s in specs]
    assert set(names) == {"chat", "agent"}
    assert 0.5 < names.count("chat") / len(names) < 0.8
    mean_in = {n: sum(s.input_len for s in specs if s.traffic_class == n) / names.count(n)
               for n in ("chat", "agent")}  # fmt: skip
    assert mean_in["agent"] > 5 * mean_in["chat"]
    slo = [str(t) for t in sc.capacity_slo()]
    assert "chat:p99_ttft_ms<=500" in slo and "agent:p99_ttft_ms<=3000" in slo


def test_class_errors_name_the_field():
    base = "classes:\n  - {name: chat, share: 1}\n  - {name: chat, share: 2}\n"
    with pytest.raises(ScenarioError, match="names must differ"):
        parse_scenario(base)
    with pytest.raises(ScenarioError, match="share or its request_rate"):
        parse_scenario("classes:\n  - {name: chat}\n")
    with pytest.raises(ScenarioError, match="classes.0.slo"):
        parse_scenario("classes:\n  - {name: chat, share: 1, slo: 'p99_bogus_ms<=1'}\n")
    rates = parse_scenario(
        "classes:\n  - {name: a, request_rate: 2}\n  - {name: b, request_rate: 6}\n"
    )
    assert rates.load.request_rate == 8 and rates.class_shares() == {"a": 0.25, "b": 0.75}


def test_class_scoped_slo_reads_that_class_and_bounds_its_errors():
    def rec(i: int, cls: str, ttft_ms: float, ok: bool = True) -> RequestRecord:
        return RequestRecord(
            i, sent_ns=0, first_token_ns=int(ttft_ms * 1e6), end_ns=int(ttft_ms * 1e6) + 10**7,
            output_tokens=2, state="ok" if ok else "failed", traffic_class=cls,
        )  # fmt: skip

    records = [rec(i, "chat", 100) for i in range(10)] + [
        rec(10 + i, "agent", 900) for i in range(10)
    ]
    records.append(rec(99, "agent", 0, ok=False))
    s = summarize(records)
    assert s.value("chat:p50_ttft_ms") == pytest.approx(100)
    assert s.value("agent:p50_ttft_ms") == pytest.approx(900)
    assert s.value("agent:error_rate") == pytest.approx(1 / 11)
    assert s.value("batch:p99_ttft_ms") is None
    slo = parse_slo("chat:p99_ttft_ms<=500,agent:p99_ttft_ms<=1000")
    assert Threshold("agent:error_rate", "<=", 0.05) in with_error_bound(slo)
    assert set(s.to_json()["classes"]) == {"chat", "agent"}
    with pytest.raises(ValueError, match="traffic class name"):
        parse_slo("9x:p99_ttft_ms<=1")


def test_capacity_is_where_the_first_class_breaks_its_own_slo_and_names_it():
    from bench.curves import RunCurve, capacity_at_slo, point_from_summary

    def point(rate: float) -> object:
        recs = []
        for i in range(200):  # chat is flat; agent's TTFT grows with the load
            cls, ttft_ms = ("chat", 100.0) if i % 2 else ("agent", 400.0 * rate)
            recs.append(
                RequestRecord(
                    i, sent_ns=i * 10**6, first_token_ns=i * 10**6 + int(ttft_ms * 1e6),
                    end_ns=i * 10**6 + int(ttft_ms * 1e6) + 10**8, output_tokens=10,
                    traffic_class=cls,
                )
            )  # fmt: skip
        doc = summarize(recs, duration_s=200 / rate).to_json()
        p = point_from_summary(doc, load_point=0, title=f"rate {rate:g}", offered=rate, gpus=1)
        p.offered_kind = "rate"
        return p

    curve = RunCurve("r", "r", "r", "B200", 1, None, False, None, "completed")
    curve.points = [point(r) for r in (1, 2, 4, 8)]
    slo = parse_slo("chat:p99_ttft_ms<=500,agent:p99_ttft_ms<=2000")
    cap = capacity_at_slo(curve, slo)
    assert cap.kind == "interpolated" and cap.binding == "agent"
    assert cap.last_pass.title == "rate 4" and cap.first_fail.title == "rate 8"
    assert "class agent binds" in cap.text()
    # a run-wide threshold that breaks first binds no class
    wide = capacity_at_slo(curve, parse_slo("p99_ttft_ms<=1000,agent:p99_ttft_ms<=3000"))
    assert wide.binding is None


@pytest.mark.slow
def test_mixed_sweep_in_virtual_time_names_the_binding_class_and_stores_classes(tmp_path):
    db = f"sqlite:///{tmp_path / 'mix.db'}"
    out = tmp_path / "summary.json"
    proc = tokenbench(
        "sim", "run", "--scenario", str(MIX), "--num-prompts", "120", "--request-rates",
        "0.2,8", "--slo-iterations", "2", "--slo-draws", "0", "--db", db,
        "--summary-json", str(out),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "binds" in proc.stdout, proc.stdout
    from bench.store import get_run, list_runs, load_records

    (run,) = list_runs(db)
    records = load_records(run.id, 0, db)
    assert {r.traffic_class for r in records} == {"chat", "agent"}
    shown = tokenbench("show", run.id, "--db", db)
    assert shown.returncode == 0 and "own SLO" in shown.stdout and "agent" in shown.stdout
    planned = tokenbench("plan", run.id, "--mix", "chat=10,agent=10", "--db", db)
    assert planned.returncode == 0 and "chat 10, agent 10" in planned.stdout, planned.stdout
    assert get_run(run.id, db).extra_json["sweep"]["slo"]


@pytest.mark.slow
def test_spec_decode_acceptance_equals_the_counters(tmp_path):
    server = start_fake_server("--ttft-ms", "5", "--itl-ms", "2", "--spec-decode", "3:2,1,3,0")
    try:
        url = f"http://127.0.0.1:{server.port}"
        out, db = tmp_path / "s.json", f"sqlite:///{tmp_path / 'spec.db'}"
        proc = tokenbench(
            "run", "--base-url", url, "--random-input-len", "16", "--random-output-len", "9",
            "--num-prompts", "12", "--request-rate", "40", "--db", db,
            "--metrics-interval", "0.2", "--summary-json", str(out),
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        with urllib.request.urlopen(f"{url}/metrics", timeout=5) as resp:
            text = resp.read().decode()
    finally:
        server.stop()
    truth = {}
    for line in text.splitlines():
        name, value = line.rsplit(" ", 1)
        truth[name] = float(value)

    def total(prefix: str) -> float:
        return sum(v for k, v in truth.items() if k.startswith(prefix))

    drafts = total("vllm:spec_decode_num_drafts_total")
    accepted = total("vllm:spec_decode_num_accepted_tokens_total")
    drafted = total("vllm:spec_decode_num_draft_tokens_total")
    assert drafts > 0
    spec = json.loads(out.read_text())["spec_decode"]
    assert spec["acceptance_rate"] == pytest.approx(accepted / drafted)
    assert spec["mean_acceptance_length"] == pytest.approx(1 + accepted / drafts)
    first = total(
        'vllm:spec_decode_num_accepted_tokens_per_pos_total{model_name="fake-model",engine="0",position="0"}'
    )
    assert spec["per_position"][0] == pytest.approx(first / drafts)
    assert "Draft acceptance" in proc.stdout
    shown = tokenbench("show", json.loads(out.read_text())["run_id"], "--db", db)
    assert f"Draft acceptance rate (server counters): {accepted / drafted:.1%}" in shown.stdout


@pytest.mark.slow
def test_simulated_server_with_mtp_exposes_counters_that_match_its_model(tmp_path):
    """End to end: `sim serve --mtp 2 --mtp-acceptance 0.7` serves vLLM's spec-decode
    counters; a run against it reports the acceptance its model assumed."""
    import re
    import time

    proc = subprocess.Popen(
        [sys.executable, "-m", "bench", "sim", "serve", "--gpu", "B200", "--model",
         "llama-3.1-8b", "--mtp", "2", "--mtp-acceptance", "0.7", "--port", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT,
        env={**os.environ, "COLUMNS": "400", "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    try:
        deadline, url = time.monotonic() + 60, None
        while url is None and time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            found = re.search(r"http://127\.0\.0\.1:(\d+)/v1", line)
            url = f"http://127.0.0.1:{found.group(1)}" if found else None
        assert url, "the simulated server did not start"
        out = tmp_path / "s.json"
        run = tokenbench(
            "run", "--base-url", url, "--random-input-len", "64", "--random-output-len", "32",
            "--num-prompts", "20", "--request-rate", "20", "--db",
            f"sqlite:///{tmp_path / 'sim.db'}", "--metrics-interval", "0.2",
            "--summary-json", str(out),
        )  # fmt: skip
        assert run.returncode == 0, run.stderr
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    spec = json.loads(out.read_text())["spec_decode"]
    sim = spec["simulated"]
    assert sim["mtp_acceptance"] == 0.7 and sim["mtp_tokens"] == 2
    assert spec["per_position"] == pytest.approx([0.7, 0.49], rel=1e-4)
    assert spec["acceptance_rate"] == pytest.approx((0.7 + 0.49) / 2, rel=1e-4)
    assert spec["mean_acceptance_length"] == pytest.approx(sim["mean_acceptance_length"], rel=1e-4)


def test_batches_and_databases_from_before_schema_0003_still_read(tmp_path, monkeypatch):
    from alembic import command
    from sqlalchemy import create_engine, inspect

    from bench.store import codec
    from bench.store.migrations import alembic_config, current_revision, upgrade

    records = [RequestRecord(i, traffic_class="agent" if i % 2 else None) for i in range(4)]
    with monkeypatch.context() as m:  # a batch written before the class column existed ...
        m.setattr(codec, "STR_FIELDS", tuple(f for f in codec.STR_FIELDS if f != "traffic_class"))
        m.setattr(codec, "SQL_COLUMNS", tuple(c for c in codec.SQL_COLUMNS if c != "traffic_class"))
        old_blob, _ = codec.encode_batch(records)
    new_blob, rows = codec.encode_batch(records)
    # ... decodes beside a new one: the old rows have no class, the new ones keep theirs.
    d = codec.decode_batches([(0, old_blob), (1, new_blob)])
    assert d.text("traffic_class").tolist() == [None] * 4 + [None, "agent", None, "agent"]
    assert rows[1][codec.SQL_COLUMNS.index("traffic_class")] == "agent"
    # A database at revision 0002 upgrades with the column added and its rows kept.
    engine = create_engine(f"sqlite:///{tmp_path / 'old.db'}")
    config = alembic_config()
    with engine.begin() as conn:
        config.attributes["connection"] = conn
        command.upgrade(config, "0002")
    assert current_revision(engine) == "0002"
    with engine.begin() as conn:
        conn.exec_driver_sql(
            "INSERT INTO runs (id, created_at, status, simulated, request_count) "
            "VALUES ('r1', '2026-01-01 00:00:00', 'completed', 0, 1)"
        )
        conn.exec_driver_sql(
            "INSERT INTO requests (run_id, load_point, request_index, turn, intended_ns, "
            "sent_ns, n_chunks, state) VALUES ('r1', 0, 0, 0, 0, 5, 3, 'ok')"
        )
    assert upgrade(engine) == "0003"
    assert "traffic_class" in {c["name"] for c in inspect(engine).get_columns("requests")}
    with engine.connect() as conn:
        kept = conn.exec_driver_sql("SELECT sent_ns, n_chunks, traffic_class FROM requests").all()
    assert kept == [(5, 3, None)]
    engine.dispose()


@pytest.mark.slow
def test_a_mix_against_a_real_endpoint_reports_each_class(fake_server, tmp_path):
    out = tmp_path / "s.json"
    proc = tokenbench(
        "run", "--scenario", str(MIX), "--base-url", f"http://127.0.0.1:{fake_server.port}",
        "--num-prompts", "24", "--request-rate", "30", "--no-store", "--no-scrape-metrics",
        "--summary-json", str(out),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(out.read_text())
    classes = doc["classes"]
    assert set(classes) == {"chat", "agent"}
    assert classes["chat"]["completed"] + classes["agent"]["completed"] == doc["completed"]
    assert "Per traffic class" in proc.stdout and "own SLO" in proc.stdout


def _prefix_hits(prompts: list[list[str]], block: int = 16) -> tuple[int, int]:
    """(prompt tokens whose whole prefix up to their block's end an earlier prompt had,
    prompt tokens): an infinite prefix cache counted with plain tuples, no hashing chain."""
    seen: set[tuple] = set()
    hit = total = 0
    for words in prompts:
        total += len(words)
        for end in range(block, len(words) + 1, block):
            prefix = tuple(words[:end])
            hit += block if prefix in seen else 0
            seen.add(prefix)
    return hit, total


@pytest.fixture(scope="module")
def mixed_run(tmp_path_factory):
    """A stored two-point simulated sweep of the shipped chat+agent mix (fixed seed: both
    points send the same prompts): (db, run id, summary JSON of the sweep). 6 req/s is past
    what one B200 holds for the mix (agent's p99 TPOT about 90 ms against its 50), so a class
    binds; at 4 req/s both classes met their SLOs once the decode steps [S84] joined the fit."""
    from bench.store import list_runs

    folder = tmp_path_factory.mktemp("mix")
    db = f"sqlite:///{folder / 'mix.db'}"
    out = folder / "summary.json"
    proc = invoke(
        "sim", "run", "--gpu", "B200", "--scenario", str(MIX), "--num-prompts", "45",
        "--request-rates", "0.5,6", "--seed", "7", "--slo-iterations", "0", "--slo-draws", "0",
        "--db", db, "--summary-json", str(out),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    (run,) = list_runs(db)
    return db, run.id, json.loads(out.read_text())


def _expected_class_cache(db: str, run_id: str, load_point: int) -> dict[str, dict]:
    """Per class: (cached, prompt) tokens from its stored records' usage, and (hit, total)
    from its own prompts rendered again and counted with plain tuples."""
    from bench.store import load_records
    from bench.workload import prompt_words

    records = load_records(run_id, load_point, db)
    sc = load_scenario(MIX)
    sc.seed = 7
    wl = sc.workload_plan()
    specs = wl.specs(45)
    assert [s.traffic_class for s in specs] == [r.traffic_class for r in records]
    out = {}
    for name in ("chat", "agent"):
        mine = [r for r in records if r.traffic_class == name]
        words = [prompt_words(wl, s, chat=False) for s in specs if s.traffic_class == name]
        out[name] = {
            "usage": (
                sum(r.cached_prompt_tokens for r in mine),
                sum(r.prompt_tokens for r in mine),
            ),
            "intended": _prefix_hits(words),
        }
    return out


def test_hit_rates_per_class_equal_an_independent_count_over_the_records(mixed_run):
    """Each class's intended hit rate is what its own prompts imply (counted again here from
    the scenario's prompts), and its served one what its own records' usage says."""
    db, run_id, doc = mixed_run
    for k, point in enumerate(doc["points"]):
        want = _expected_class_cache(db, run_id, k)
        for name in ("chat", "agent"):
            own = point["classes"][name]["prompt_cache"]
            cached, prompt = want[name]["usage"]
            assert own["usage"]["cached_tokens"] == cached
            assert own["usage"]["share"] == pytest.approx(cached / prompt)
            hit, total = want[name]["intended"]
            assert (own["intended"]["cached_tokens"], own["intended"]["prompt_tokens"]) == (
                hit,
                total,
            )
            assert "server" not in own  # both classes shared the server: its counters are neither's
        assert point["classes"]["chat"]["prompt_cache"]["intended"]["share"] == 0.0  # random
        assert point["classes"]["agent"]["prompt_cache"]["intended"]["share"] > 0.3  # 70% shared
    shown = invoke("show", run_id, "--db", db)
    assert "intended / served / server" in shown.stdout, shown.stdout
    agent = doc["points"][0]["classes"]["agent"]["prompt_cache"]
    row = next(line for line in shown.stdout.splitlines() if line.strip("│ ").startswith("agent"))
    assert f"{agent['intended']['share']:.1%} / {agent['usage']['share']:.1%} / —" in row


def test_api_and_run_page_show_each_class_with_its_verdict_and_hit_rates(mixed_run):
    from fastapi.testclient import TestClient

    from server.app import create_app

    db, run_id, doc = mixed_run
    app = create_app(
        db, api_token="t", allow_hosts=[], open_reads=True, server_names=["testserver"]
    )
    try:
        with TestClient(app) as client:
            got = client.get(f"/api/runs/{run_id}/classes").json()
            detail = client.get(f"/api/runs/{run_id}").json()
            page = client.get(f"/runs/{run_id}").text
            planned = client.get(f"/api/plan?run={run_id}&mix=chat=10,agent=5").json()
            both = client.get(f"/api/plan?run={run_id}&mix=chat=10&requests_per_s=3")
    finally:
        app.state.tb.jobs.shutdown()
    assert got["slo"] == ["chat:p99_ttft_ms<=500", "chat:p99_tpot_ms<=50",
                          "agent:p99_ttft_ms<=3000", "agent:p99_tpot_ms<=50"]  # fmt: skip
    assert got["binding_class"] in ("chat", "agent")
    assert f"class {got['binding_class']} binds" in got["capacity"]["text"]
    assert [(r["load_point"], r["traffic_class"]) for r in got["rows"]] == [
        (0, "agent"), (0, "chat"), (1, "agent"), (1, "chat")
    ]  # fmt: skip
    for r in got["rows"]:
        want = _expected_class_cache(db, run_id, r["load_point"])[r["traffic_class"]]
        hit, total = want["intended"]
        cached, prompt = want["usage"]
        assert r["prompt_cache"]["intended"] == pytest.approx(hit / total)
        assert r["prompt_cache"]["usage"] == pytest.approx(cached / prompt)
        assert r["prompt_cache"]["server"] is None
        stored = doc["points"][r["load_point"]]["classes"][r["traffic_class"]]
        assert r["completed"] == stored["completed"]
        p99 = stored["metrics"]["ttft_ms"]["p99"]
        assert r["p99_ttft_ms"] == pytest.approx(p99)
        limit = 500 if r["traffic_class"] == "chat" else 3000
        if p99 > limit:
            assert r["meets_slo"] is False
    lp = detail["load_points"][0]["summary"]["classes"]
    assert set(lp) == {"chat", "agent"} and "intended" in lp["agent"]["prompt_cache"]
    assert 'id="classes-table"' in page
    assert f'id="binding-class">{got["binding_class"]}</strong>' in page
    agent0 = got["rows"][0]["prompt_cache"]["intended"]
    assert f"{agent0:.1%}" in page
    assert planned["demand"]["mix"] == {"chat": 10.0, "agent": 5.0}
    assert planned["demand"]["requests_per_s"] == 15.0
    assert both.status_code == 422 and both.json()["detail"][0]["loc"] == ["query", "mix"]


def test_deck_and_workbook_carry_the_per_class_table(mixed_run, tmp_path):
    import openpyxl
    from pptx import Presentation

    db, run_id, doc = mixed_run
    for fmt in ("pptx", "xlsx"):
        proc = invoke("export", run_id, "--format", fmt, "--out", str(tmp_path / f"r.{fmt}"),
                          "--db", db)  # fmt: skip
        assert proc.returncode == 0, proc.stderr
    ws = openpyxl.load_workbook(tmp_path / "r.xlsx")["classes"]
    rows = list(ws.iter_rows(values_only=True))
    head = list(rows[0])
    by = {(r[head.index("Load point")], r[head.index("Class")]): r for r in rows[1:] if r[6]}
    assert set(by) == {(1, "agent"), (1, "chat"), (2, "agent"), (2, "chat")}
    for (lp, name), r in by.items():
        own = doc["points"][lp - 1]["classes"][name]
        assert r[head.index("Completed")] == own["completed"]
        share = own["prompt_cache"]["intended"]["share"] * 100
        assert r[head.index("Cache hit intended")] == pytest.approx(share)
    texts = [
        shape.text_frame.text if shape.has_text_frame else
        " ".join(c.text for row in shape.table.rows for c in row.cells) if shape.has_table else ""
        for slide in Presentation(str(tmp_path / "r.pptx")).slides
        for shape in slide.shapes
    ]  # fmt: skip
    deck = "\n".join(texts)
    assert "Appendix: traffic classes" in deck
    share = doc["points"][0]["classes"]["agent"]["prompt_cache"]["intended"]["share"] * 100
    assert f"{share:.1f}%" in deck


def test_a_run_without_a_stored_sweep_slo_is_judged_by_its_scenarios_classes(mixed_run):
    """A single `run` stores no sweep SLO: each class's own SLO is read from the stored
    scenario's classes (re-parsing the stored scenario refuses a mix beside its default
    top-level workload, which left the own-SLO column empty)."""
    from types import SimpleNamespace

    from bench.curves import class_slo
    from bench.store import get_run

    db, run_id, _ = mixed_run
    info = get_run(run_id, db)
    single = SimpleNamespace(extra_json={}, scenario=info.scenario)
    assert [str(t) for t in class_slo(single)] == [
        "chat:p99_ttft_ms<=500", "chat:p99_tpot_ms<=50",
        "agent:p99_ttft_ms<=3000", "agent:p99_tpot_ms<=50",
    ]  # fmt: skip


def test_content_reuse_is_bounded_and_says_what_it_covers():
    from bench.blocks import ContentReuse

    prompt = [f"w{i}" for i in range(40)]  # two full 16-word blocks and a tail of 8
    reuse = ContentReuse(max_blocks=6)
    for _ in range(4):
        reuse.add(prompt)
    got = reuse.result()
    # first: 3 new blocks (its tail its own); second: 2 hits and a new tail; a third could
    # bring 3 more to the 4 kept, past 6
    assert (got["blocks"], got["blocks_seen_before"], got["cached_tokens"]) == (6, 2, 32)
    assert got["requests"] == 2 and "first 2 of 4 requests" in got["note"]
    unbounded = ContentReuse()
    for _ in range(4):
        unbounded.add(prompt)
    assert unbounded.result()["cached_tokens"] == 3 * 32 and "note" not in unbounded.result()
