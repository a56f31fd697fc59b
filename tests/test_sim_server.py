"""The real-time simulated server on 127.0.0.1: OpenAI format, usage, limits, metrics, timing."""

import asyncio
import json
import socket
import time

import httpx
import numpy as np
import pytest

from bench.sim.server import start_sim_server_in_thread
from bench.sim.virtual import simulate


@pytest.fixture(scope="module")
def url():
    base, stop = start_sim_server_in_thread("B200", "llama-3.1-8b", "fp8")
    yield base
    stop()


def _events(lines: list[str]) -> list[str]:
    return [line[len("data: ") :] for line in lines if line.startswith("data: ")]


def test_models_and_health(url: str) -> None:
    r = httpx.get(f"{url}/v1/models")
    assert r.status_code == 200 and r.json()["data"][0]["id"] == "llama-3.1-8b"
    assert "simulated" in httpx.get(f"{url}/health").text


def test_completion_non_streaming_usage(url: str) -> None:
    r = httpx.post(f"{url}/v1/completions", json={"prompt": "one two three four", "max_tokens": 7})
    body = r.json()
    assert r.status_code == 200 and body["object"] == "text_completion"
    assert body["usage"] == {
        "prompt_tokens": 4, "completion_tokens": 7, "total_tokens": 11,
        "prompt_tokens_details": {"cached_tokens": 0},  # shorter than one cache block
    }  # fmt: skip
    assert body["choices"][0]["finish_reason"] == "length"


def test_token_id_prompt_counts_ids(url: str) -> None:
    r = httpx.post(f"{url}/v1/completions", json={"prompt": list(range(123)), "max_tokens": 1})
    assert r.json()["usage"]["prompt_tokens"] == 123


def test_chat_streaming_format(url: str) -> None:
    body = {
        "model": "llama-3.1-8b",
        "messages": [{"role": "user", "content": "hello there simulated friend"}],
        "max_completion_tokens": 5,
        "stream": True,
        "stream_options": {"include_usage": True},
        "ignore_eos": True,
        "min_tokens": 5,
    }
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        lines = list(r.iter_lines())
    events = _events(lines)
    assert events[-1] == "[DONE]"
    objs = [json.loads(e) for e in events[:-1]]
    assert all(o["object"] == "chat.completion.chunk" for o in objs)
    assert objs[0]["choices"][0]["delta"]["role"] == "assistant"
    content = [o for o in objs if o["choices"] and o["choices"][0]["delta"].get("content")]
    assert len(content) == 5
    assert content[-1]["choices"][0]["finish_reason"] == "length"
    usage = objs[-1]
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 5
    assert usage["usage"]["prompt_tokens"] == 4


def test_streaming_without_usage(url: str) -> None:
    body = {"prompt": "hi", "max_tokens": 3, "stream": True}
    with httpx.stream("POST", f"{url}/v1/completions", json=body) as r:
        events = _events(list(r.iter_lines()))
    objs = [json.loads(e) for e in events[:-1]]
    assert events[-1] == "[DONE]" and len(objs) == 3
    assert all("usage" not in o for o in objs)


def test_bad_requests(url: str) -> None:
    assert (
        httpx.post(f"{url}/v1/completions", json={"prompt": "x", "max_tokens": 0}).status_code
        == 400
    )
    assert httpx.post(f"{url}/v1/completions", content=b"{nope").status_code == 400
    assert httpx.post(f"{url}/v1/chat/completions", json={"messages": []}).status_code == 400
    assert httpx.get(f"{url}/nothing").status_code == 404
    r = httpx.post(f"{url}/v1/completions", json={"prompt": list(range(10)), "max_tokens": 200_000})
    assert r.status_code == 400 and "context" in r.json()["message"]


def _parse_prometheus(text: str) -> dict[str, float]:
    out = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name_labels, value = line.rsplit(" ", 1)
        out[name_labels.split("{", 1)[0]] = float(value)
    return out


def test_metrics_parse(url: str) -> None:
    httpx.post(f"{url}/v1/completions", json={"prompt": "a b c", "max_tokens": 2})
    m = _parse_prometheus(httpx.get(f"{url}/metrics").text)
    for name in [
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:gpu_cache_usage_perc",
        "vllm:kv_cache_usage_perc",
        "vllm:num_preemptions_total",
        "tokenbench_sim_emission_lateness_max_seconds",
        "tokenbench_sim_behind_schedule",
    ]:
        assert name in m
    assert m["vllm:prompt_tokens_total"] >= 3 and m["vllm:generation_tokens_total"] >= 2


async def _stream(client: httpx.AsyncClient, n_out: int) -> tuple[float, list[float]]:
    body = {"prompt": list(range(200)), "max_tokens": n_out, "stream": True}
    sent = time.perf_counter()
    times = []
    async with client.stream("POST", "/v1/completions", json=body) as r:
        async for line in r.aiter_lines():
            if line.startswith("data: {"):
                times.append(time.perf_counter())
    return sent, times


@pytest.fixture(scope="module")
def url_70b():
    # 70B steps (~14 ms) are long against scheduling jitter on a busy 2-core test machine.
    base, stop = start_sim_server_in_thread("B200", "llama-3.3-70b", "fp8")
    yield base
    stop()


@pytest.mark.slow
async def test_timing_matches_virtual_time_at_modest_concurrency(url_70b: str) -> None:
    # 16 concurrent streams: the wall-clock token timing must match the same engine in virtual
    # time, and the server must report it stayed on schedule
    n, n_out = 16, 40
    async with httpx.AsyncClient(base_url=url_70b, timeout=30) as c:
        results = await asyncio.gather(*[_stream(c, n_out) for _ in range(n)])
        metrics = _parse_prometheus((await c.get("/metrics")).text)
    assert all(len(t) == n_out for _, t in results)
    tpot_wall = np.median([(t[-1] - t[0]) / (n_out - 1) for _, t in results])
    t0 = min(sent for sent, _ in results)
    virt = simulate(
        [(sent - t0, 200, n_out) for sent, _ in results], "B200", "llama-3.3-70b", "fp8"
    )
    tpot_virt = np.median([r.tpot_ns for r in virt]) / 1e9
    assert tpot_wall == pytest.approx(tpot_virt, rel=0.15)
    # generous for a noisy 2-core machine; the 256-stream figure is measured in the report
    assert metrics["tokenbench_sim_emission_lateness_max_seconds"] < 0.02


def test_models_announce_the_simulated_hardware(url: str) -> None:
    from bench.sim.detect import detect_simulated

    hw = detect_simulated(url)
    assert hw == {
        "gpu": "B200-SXM", "gpu_count": 1, "model": "llama-3.1-8b", "precision": "fp8",
        "parallel": "tp1", "engine": "vllm", "max_num_seqs": 1024,
        "max_num_batched_tokens": 8192, "kv_precision": "fp8", "mtp_tokens": 0,
        "mtp_acceptance": 0.85, "kv_capacity_tokens": hw["kv_capacity_tokens"],
        "prefix_cache": "lru", "api_server_count": 1,
    }  # fmt: skip
    assert hw["kv_capacity_tokens"] > 2_000_000  # 8B FP8 on one B200 (183,359 MiB)
    assert detect_simulated(f"{url}/v1") == hw


def test_detect_simulated_is_none_for_other_servers() -> None:
    from bench.sim.detect import detect_simulated

    with socket.socket() as s:  # nothing listens on a port just released
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    assert detect_simulated(f"http://127.0.0.1:{port}", timeout_s=1.0) is None


def test_run_against_a_simulator_is_stored_simulated_on_its_gpus(url: str, tmp_path) -> None:
    # the user says H100 x2; the endpoint simulates one B200: store and price what ran
    from bench.drive import measure
    from bench.scenario import Scenario
    from bench.store.read import get_run

    sc = Scenario.model_validate(
        {
            "name": "sim-detect",
            "target": {"base_url": url, "model": "llama-3.1-8b"},
            "load": {"shape": "constant", "request_rate": 50.0, "num_prompts": 5},
            "workload": {"input": {"mean": 32}, "output": {"mean": 8}},
            "gpu": {"type": "H100-SXM", "count": 2},
        }
    )
    db = f"sqlite:///{tmp_path / 'runs.db'}"
    given = sc.model_dump()
    measured = measure(sc, db=db)
    summary, run_id = measured.points[0].summary, measured.run_id
    info = get_run(run_id, db)
    assert info.simulated and (info.gpu_type, info.gpu_count) == ("B200-SXM", 1)
    as_run = measured.scenario.gpu
    assert (as_run.type, as_run.count) == ("B200-SXM", 1)  # what the CLI then prices
    assert sc.model_dump() == given  # the caller's scenario is not changed
    assert summary.completed == 5
    # the simulator says where its deployment saturates for this workload, and the run keeps
    # it as `sim run` does: every view can flag its points near saturation
    from bench.curves import run_error_bars
    from bench.sim.detect import simulated_saturation
    from bench.sim.error_bars import saturation_rate
    from bench.sim.virtual import build_engine

    isl = summary.total_input_tokens / summary.completed
    osl = summary.total_output_tokens / summary.completed
    expected = saturation_rate(build_engine("B200", "llama-3.1-8b", "fp8"), isl, osl)
    assert simulated_saturation(url, isl, osl) == pytest.approx(expected)
    bars = run_error_bars(info, db)
    assert bars["saturation_requests_per_s"] == pytest.approx(expected)
    assert simulated_saturation(url, 0, 8) is None  # refused: lengths below one token
    assert simulated_saturation("http://127.0.0.1:9", isl, osl, timeout_s=2) is None
