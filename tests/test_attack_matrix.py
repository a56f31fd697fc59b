"""Fault and attack matrix against `tokenbench serve`: what was sent, what came back, what
was stored, what leaked. Traffic goes only to 127.0.0.1 (ASGI in-process, or local servers).

Each row is an attack or a fault the service once failed (issue 18): files of the service
host read through a scenario, credentials shown to readers, a run deleted under a job,
bodies read before authentication, DNS rebinding, an overflowing ?after=. And those of
issue 28 (F1-F9 and the partials), each with the count of records lost (0): hostile
endpoints (tests/hostile_server.py: TLS never finished, comments forever, an endless line,
endless tokens, [DONE] held open, 1xx interim responses, lying usage), the tokenizer
outside the data folder, formula labels in CSV/XLSX, a database deleted or made read-only
mid-run, a PostgreSQL outage, the upstream key sent to a chosen target, jobs that lie or
never end, rm asking before refusing, innerHTML, readers slowing a job.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import threading
import time
from pathlib import Path

import httpx
import pytest

from bench.metrics import summarize
from bench.records import (
    COUNT_CHUNKS,
    ERR_OVERSIZED,
    ERR_PROTOCOL,
    ERR_TIMEOUT_HEADERS,
    ERR_TIMEOUT_TLS,
)
from bench.runner import run_blocking
from bench.store import list_runs
from bench.store.engine import dispose_all
from bench.store.importers import import_file
from bench.store.raw_export import export_raw
from bench.store.read import get_run, load_records
from server.app import create_app
from tests.helpers import plan, store_sweep
from tests.hostile_server import HostileServer, rss_bytes, wait_until
from tests.test_store_helpers import pg_url  # noqa: F401

TOKEN = "matrix-token-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
SHADOW_LINE = "root:$6$SHADOWHASHxyz:19000:0:99999:7:::"
ENV_KEY = "sk-envleak-abcdef123456"
SECRET_COLUMN = "SECRETCOLUMNxyz"
SIM = {"gpu": "H100-SXM", "model": "llama-3.1-8b", "precision": "fp8", "tp": 1}


def trace_job(path: str) -> dict:
    scenario = f"load: {{shape: trace, num_prompts: 4, trace: {{path: '{path}'}}}}\n"
    return {"kind": "run", "scenario": scenario, "simulate": SIM}


def dataset_job(path: str) -> dict:
    scenario = f"workload: {{dataset: jsonl, dataset_path: '{path}'}}\nload: {{num_prompts: 4}}\n"
    return {"kind": "run", "scenario": scenario, "simulate": SIM}


@pytest.fixture(scope="module")
def host_files(tmp_path_factory) -> dict[str, Path]:
    """A host with secrets outside the data folder and hostile files inside it."""
    root = tmp_path_factory.mktemp("host")
    outside = root / "etc"
    outside.mkdir()
    (outside / "shadow").write_text(SHADOW_LINE + "\n")
    data = root / "data"
    data.mkdir()
    (data / ".env").write_text(f"OPENAI_API_KEY={ENV_KEY}\n")
    (data / "bad.csv").write_text(f"{SECRET_COLUMN},other\n1,2\n")
    (data / "big.csv").write_text("timestamp\n" + "1.0\n" * 2000)
    (data / "good.csv").write_text("timestamp\n0.0\n0.1\n0.2\n0.3\n")
    (data / "link.csv").symlink_to(outside / "shadow")
    os.mkfifo(data / "fifo.jsonl")
    (data / "tok").mkdir()
    _tiny_tokenizer().save(str(data / "tok" / "tokenizer.json"))
    db = f"sqlite:///{root / 'runs.db'}"
    store_sweep(db, gpu="H100-SXM", per_point=5)
    return {"root": root, "data": data, "shadow": outside / "shadow", "db": db}


def _tiny_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    from bench.workload import _WORDS

    tok = Tokenizer(models.BPE(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=["[UNK]"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(
        [" ".join(_WORDS[i : i + 12]) for i in range(0, len(_WORDS), 3)], trainer
    )
    return tok


def tokenizer_job(path: str) -> dict:
    scenario = f"workload: {{tokenizer: '{path}'}}\nload: {{num_prompts: 4}}\n"
    return {"kind": "run", "scenario": scenario, "simulate": SIM}


@pytest.fixture
async def client(host_files):
    app = create_app(
        host_files["db"],
        api_token=TOKEN,
        allow_hosts=[],
        open_reads=True,
        data_dir=host_files["data"],
        max_data_file_mb=4096 / 2**20,  # 4 KiB: big.csv is over
    )
    started = []
    app.state.tb.jobs._execute = lambda job: started.append(job) or "completed"
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1:8000") as c:
        c.app, c.started = app, started
        yield c
    app.state.tb.jobs.shutdown()
    dispose_all()


# (what was sent, expected status, text that must not come back)
FILE_ATTACKS = [
    ("trace at /etc/shadow (absolute, outside)", "shadow", 422, SHADOW_LINE),
    ("trace through ../ out of the folder", "../etc/shadow", 422, SHADOW_LINE),
    ("trace through a symlink in the folder", "link.csv", 422, SHADOW_LINE),
    ("trace at a .env in the folder", ".env", 422, ENV_KEY),
    ("trace whose header is a secret", "bad.csv", 422, SECRET_COLUMN),
    ("trace over the size limit", "big.csv", 422, None),
]


@pytest.mark.parametrize(("attack", "path", "status", "secret"), FILE_ATTACKS)
async def test_scenario_files_are_confined(client, host_files, attack, path, status, secret):
    given = str(host_files["shadow"]) if path == "shadow" else path
    r = await client.post("/api/jobs", json=trace_job(given), headers=AUTH)
    assert r.status_code == status, (attack, r.text)
    if secret is not None:
        assert secret not in r.text and secret.split(":")[0] not in r.text.replace("root", ""), (
            attack,
            r.text,
        )
    assert client.started == []


# (attack, path given as workload.tokenizer, text that must not come back)
TOKENIZER_ATTACKS = [
    ("F3 tokenizer at a folder outside: its listing", "etc", "shadow"),
    ("F3 tokenizer at a file outside, absolute", "shadow", SHADOW_LINE),
    ("F3 tokenizer through ../ to a file outside", "../etc/shadow", SHADOW_LINE),
    ("F3 tokenizer through a symlink in the folder", "link.csv", SHADOW_LINE),
    ("F3 tokenizer at a folder inside without tokenizer.json", ".", ".env"),
]


@pytest.mark.parametrize(("attack", "path", "secret"), TOKENIZER_ATTACKS)
async def test_the_tokenizer_is_confined(client, host_files, attack, path, secret):
    given = {"etc": str(host_files["root"] / "etc"), "shadow": str(host_files["shadow"])}
    r = await client.post("/api/jobs", json=tokenizer_job(given.get(path, path)), headers=AUTH)
    assert r.status_code == 422, (attack, r.text)
    assert secret not in r.text, (attack, r.text)
    assert client.started == []


async def test_a_tokenizer_in_the_folder_is_used(host_files):
    app = create_app(
        host_files["db"], api_token=TOKEN, allow_hosts=[], open_reads=True,
        data_dir=host_files["data"], max_data_file_mb=1,
    )  # fmt: skip
    started = []
    app.state.tb.jobs._execute = lambda job: started.append(job) or "completed"
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as c:
        r = await c.post("/api/jobs", json=tokenizer_job("tok"), headers=AUTH)
        assert r.status_code == 202, r.text
        for _ in range(200):
            if started:
                break
            await asyncio.sleep(0.02)
    app.state.tb.jobs.shutdown()
    want = str(host_files["data"] / "tok" / "tokenizer.json")
    assert started[0].plan.scenario.workload.tokenizer == want


async def test_tokenizer_probing_outside_the_folder_learns_nothing(client, host_files):
    """F3: "not found" and "not a tokenizer" were an oracle for files outside the folder."""
    answers = []
    for path in (host_files["shadow"], host_files["root"] / "etc" / "no-such-file"):
        r = await client.post("/api/jobs", json=tokenizer_job(str(path)), headers=AUTH)
        assert r.status_code == 422
        answers.append(r.json()["detail"][0]["msg"].replace(str(path), "PATH"))
    assert answers[0] == answers[1]


async def test_file_probing_outside_the_folder_learns_nothing(client, host_files):
    """An existing and a missing file outside the folder get the same answer."""
    there = await client.post("/api/jobs", json=trace_job(str(host_files["shadow"])), headers=AUTH)
    missing = str(host_files["root"] / "etc" / "no-such-file")
    gone = await client.post("/api/jobs", json=trace_job(missing), headers=AUTH)
    assert there.status_code == gone.status_code == 422
    strip = lambda r, p: r.json()["detail"][0]["msg"].replace(p, "PATH")  # noqa: E731
    assert strip(there, str(host_files["shadow"])) == strip(gone, missing)


async def test_a_fifo_is_refused_without_blocking(client):
    t0 = time.monotonic()
    r = await asyncio.wait_for(
        client.post("/api/jobs", json=dataset_job("fifo.jsonl"), headers=AUTH), 20
    )
    assert r.status_code == 422 and "not a regular file" in r.text
    assert time.monotonic() - t0 < 10


async def test_uploads_land_in_the_folder_and_can_be_used(client, host_files):
    body = b"timestamp\n0.0\n0.5\n1.0\n1.5\n"
    r = await client.put("/api/data/up.csv", content=body)
    assert r.status_code == 401  # writes need the token
    r = await client.put("/api/data/up.csv", content=body, headers=AUTH)
    assert r.status_code == 201 and r.json() == {"name": "up.csv", "bytes": len(body)}
    assert (host_files["data"] / "up.csv").read_bytes() == body
    for bad in (".hidden", "a%2Fb"):
        r = await client.put(f"/api/data/{bad}", content=b"x", headers=AUTH)
        assert r.status_code in (404, 422), (bad, r.text)
    r = await client.put("/api/data/huge.csv", content=b"x" * 5000, headers=AUTH)
    assert r.status_code == 413 and not (host_files["data"] / "huge.csv").exists()
    names = [f["name"] for f in (await client.get("/api/data")).json()]
    assert "up.csv" in names and ".env" not in names and "fifo.jsonl" not in names
    r = await client.post("/api/jobs", json=trace_job("up.csv"), headers=AUTH)
    assert r.status_code == 202, r.text
    for _ in range(200):
        if client.started:
            break
        await asyncio.sleep(0.02)
    job = client.started[0]
    assert job.plan.scenario.load.trace.path == str(host_files["data"] / "up.csv")


async def test_without_a_data_folder_scenarios_read_no_files(host_files):
    app = create_app(host_files["db"], api_token=TOKEN, allow_hosts=[], open_reads=True)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as c:
        r = await c.post("/api/jobs", json=trace_job("good.csv"), headers=AUTH)
        assert r.status_code == 422 and "--data-dir" in r.text
        shipped = {"kind": "run", "scenario_name": "trace-replay", "simulate": SIM}
        app.state.tb.jobs._execute = lambda job: "completed"
        r = await c.post("/api/jobs", json=shipped, headers=AUTH)
        assert r.status_code == 202, r.text  # a shipped scenario's own files still read
    app.state.tb.jobs.shutdown()


# (what was sent, expected status): the front door, before any route runs
DOOR_ATTACKS = [
    ("rebound name in Host", "GET", "/api/runs", {"Host": "evil.example"}, None, 400),
    ("rebound name with port", "GET", "/runs", {"Host": "attacker.test:8000"}, None, 400),
    ("loopback name", "GET", "/api/runs", {"Host": "localhost:8000"}, None, 200),
    ("loopback name, trailing dot", "GET", "/api/runs", {"Host": "localhost."}, None, 200),
    ("IPv6 literal", "GET", "/api/runs", {"Host": "[::1]:8000"}, None, 200),
    ("write from a foreign Origin", "POST", "/api/jobs/x/cancel",
     {**AUTH, "Origin": "http://evil.example"}, None, 403),
    ("write from the null Origin", "POST", "/api/jobs/x/cancel",
     {**AUTH, "Origin": "null"}, None, 403),
    ("write from our own Origin", "POST", "/api/jobs/x/cancel",
     {**AUTH, "Origin": "http://127.0.0.1:8000"}, None, 404),
    ("unauthenticated non-JSON write", "POST", "/api/jobs", {}, b"not json at all", 401),
    ("unauthenticated oversized write", "POST", "/api/jobs", {}, b"x" * (2 << 20), 401),
    ("authenticated oversized write", "POST", "/api/jobs", AUTH, b"x" * (2 << 20), 413),
    ("oversized login form", "POST", "/login", {}, b"token=" + b"x" * (32 << 10), 413),
    ("write token in a cookie only", "POST", "/api/jobs/x/cancel",
     {"Cookie": f"tokenbench_token={TOKEN}"}, None, 401),
    ("write token in the query string", "POST", f"/api/jobs/x/cancel?token={TOKEN}",
     {}, None, 401),
    ("write token as Basic", "POST", "/api/jobs/x/cancel",
     {"Authorization": f"Basic {TOKEN}"}, None, 401),
    ("20-digit ?after=", "GET", "/api/runs/synthetic-H100-SXM/requests?after=" + "9" * 20,
     {}, None, 422),
]  # fmt: skip


@pytest.mark.parametrize(("attack", "method", "path", "headers", "body", "status"), DOOR_ATTACKS)
async def test_front_door(client, attack, method, path, headers, body, status):
    r = await client.request(method, path, headers=headers, content=body)
    assert r.status_code == status, (attack, r.text[:300])
    if status >= 400:
        assert "detail" in r.json()


# Targets a job may not send load to (the allow-list is loopback only here): 403, no load.
TARGET_ATTACKS = [
    "http://10.0.0.1:8000",
    "http://0x0a000001:8000",  # hex form of 10.0.0.1
    "http://167772161:8000",  # decimal form of 10.0.0.1
    "http://127.0.0.1@10.0.0.1:8000",  # userinfo that looks like loopback
    "http://10.0.0.1:8000#@127.0.0.1",
    "http://localhost.evil.example:8000",
    "http://[::ffff:10.0.0.1]:8000",
]


@pytest.mark.parametrize("url", TARGET_ATTACKS)
async def test_targets_outside_the_allow_list_are_refused(client, url):
    body = {"kind": "run", "scenario": "load: {num_prompts: 2}", "target": {"base_url": url}}
    r = await client.post("/api/jobs", json=body, headers=AUTH)
    # 403 by the allow-list, or 422 where the URL cannot be a base URL at all (a #fragment)
    assert r.status_code in (403, 422), (url, r.text)
    assert r.status_code == 403 or "base URL" in r.text
    assert client.started == []


async def _asgi_call(app, method: str, path: str, headers: dict, body_chunks: list[bytes]):
    """Call the app directly, counting how many body bytes it pulled from the client."""
    pulled = 0
    chunks = list(body_chunks)
    sent: list[dict] = []

    async def receive():
        nonlocal pulled
        if chunks:
            chunk = chunks.pop(0)
            pulled += len(chunk)
            return {"type": "http.request", "body": chunk, "more_body": bool(chunks)}
        return {"type": "http.disconnect"}

    async def send(message):
        sent.append(message)

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [(k.lower().encode(), v.encode()) for k, v in headers.items()],
        "client": ("127.0.0.1", 5555),
        "server": ("127.0.0.1", 8000),
    }
    await app(scope, receive, send)
    status = next(m["status"] for m in sent if m["type"] == "http.response.start")
    return status, pulled


async def test_no_body_byte_is_read_before_authentication(client):
    """4 x 100 MB unauthenticated POSTs once cost 1 GB of memory: now not one byte is read."""
    chunk = b"y" * (1 << 20)
    status, pulled = await _asgi_call(
        client.app,
        "POST",
        "/api/jobs",
        {"host": "127.0.0.1", "content-type": "application/json"},
        [chunk] * 100,
    )
    assert (status, pulled) == (401, 0)
    # authenticated but chunked (no Content-Length): cut off just past the 1 MiB cap
    status, pulled = await _asgi_call(
        client.app,
        "POST",
        "/api/jobs",
        {"host": "127.0.0.1", "authorization": AUTH["Authorization"]},
        [b"z" * (256 << 10)] * 400,
    )
    assert status == 413 and pulled <= (1 << 20) + (256 << 10)


# ---------------------------------------------------------------- real jobs, real processes


@pytest.fixture
async def live(tmp_path):
    db = f"sqlite:///{tmp_path / 'live.db'}"
    app = create_app(db, api_token=TOKEN, allow_hosts=[], open_reads=True)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as c:
        c.app, c.db = app, db
        yield c
    app.state.tb.jobs.shutdown()
    dispose_all()


async def wait_job(c, job_id: str, until, timeout_s: float = 90.0) -> dict:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        state = (await c.get(f"/api/jobs/{job_id}")).json()
        if until(state):
            return state
        await asyncio.sleep(0.1)
    raise AssertionError(f"job {job_id} never reached the state: {state}")


@pytest.mark.slow
async def test_credentials_never_reach_readers_or_storage(live, fake_server, tmp_path):
    """A target URL's password and ?api_key=: not in /api/jobs, the run, or export-raw."""
    password, key = "hunter2-pass-xyz", "qs-key-9876543210"
    port = fake_server.url.rsplit(":", 1)[1]
    url = f"http://bob:{password}@127.0.0.1:{port}?api_key={key}"
    scenario = (
        "load: {shape: poisson, request_rate: 50, num_prompts: 6}\nworkload: {output: {mean: 4}}\n"
    )
    # A key in the query string cannot reach the server (a base URL has none): refused,
    # and the refusal quotes neither secret.
    body = {"kind": "run", "scenario": scenario, "target": {"base_url": url}, "label": "creds"}
    r = await live.post("/api/jobs", json=body, headers=AUTH)
    assert r.status_code == 422 and "base URL" in r.text, r.text
    assert password not in r.text and key not in r.text
    body["target"]["base_url"] = url.split("?")[0]
    r = await live.post("/api/jobs", json=body, headers=AUTH)
    assert r.status_code == 202, r.text
    job = r.json()
    state = await wait_job(live, job["id"], lambda s: s["status"] not in ("queued", "running"))
    listing = (await live.get("/api/jobs")).text
    for secret in (password, key):
        assert secret not in r.text and secret not in listing
    assert state["target"] == f"http://127.0.0.1:{port}"
    run = get_run(job["run_id"], live.db)
    stored = json.dumps(run.scenario_text) + str(run.endpoint) + json.dumps(run.extra_json)
    out = export_raw(run.id, "json", tmp_path / "raw.json", db=live.db)
    detail = (await live.get(f"/api/runs/{run.id}")).text
    for secret in (password, key):
        assert secret not in stored and secret not in out.read_text() and secret not in detail
    assert run.scenario()["target"]["base_url"].startswith("http://***@127.0.0.1")


@pytest.mark.slow
async def test_a_run_cannot_be_deleted_while_its_job_writes_it(live, server_factory):
    slow = server_factory("--ttft-ms", "20", "--itl-ms", "40")
    scenario = "load: {shape: poisson, request_rate: 20, num_prompts: 2000}\nworkload: {output: {mean: 8}}\n"
    body = {"kind": "run", "scenario": scenario, "target": {"base_url": slow.url}}
    job = (await live.post("/api/jobs", json=body, headers=AUTH)).json()
    assert job["run_id"], "the run id is known from submission"
    await wait_job(live, job["id"], lambda s: (s["progress"] or {}).get("completed", 0) >= 3)
    r = await live.delete(f"/api/runs/{job['run_id']}", headers=AUTH)
    assert r.status_code == 409, r.text
    await live.post(f"/api/jobs/{job['id']}/cancel", headers=AUTH)
    final = await wait_job(live, job["id"], lambda s: s["status"] == "cancelled")
    run = get_run(job["run_id"], live.db)
    assert run.status == "interrupted" and run.request_count >= 3
    assert final["error"] is None
    r = await live.delete(f"/api/runs/{job['run_id']}", headers=AUTH)
    assert r.status_code == 200 and r.json()["deleted_requests"] == run.request_count


@pytest.mark.slow
async def test_background_runs_measure_in_their_own_process(live, fake_server):
    scenario = (
        "load: {shape: poisson, request_rate: 50, num_prompts: 8}\nworkload: {output: {mean: 4}}\n"
    )
    body = {"kind": "run", "scenario": scenario, "target": {"base_url": fake_server.url}}
    job = (await live.post("/api/jobs", json=body, headers=AUTH)).json()
    state = await wait_job(live, job["id"], lambda s: s["status"] == "completed")
    where = get_run(state["run_id"], live.db).extra_json["measured_in"]
    assert where["service_pid"] == os.getpid() and where["pid"] != os.getpid()
    assert where["separate_from_service"] is True


async def test_a_yaml_alias_bomb_is_refused_at_once(client):
    """Nine levels of nine aliases: 387M values once expanded (it used to hang a thread)."""
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 9)]
    bomb = "\n".join([*lines, "name: *a8"])
    t0 = time.monotonic()
    r = await asyncio.wait_for(
        client.post("/api/jobs", json={"kind": "run", "scenario": bomb, "simulate": SIM},
                    headers=AUTH),
        30,
    )  # fmt: skip
    assert r.status_code == 422 and "YAML aliases" in r.text
    assert time.monotonic() - t0 < 5 and len(r.content) < 2000


async def test_a_run_another_process_writes_cannot_be_deleted(live):
    """A CLI run (or another service) writing the same database: 409 until it finishes."""
    from bench.store import RunWriter
    from tests.test_store_helpers import make_records

    writer = RunWriter(live.db, name="busy")
    writer.start_load_point(0)
    for r in make_records(5):
        writer.submit(r)
    r = await live.delete(f"/api/runs/{writer.run_id}", headers=AUTH)
    assert r.status_code == 409 and "still being written" in r.text
    writer.finish("completed")
    assert get_run(writer.run_id, live.db).request_count == 5
    r = await live.delete(f"/api/runs/{writer.run_id}", headers=AUTH)
    assert r.status_code == 200 and r.json()["deleted_requests"] == 5


@pytest.mark.slow
def test_a_killed_service_leaves_its_job_stored_interrupted(server_factory, tmp_path):
    """SIGKILL the service mid-job: its job process notices, stops gently and stores every
    request the target received; no process is left running."""
    import signal
    import socket
    import subprocess
    import sys

    from tests.helpers import wait_for

    target = server_factory("--ttft-ms", "20", "--itl-ms", "40")
    db = f"sqlite:///{tmp_path / 'killed.db'}"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "TOKENBENCH_API_TOKEN": TOKEN}
    service = subprocess.Popen(
        [sys.executable, "-m", "bench", "serve", "--db", db, "--port", str(port),
         "--log-level", "warning"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:

        def up() -> bool:
            try:
                return httpx.get(f"{url}/api/runs", timeout=2).status_code == 200
            except httpx.HTTPError:
                return False

        wait_for(up, 60, "the service")
        scenario = "load: {request_rate: 20, num_prompts: 2000}\nworkload: {output: {mean: 8}}\n"
        body = {"kind": "run", "scenario": scenario, "target": {"base_url": target.url}}
        job = httpx.post(f"{url}/api/jobs", json=body, headers=AUTH, timeout=30).json()
        wait_for(
            lambda: httpx.get(f"{url}/api/jobs/{job['id']}").json()["progress"], 60, "progress"
        )
        wait_for(lambda: target.stats()["finished"] >= 10, 60, "10 finished streams")
        service.send_signal(signal.SIGKILL)
        service.wait(30)
    finally:
        if service.poll() is None:
            service.kill()
    dispose_all()
    run = wait_for(
        lambda: (r := get_run(job["run_id"], db)).stored_status != "running" and r,
        60,
        "the job process to store the run",
    )
    truth = target.stats()
    assert run.stored_status == "interrupted" and run.request_count == truth["requests"]
    job_pid = run.extra_json["measured_in"]["pid"]
    wait_for(lambda: not Path(f"/proc/{job_pid}").exists(), 30, "the job process to exit")


# ---------------------------------------------------------------- hostile endpoints (issue 28)
#
# Each row: the attack, the server that makes it (tests/hostile_server.py), the transport,
# and what must come of it: the failure kind (None: the request completes). Every request
# sent is recorded (records lost: 0), and none ends by the request timeout unless the row
# says so, so the bound that ended it is the one named.

WIRE_ATTACKS = [
    # (attack, mode, scheme, expected kind, request timeout s)
    ("F2 https target accepts TCP, never finishes TLS", "silent", "https", ERR_TIMEOUT_TLS, 2),
    ("accepts the request, never sends a response head", "silent", "http", ERR_TIMEOUT_HEADERS, 2),
    ("F1 SSE comments forever, never a data event", "comments", "http", ERR_OVERSIZED, 120),
    ("one SSE data line that never ends", "long_line", "http", ERR_OVERSIZED, 120),
    ("tokens forever, max_tokens 8 ignored", "endless", "http", ERR_PROTOCOL, 120),
    ("[DONE], then the response held open", "done_hold", "http", None, 120),
    ("F8 100 Continue and 103 Early Hints before the 200", "interim", "http", None, 120),
]


@pytest.mark.slow
@pytest.mark.parametrize("transport", ["raw", "httpx"])
@pytest.mark.parametrize(("attack", "mode", "scheme", "kind", "timeout_s"), WIRE_ATTACKS)
def test_hostile_endpoints(attack, mode, scheme, kind, timeout_s, transport):
    server = HostileServer(mode)
    try:
        url = f"{scheme}://127.0.0.1:{server.port}"
        result = run_blocking(
            plan(url, 3, out_len=8, rate=None, concurrency=3, transport=transport,
                 request_timeout_s=timeout_s),
            handle_sigint=False,
        )  # fmt: skip
    finally:
        server.close()
    records = result.records
    s = summarize(records)
    assert len(records) == s.sent == 3, attack  # records lost: 0
    assert s.completed + s.failed == 3, attack
    kinds = {r.error_kind for r in records}
    assert kinds == {kind}, (attack, [(r.error_kind, r.error_message) for r in records])
    if kind is None:
        assert [r.output_tokens for r in records] == [8, 8, 8], attack
    else:
        assert all(r.error_message for r in records), attack


USAGE_LIES = [
    # (attack, claimed completion_tokens, believed?)
    ("F4 usage 99,999,999 after 8 streamed tokens", 99_999_999, False),
    ("F4 usage 65,536 for max_tokens 8", 65_536, False),
    ("F4 usage 0 after 8 content events", 0, False),
    ("usage within max_tokens' slack (9 for 8) is believed", 9, True),
    ("honest usage is believed", 8, True),
]


@pytest.mark.slow
@pytest.mark.parametrize(("attack", "claimed", "believed"), USAGE_LIES)
def test_usage_is_checked_against_the_stream(attack, claimed, believed):
    server = HostileServer(f"usage:{claimed}")
    try:
        result = run_blocking(
            plan(server.url, 3, out_len=8, rate=None, concurrency=1), handle_sigint=False
        )
    finally:
        server.close()
    records = result.records
    assert len(records) == 3 and all(r.ok for r in records), attack  # records lost: 0
    for r in records:
        if believed:
            assert (r.output_tokens, r.claimed_output_tokens) == (claimed, None), attack
            assert not r.usage_mismatch
        else:  # the streamed count is used, the claim kept beside it
            assert (r.output_tokens, r.claimed_output_tokens) == (8, claimed), attack
            assert r.usage_mismatch and r.token_count_source == COUNT_CHUNKS
    s = summarize(records)
    assert s.total_output_tokens == 3 * (claimed if believed else 8), attack
    assert any("usage_mismatch: 3 " in note for note in s.notes) != believed, s.notes


@pytest.mark.slow
def test_memory_stays_flat_while_a_server_streams_comments():
    """F1: a server streaming comments and never an event grew the client by ~200 MB/s.
    Now each response ends at its bound and is dropped; over ~6 s of flooding (4 users, a
    new request as each ends) the client's memory in the second half is no higher than in
    the first, give or take allocator noise."""
    server = HostileServer("comments")
    samples: list[int] = []
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            samples.append(rss_bytes())
            done.wait(0.05)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        result = run_blocking(
            plan(server.url, 100_000, out_len=8, rate=None, concurrency=4, duration_s=6.0,
                 request_timeout_s=120),
            handle_sigint=False,
        )  # fmt: skip
    finally:
        done.set()
        sampler.join()
        server.close()
    records = result.records
    assert len(records) >= 8 and {r.error_kind for r in records} == {ERR_OVERSIZED}
    half = len(samples) // 2
    first, second = max(samples[:half]), max(samples[half:])
    assert second - first < 64 << 20, (first >> 20, second >> 20, len(records))
    assert server.bytes_sent >= (2 << 20) * len(records)  # the flood really flowed


# ---------------------------------------------------------------- formula injection (F5)

FORMULA_LABELS = ["=1+41", "+41+1", "-41+83", "@SUM(41,1)", "\t=1+41", "\r=1+41"]


@pytest.fixture(scope="module")
def formula_exports(tmp_path_factory):
    """A report over runs whose labels are formulas, written as XLSX and CSV."""
    from bench.cost import load_catalogue
    from bench.export.formats import write
    from bench.export.report import build_report

    root = tmp_path_factory.mktemp("formulas")
    db = f"sqlite:///{root / 'runs.db'}"
    gpus = ["B200-SXM", "H100-SXM", "H200-SXM", "A100-SXM", "L40S", "MI300X"]
    runs = [
        store_sweep(db, gpu=gpu, label=label, per_point=8, seed=i)
        for i, (gpu, label) in enumerate(zip(gpus, FORMULA_LABELS, strict=True))
    ]
    report = build_report(runs, db, None, load_catalogue(), 0.85)
    xlsx = write(report, "xlsx", root / "labels.xlsx")
    csv_dir = write(report, "csv", root / "labels_csv")
    dispose_all()
    return {"root": root, "xlsx": xlsx, "csv": csv_dir}


def _label_cells(values) -> list[str]:
    return [v for v in values if isinstance(v, str) and any(lab in v for lab in FORMULA_LABELS)]


def test_csv_cells_that_look_like_formulas_are_text(formula_exports):
    """F5: OWASP's rule: a text cell beginning with = + - @ TAB or CR gets a leading quote;
    numbers (-0.5) stay numbers."""
    import csv as csvmod

    quoted = set()
    for path in sorted(formula_exports["csv"].glob("*.csv")):
        for row in csvmod.reader(path.open(encoding="utf-8", newline="")):
            for cell in row:
                if cell[:1] in ("=", "+", "-", "@", "\t", "\r"):
                    float(cell)  # only a number may begin so
                quoted |= {lab for lab in FORMULA_LABELS if cell.startswith("'" + lab)}
    assert quoted == set(FORMULA_LABELS)


def test_xlsx_labels_are_text_not_formulas(formula_exports):
    from openpyxl import load_workbook

    wb = load_workbook(formula_exports["xlsx"])
    cells = [c for ws in wb for row in ws.iter_rows() for c in row if isinstance(c.value, str)]
    labels = [c for c in cells if c.value.startswith(tuple(FORMULA_LABELS))]
    assert {lab for lab in FORMULA_LABELS for c in labels if c.value.startswith(lab)} == set(
        FORMULA_LABELS
    )
    assert all(c.data_type == "s" for c in labels), [(c.coordinate, c.value) for c in labels]


@pytest.mark.slow
def test_libreoffice_reads_the_labels_as_text(formula_exports, tmp_path):
    """F5, as a user would meet it: LibreOffice opens the workbook and the CSV, recalculates,
    and every label is still its text, never 42."""
    import shutil
    import subprocess

    if not shutil.which("soffice"):
        pytest.skip(
            "LOUD SKIP: LibreOffice not installed (apt-get install -y libreoffice-calc; "
            ".ci/run installs it) - formula labels were not opened in a spreadsheet"
        )
    from openpyxl import load_workbook

    summary_csv = formula_exports["csv"] / "summary.csv"
    for src, fmt in ((formula_exports["xlsx"], "xlsx"), (summary_csv, "xlsx")):
        out = tmp_path / src.stem
        res = subprocess.run(
            ["soffice", f"-env:UserInstallation=file://{tmp_path / 'profile'}", "--headless",
             "--convert-to", fmt, "--outdir", str(out), str(src)],
            capture_output=True, text=True, timeout=180,
        )  # fmt: skip
        assert res.returncode == 0, res.stderr
        wb = load_workbook(out / f"{src.stem}.xlsx", data_only=True)
        values = [c.value for ws in wb for row in ws.iter_rows() for c in row]
        assert 42 not in values and 42.0 not in values, src.name
        texts = " ".join(v for v in values if isinstance(v, str))
        assert "=1+41" in texts and "@SUM(41,1)" in texts, src.name


# ---------------------------------------------------------------- jobs tell the truth (F9)


async def test_a_jobs_run_id_answers_from_submission(client):
    """The run id a job announces answers 202 (with the job's state) until its run is
    stored, for the running job and a queued one alike; never 404."""
    gate = threading.Event()
    client.app.state.tb.jobs._execute = lambda job: gate.wait(30) and "completed"
    body = {"kind": "run", "scenario": "load: {num_prompts: 4}\n", "simulate": SIM}
    first = (await client.post("/api/jobs", json=body, headers=AUTH)).json()
    second = (await client.post("/api/jobs", json=body, headers=AUTH)).json()
    try:
        for job, status in ((first, "running"), (second, "queued")):
            for _ in range(500):
                r = await client.get(f"/api/runs/{job['run_id']}")
                if r.status_code == 202 and r.json()["status"] == status:
                    break
                await asyncio.sleep(0.02)
            assert r.status_code == 202 and r.json()["job_id"] == job["id"], r.text
            assert r.json()["status"] == status and r.headers["Retry-After"]
        r = await client.get("/api/runs/" + "0" * 32)
        assert r.status_code == 404  # an id no job announced is still unknown
    finally:
        gate.set()


@pytest.mark.slow
async def test_a_job_whose_requests_all_failed_says_failed(live, server_factory):
    """F9: the job said `completed` while its stored run said `failed`."""
    server = server_factory("--ttft-ms", "5", "--itl-ms", "1", "--fault", "1:http_500")
    scenario = "load: {shape: poisson, request_rate: 50, num_prompts: 6}\n"
    body = {"kind": "run", "scenario": scenario, "target": {"base_url": server.url}}
    job = (await live.post("/api/jobs", json=body, headers=AUTH)).json()
    state = await wait_job(live, job["id"], lambda s: s["status"] in ("completed", "failed"))
    run = get_run(state["run_id"], live.db)
    assert state["status"] == run.status == "failed", (state, run.status)
    assert run.request_count == 6  # records lost: 0
    assert "failed" in state["error"]


@pytest.mark.slow
async def test_a_job_past_its_deadline_ends_and_the_queue_goes_on(live, fake_server):
    """A job held by a target that never answers (request timeout 600 s) ends at its own
    deadline, stored interrupted with what it measured, and the job queued behind it runs."""
    silent = HostileServer("silent")
    try:
        slow = {
            "kind": "run",
            "scenario": "load: {num_prompts: 4, request_rate: 20}\nrequest_timeout_s: 600\n",
            "target": {"base_url": silent.url, "model": "m"},
            "deadline_s": 8,
        }
        quick = {
            "kind": "run",
            "scenario": "load: {shape: poisson, request_rate: 50, num_prompts: 4}\n",
            "target": {"base_url": fake_server.url},
        }
        held = (await live.post("/api/jobs", json=slow, headers=AUTH)).json()
        behind = (await live.post("/api/jobs", json=quick, headers=AUTH)).json()
        state = await wait_job(live, held["id"], lambda s: s["finished_at"] is not None)
        assert state["status"] == "interrupted" and "deadline" in state["error"], state
        records = load_records(state["run_id"], db=live.db)
        # records lost: 0, by the server's count of the requests that reached it
        assert len(records) == silent.requests, (len(records), silent.requests)
        assert all(r.state == "cancelled" for r in records)
        after = await wait_job(live, behind["id"], lambda s: s["status"] == "completed")
        assert get_run(after["run_id"], live.db).status == "completed"
    finally:
        silent.close()


# ---------------------------------------------------------------- credentials (F7)


@pytest.mark.slow
async def test_the_upstream_key_goes_only_to_hosts_the_operator_named(tmp_path, monkeypatch):
    """F7: the service's OPENAI_API_KEY went as a bearer token to any target a token holder
    named. Now only to a HOST:PORT given with --upstream-key; others get no Authorization."""
    key = "sk-upstream-only-for-named-0123"
    monkeypatch.setenv("OPENAI_API_KEY", key)
    named, chosen = HostileServer("usage:8"), HostileServer("usage:8")
    db = f"sqlite:///{tmp_path / 'keys.db'}"
    app = create_app(
        db, api_token=TOKEN, allow_hosts=[], open_reads=True,
        upstream_key_hosts=[f"127.0.0.1:{named.port}"],
    )  # fmt: skip
    transport = httpx.ASGITransport(app=app)
    try:
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as c:
            for server in (named, chosen):
                body = {
                    "kind": "run",
                    "scenario": "load: {num_prompts: 3, request_rate: 50}\n",
                    "target": {"base_url": server.url, "model": "m"},
                }
                job = (await c.post("/api/jobs", json=body, headers=AUTH)).json()
                state = await wait_job(c, job["id"], lambda s: s["finished_at"] is not None)
                assert state["status"] == "completed", state
    finally:
        app.state.tb.jobs.shutdown()
        dispose_all()
        named.close()
        chosen.close()
    assert named.requests == chosen.requests == 3  # records lost: 0
    posts = [h for h in named.heads if h.startswith(b"POST ")]
    assert all(f"Authorization: Bearer {key}".encode() in h for h in posts)
    assert not any(b"authorization" in h.lower() or key.encode() in h for h in chosen.heads)


# ---------------------------------------------------------------- storage that notices (F6)


def _stored_requests(path: Path) -> int:
    """Requests committed to a SQLite file so far, read without disturbing its writer."""
    import sqlite3

    try:
        with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as db:
            return db.execute("SELECT count(*) FROM requests").fetchone()[0]
    except sqlite3.Error:
        return 0


@pytest.mark.slow
@pytest.mark.parametrize("fault", ["deleted", "read-only"])
def test_a_database_that_goes_away_mid_run_is_noticed(server_factory, tmp_path, fault):
    """F6: the SQLite file deleted mid-run: exit 0, "Stored as run ...", no fallback, 600 of
    600 records lost. Now the writer notices before its next commit, every record goes to
    the fallback file, the run exits non-zero naming it, and importing the file completes
    the same run id (twice: still one run)."""
    import subprocess
    import sys

    server = server_factory("--ttft-ms", "5", "--itl-ms", "2")
    path = tmp_path / "runs.db"
    n = 60
    proc = subprocess.Popen(
        [sys.executable, "-m", "bench", "run", "--base-url", server.url, "--num-prompts",
         str(n), "--request-rate", "15", "--random-input-len", "8", "--random-output-len", "4",
         "--db", f"sqlite:///{path}"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert wait_until(lambda: _stored_requests(path) > 0, 60), "nothing was ever stored"
        if fault == "deleted":
            for p in tmp_path.glob("runs.db*"):
                p.unlink()
        else:
            path.chmod(0o444)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    text = " ".join((out + err).split())
    assert proc.returncode != 0, text
    assert fault in text and "tokenbench import" in text, text
    fallback = Path(re.search(r"saved to (\S+\.jsonl)", text).group(1))
    lines = fallback.read_text().splitlines()
    assert len(lines) == 1 + n  # records lost: 0
    run_id = json.loads(lines[0])["run_id"]
    if fault == "read-only":
        path.chmod(0o644)
        db = f"sqlite:///{path}"  # completes the partial run in place
    else:
        db = f"sqlite:///{tmp_path / 'restored.db'}"
    for _ in range(2):
        assert import_file(fallback, db=db) == run_id
        (run,) = [r for r in list_runs(db) if r.id == run_id]
        assert len(list_runs(db)) == 1 and run.request_count == n
    dispose_all()


@pytest.mark.slow
@pytest.mark.postgres
def test_the_postgresql_writer_reconnects_after_the_server_drops_it(pg_url):  # noqa: F811
    """Held in part before: after a PostgreSQL restart the writer never reconnected. Here the
    server ends every connection to this test's own database mid-run (what a restart does
    to a client, without touching anyone else's); the writer reconnects with backoff and
    the run is whole: one run, every record, completed."""
    from sqlalchemy import create_engine, text

    from bench.store import RunWriter, load_records
    from tests.test_store_helpers import PG_ADMIN_URL, make_records

    records = make_records(600, seed=3)
    writer = RunWriter(pg_url, name="reconnect", flush_interval_s=0.1)
    for r in records[:300]:
        writer.submit(r)
    assert wait_until(lambda: writer.written == 300, 30)
    admin = create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    name = pg_url.rsplit("/", 1)[1]
    with admin.connect() as conn:
        # Down: new connections refused, the writer's own ended (a restart, for this
        # database only); it stays down longer than the writer's old 3 retries lasted.
        conn.execute(text(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS false'))
        killed = conn.execute(
            text("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                 "WHERE datname = :name AND pid <> pg_backend_pid()"),
            {"name": name},
        ).scalar()  # fmt: skip
        for r in records[300:]:
            writer.submit(r)
        time.sleep(3.0)  # the outage's length, not a wait for a condition
        assert writer.error is None and writer.written == 300  # still trying
        conn.execute(text(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true'))
    admin.dispose()
    assert killed >= 1
    writer.finish("completed")
    runs = list_runs(pg_url)
    assert [r.id for r in runs] == [writer.run_id] and runs[0].status == "completed"
    assert len(load_records(writer.run_id, db=pg_url)) == 600  # records lost: 0


# ---------------------------------------------------------------- the remaining partials


def test_rm_refuses_a_busy_run_before_asking(tmp_path):
    """`tokenbench rm` asked "delete? [y/N]" and only then refused a run still being
    written; now it refuses first, and nothing is deleted."""
    import typer
    from typer.testing import CliRunner

    from bench.cli import store as cli
    from bench.store import RunWriter
    from tests.test_store_helpers import make_records

    app = typer.Typer()
    app.command("rm")(cli.rm_command)
    app.command("runs")(cli.runs_command)
    db = str(tmp_path / "busy.db")
    writer = RunWriter(db, name="busy")
    writer.start_load_point(0)
    for r in make_records(5):
        writer.submit(r)
    res = CliRunner().invoke(app, ["rm", writer.run_id, "--db", db], input="y\n")
    assert res.exit_code != 0 and "still being written" in res.output, res.output
    assert "delete run" not in res.output  # never asked
    writer.finish("completed")
    assert get_run(writer.run_id, db).request_count == 5  # records lost: 0
    dispose_all()


def test_no_page_script_writes_html_from_data():
    """The /new page built its job table with innerHTML from a point title anyone with the
    token chooses; the service's own scripts now build elements with textContent only."""
    static = Path(__file__).resolve().parents[1] / "dashboards" / "static"
    scripts = [p for p in static.rglob("*.js") if "vendor" not in p.parts]
    assert scripts
    for path in scripts:
        text = path.read_text()
        for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write"):
            assert sink not in text, (path.name, sink)


@pytest.mark.slow
def test_the_services_threads_yield_to_its_jobs():
    """200 API readers moved a job's p99 gap from 0.5 to 31 ms on a busy machine. The
    service now lowers its own threads' priority after starting the job worker, which (and
    the job processes it spawns) keeps the normal one. Checked in a child process, so this
    test process keeps its priority."""
    import subprocess
    import sys

    code = (
        "import os, threading\n"
        "from server.jobs import JobManager, SERVICE_NICE, yield_to_jobs\n"
        "jobs = JobManager(None)\n"
        "before = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())\n"
        "yield_to_jobs(jobs)\n"
        "me = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())\n"
        "worker = os.getpriority(os.PRIO_PROCESS, jobs._worker.native_id)\n"
        "print(before, me, worker, SERVICE_NICE)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    ).stdout.split()
    before, me, worker, nice = map(int, out)
    assert worker == before and me == min(19, before + nice), out


def test_a_disbelieved_usage_is_stored_beside_the_streamed_count(tmp_path):
    """The claim survives storage (in the batch blob) and the stored summary says so."""
    from bench.records import RequestRecord
    from bench.store import RunWriter, load_columns

    db = str(tmp_path / "usage.db")
    writer = RunWriter(db, name="usage")
    writer.start_load_point(0)
    for i, claimed in enumerate((None, 99_999_999, None)):
        writer.submit(
            RequestRecord(index=i, sent_ns=i, end_ns=i + 10, output_tokens=8,
                          claimed_output_tokens=claimed)
        )  # fmt: skip
    writer.finish("completed")
    records = load_records(writer.run_id, db=db)
    assert [r.claimed_output_tokens for r in records] == [None, 99_999_999, None]
    assert [r.output_tokens for r in records] == [8, 8, 8]  # records lost: 0
    notes = summarize(load_columns(writer.run_id, db=db)).notes
    assert any("usage_mismatch: 1 " in n for n in notes), notes
    dispose_all()


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["trickle", "long_line"])
def test_small_answers_from_a_target_are_bounded_in_time_and_bytes(mode):
    """The model list and /metrics were read with httpx's per-read timeout and no byte cap:
    a server trickling bytes held discovery for ever, one streaming fast filled memory."""
    from bench.backends.bounds import ResponseTooLarge, bounded_get
    from bench.runner import list_models

    server = HostileServer(mode)
    try:
        assert list_models(server.url, timeout_s=1.0) is None
        expected = TimeoutError if mode == "trickle" else ResponseTooLarge
        with pytest.raises(expected):
            bounded_get(server.url + "/metrics", timeout_s=1.0, max_bytes=1 << 20)
    finally:
        server.close()
