"""Disaggregated prefill/decode in the simulator (bench.sim.disagg): the KV transfer costs its
bytes over the link, TTFT is prefill + transfer + the decode pool's first step, no prefill
interferes with decoding, GPUs count both pools, bad flags are one-line errors, and sim tune
searches a split."""

from __future__ import annotations

import math
import re

import httpx
import numpy as np
import pytest
from typer.testing import CliRunner

from bench.cli import app
from bench.cost import load_catalogue
from bench.metrics import parse_thresholds
from bench.scenario import parse_scenario
from bench.sim.engine import ServeOptions
from bench.sim.roofline import Deployment
from bench.sim.server import SimServer, start_sim_server_in_thread
from bench.sim.virtual import VirtualExecutor, build_engine, run_virtual
from bench.sim_tune import Config, Space, search

# Llama-3.3-70B (models.yaml): 80 layers, 8 KV heads of 128; FP8 KV = 1 byte per element.
KV_BYTES_PER_TOKEN = 80 * 8 * 128 * 2 * 1
NVLINK4 = 450e9  # H100's NVLink4, one direction per GPU (bench/hardware/gpus.yaml)
CX7 = 400e9 / 8  # H100's ConnectX-7 NIC: 400 Gb/s per GPU


def _h100(**kw):
    return build_engine("H100", "llama-3.3-70b", "fp8", **kw)


def _stats(records):
    ok = [r for r in records if r.ok]
    ttft = np.array([(r.first_token_ns - r.sent_ns) / 1e9 for r in ok])
    tpot = np.array([(r.end_ns - r.first_token_ns) / 1e9 / (r.output_tokens - 1) for r in ok])
    end = max(r.end_ns for r in ok) / 1e9
    return ok, ttft, tpot, sum(r.output_tokens for r in ok) / end


def test_transfer_time_is_kv_bytes_over_the_link():
    prompt = 4000
    nv = _h100(parallel="tp4", disagg="1P1D")  # 8 GPUs: one NVLink domain
    lanes = 4  # each of the 4 prefill ranks sends its 2 KV heads to its decode peer
    assert nv.transfer_s(prompt) == pytest.approx(
        10e-6 + prompt * KV_BYTES_PER_TOKEN / (NVLINK4 * lanes), rel=1e-9
    )
    net = _h100(parallel="tp4", disagg="1P1D", kv_link="network")
    assert net.transfer_s(prompt) == pytest.approx(
        50e-6 + prompt * KV_BYTES_PER_TOKEN / (CX7 * lanes), rel=1e-9
    )
    # more GPUs than one node: the network is the only way across
    assert _h100(parallel="tp4", disagg="2P2D").link.name == "CX7-400G"


def test_ttft_is_prefill_then_transfer_then_the_first_decode_step():
    prompt = 4000
    eng = _h100(parallel="tp4", disagg="1P1D")
    (rec,) = run_virtual(eng, [(0.0, prompt, 8)])
    dep = Deployment.build("H100", "llama-3.3-70b", "fp8", 4)
    prefill = dep.step_time(0, 0, prompt, prompt * prompt / 2, prefill_seqs=1)
    first_decode = dep.step_time(0, 0, 1, prompt - 1 + 0.5, prefill_seqs=1)  # last token redone
    expected = prefill + eng.transfer_s(prompt) + first_decode
    assert rec.first_token_ns / 1e9 == pytest.approx(expected, rel=1e-6)
    # every later token is a decode-only step of one sequence
    gaps = np.diff(rec.chunk_times_ns) / 1e9
    step = dep.step_time(1, prompt, 0, 0, prefill_seqs=0)  # reads the prompt's KV
    assert gaps[0] == pytest.approx(step, abs=2e-9)  # times are whole ns


def test_prefill_pool_starts_a_prompt_when_it_arrives_not_at_the_decode_step():
    """The prefill pool does not wait for the decode pool's steps: a prompt arriving mid
    decode step is prefilled from its arrival, and its first token leaves at the end of the
    first decode step that starts after its KV lands."""
    eng = _h100(parallel="tp4", disagg="1P1D")
    arrive = 0.5123  # inside one of the first request's decode steps
    a, b = run_virtual(eng, [(0.0, 100, 2000), (arrive, 4000, 4)])
    dep = Deployment.build("H100", "llama-3.3-70b", "fp8", 4)
    landed = arrive + dep.step_time(0, 0, 4000, 4000 * 4000 / 2, prefill_seqs=1)
    landed += eng.transfer_s(4000)
    ends = a.chunk_times_ns / 1e9
    starts = np.concatenate([[0.0], ends[:-1]])
    assert not np.any(np.isclose(starts, arrive))  # it did arrive mid step
    first = ends[np.argmax(starts >= landed - 1e-9)]
    assert b.first_token_ns / 1e9 == pytest.approx(first, abs=2e-9)


def test_split_removes_prefill_interference_from_tpot():
    """Long prompts arriving while others decode: colocated, each prefill chunk stretches
    the decode steps it shares; split, the decode pool never prefills."""
    rng = np.random.default_rng(0)
    offsets = np.cumsum(rng.exponential(1 / 6.0, 300))
    reqs = [(float(o), 4000, 200) for o in offsets]
    colo = _h100(parallel="tp8")
    split = _h100(parallel="tp4", disagg="1P1D")
    assert colo.gpus == split.gpus == 8
    ok_c, _, tpot_c, _ = _stats(run_virtual(colo, reqs))
    ok_s, _, tpot_s, _ = _stats(run_virtual(split, reqs))
    assert len(ok_c) == len(ok_s) == 300
    assert np.percentile(tpot_s, 99) < 0.5 * np.percentile(tpot_c, 99)
    # and the split's TPOT is flat: decode steps only
    assert np.percentile(tpot_s, 99) < 1.2 * np.median(tpot_s)


def test_one_token_prompts_never_make_a_split_better_per_gpu():
    """With nothing to prefill, the prefill pool's GPUs only add to the count: per GPU, a 1P1D
    of tpN does at most what a colocated tpN does, even over a free link."""
    reqs = [(0.0, 1, 64)] * 256
    colo = _h100(parallel="tp2")
    split = _h100(parallel="tp2", disagg="1P1D")
    split.link = type(split.link)("free", math.inf, 0.0, 1)
    assert split.transfer_s(1) == 0.0
    _, _, _, tps_c = _stats(run_virtual(colo, reqs))
    _, _, _, tps_s = _stats(run_virtual(split, reqs))
    assert tps_s / split.gpus <= tps_c / colo.gpus


def test_same_inputs_same_records():
    reqs = [(i * 0.05, 1000 + 37 * i, 40) for i in range(60)]
    a = run_virtual(_h100(parallel="tp2", disagg="1P2D"), reqs)
    b = run_virtual(_h100(parallel="tp2", disagg="1P2D"), reqs)
    assert [r.chunk_times_ns.tolist() for r in a] == [r.chunk_times_ns.tolist() for r in b]
    assert all(r.ok and r.output_tokens == 40 for r in a)


def test_gpus_count_both_pools_where_runs_are_stored_and_served():
    ex = VirtualExecutor(
        "H100", "llama-3.3-70b", parallel="tp2",
        options=ServeOptions(disagg="1P3D", decode_parallel="tp1"),
    )  # fmt: skip
    engine = ex.build()
    assert engine.gpus == 2 + 3 * 1
    hw = ex.stored_as().sim
    assert hw["gpu_count"] == 5
    assert (hw["disagg"], hw["prefill_gpus"], hw["decode_gpus"]) == ("1P3D", 2, 3)
    sc = ex.adopt(parse_scenario("name: s\nload: {request_rate: 1, num_prompts: 4}\n", source="s"))
    assert sc.gpu.count == 5  # what cost and per-GPU figures divide by
    assert SimServer(engine, "m").hardware()["gpu_count"] == 5
    assert Config("H100", "tp2", "fp8", disagg="1P3D").gpus == 8


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--disagg", "1X1D"], "is not xPyD"),
        (["--disagg", "0P1D"], "is not xPyD"),
        (["--prefill-parallel", "tp2"], "give --disagg too"),
        (["--disagg", "2P2D", "--parallel", "tp4", "--kv-link", "nvlink"], "scale-up domain"),
        (["--disagg", "1P1D", "--kv-link", "ib"], "--kv-link 'ib' must be one of"),
    ],
)
def test_bad_flags_are_one_line_errors(tmp_path, args, says):
    cmd = ["sim", "run", "--gpu", "H100", "--model", "llama-3.1-8b", "--num-prompts", "4",
           "--db", str(tmp_path / "t.db"), *args]  # fmt: skip
    res = CliRunner().invoke(app, cmd, env={"COLUMNS": "200"})
    assert res.exit_code == 2, res.output
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and says in lines[0], res.output


def test_sim_tune_bad_split_is_a_one_line_error():
    res = CliRunner().invoke(
        app, ["sim", "tune", "--slo", "p99_ttft_ms<=500", "--disagg", "1P1D,3X"],
        env={"COLUMNS": "200"},
    )  # fmt: skip
    assert res.exit_code == 2, res.output
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and "'3X' is not xPyD" in lines[0], res.output


def test_sim_tune_searches_a_split():
    sc = parse_scenario(
        """
name: long-prompts
load: {shape: poisson, request_rate: 4, num_prompts: 120}
workload:
  input: {dist: fixed, mean: 2048}
  output: {dist: fixed, mean: 48}
seed: 7
""",
        source="long-prompts",
    )
    space = Space(gpus=["H100"], precisions=["fp8"], mtp=[0], max_num_seqs=[16],
                  parallels=["tp1"], refine=False, disagg=["1P1D", "1P2D"])  # fmt: skip
    result = search(sc, "llama-3.1-8b", space, parse_thresholds("p99_ttft_ms<=2000,p99_tpot_ms<=50"),
                    load_catalogue(), store=False, slo_iterations=4, slo_draws=0, top=3)  # fmt: skip
    split = {o.config.disagg: o for o in result.outcomes if o.stage == "disagg"}
    assert set(split) == {"1P1D", "1P2D"}
    assert split["1P2D"].config.gpus == 3
    assert "--disagg 1P2D" in split["1P2D"].config.command("llama-3.1-8b", "vllm")
    assert split["1P1D"].config.text() == "H100 1P1D tp1 fp8 seqs 16"
    assert all(o.status in ("searched", "pruned") for o in split.values())
    assert split["1P2D"].config.settings()["disagg"] == "1P2D"
    assert "disagg" not in Config("H100", "tp1", "fp8").settings()  # colocated: as before
    sens = {s["setting"]: s for s in result.sensitivity()}
    assert {e["value"] for e in sens["disagg"]["values"]} == {None, "1P1D", "1P2D"}


def test_sim_serve_streams_from_a_split_and_announces_both_pools():
    engine = build_engine("B200", "llama-3.1-8b", "fp8", disagg="1P1D")
    base, stop = start_sim_server_in_thread("B200", "llama-3.1-8b", engine=engine)
    try:
        with httpx.Client(base_url=base, timeout=30) as c:
            hw = c.get("/v1/models").json()["data"][0]["tokenbench_simulated"]
            body = {"prompt": list(range(300)), "max_tokens": 8, "stream": True}
            with c.stream("POST", "/v1/completions", json=body) as r:
                chunks = [ln for ln in r.iter_lines() if ln.startswith('data: {"')]
            metrics = c.get("/metrics").text
    finally:
        stop()
    assert (hw["gpu_count"], hw["disagg"], hw["kv_link"]) == (2, "1P1D", "NVLink5")
    assert len(chunks) >= 8
    assert 'vllm:prompt_tokens_total{model_name="llama-3.1-8b"} 300' in metrics
    assert 'vllm:generation_tokens_total{model_name="llama-3.1-8b"} 8' in metrics


def test_stored_run_divides_throughput_by_both_pools(tmp_path):
    """A stored 1P1D run of TP1 on one GPU each: per-GPU figures (curves, cost) are the
    deployment's throughput over 2 GPUs, the prefill GPU included."""
    from bench.curves import run_curve
    from bench.drive import measure

    db = str(tmp_path / "t.db")
    ex = VirtualExecutor("H100", "llama-3.1-8b", options=ServeOptions(disagg="1P1D"))
    sc = ex.adopt(parse_scenario(
        "name: s\nload: {shape: poisson, request_rate: 4, num_prompts: 60}\n"
        "workload: {input: {dist: fixed, mean: 1000}, output: {dist: fixed, mean: 32}}\nseed: 3\n",
        source="s",
    ))  # fmt: skip
    result = measure(sc, None, executor=ex, db=db, store=True, probe=None)
    curve = run_curve(result.run_id, db)
    (point,) = curve.points
    assert point.output_tps > 0
    assert point.output_tps_per_gpu == pytest.approx(point.output_tps / 2)
    assert point.total_tps_per_gpu == pytest.approx(point.total_tps / 2)
    # its figures state at least the error of the published fronts reproduced with their
    # sources' disaggregated splits, wherever the run is read back
    from bench.curves import run_error_bars
    from bench.sim.profiles.accuracy import covering_error, expected_errors, held_out_errors
    from bench.store.read import get_run

    bars = run_error_bars(get_run(result.run_id, db), db)
    colocated, _ = expected_errors("H100-SXM", "llama-3.1-8b")
    split_err = covering_error(held_out_errors()["disagg"])
    assert "disaggregated" in bars["basis"]
    for q, e in bars["expected_error"].items():
        assert e == pytest.approx(max(colocated[q], split_err)), q
    assert curve.sim_error == (bars["expected_error"], bars["basis"])


# -- the steady-state formula the validation's disaggregated fronts use ------------------------


@pytest.mark.parametrize(
    "model, tp, isl, osl, split, users",
    [
        ("llama-3.1-8b", 1, 2000, 200, (1, 2), 32),  # the prefill pool keeps up
        ("llama-3.3-70b", 2, 4000, 300, (1, 1), 16),
        ("llama-3.1-8b", 1, 8000, 100, (1, 2), 64),  # prefill-bound: users queue for it
    ],
)
def test_steady_state_formula_agrees_with_the_engine(model, tp, isl, osl, split, users):
    """disagg_steady_state is to DisaggEngine what roofline.steady_state is to Engine: the same
    split at the same concurrency gives the same token pace and throughput per GPU (every GPU
    of both pools) as the closed loop `sim run --disagg` executes, within a few per cent."""
    from bench.sim.disagg import build_disagg, disagg_steady_state
    from bench.sim.virtual import run_closed_loop

    dep = Deployment.build("H100-SXM", model, "fp8", tp)
    f = disagg_steady_state(dep, dep, isl, osl, users, split)
    eng = build_disagg(dep, dep, f"{split[0]}P{split[1]}D")
    r = run_closed_loop(eng, users, (isl, isl), osl)
    assert f["tpot_s"] == pytest.approx(r["tpot_s"], rel=0.05)
    assert f["total_tps_per_gpu"] == pytest.approx(r["total_tps"] / eng.gpus, rel=0.05)


def test_a_prefill_bound_split_serves_what_its_prefill_pool_can():
    """More users than one prefill instance can feed: throughput stops at the prefill pool's
    rate and the decode batch shrinks to match, so the token pace gets faster, not slower."""
    from bench.sim.disagg import disagg_steady_state, prefill_step

    dep = Deployment.build("H100-SXM", "llama-3.1-8b", "fp8", 1)
    isl, osl = 8000, 100
    prompts, t = prefill_step(dep, isl)
    light = disagg_steady_state(dep, dep, isl, osl, 4, (1, 2))
    heavy = disagg_steady_state(dep, dep, isl, osl, 400, (1, 2))
    served = prompts / t * (isl + osl) / 3  # prompts a second x tokens each / 3 GPUs
    assert light["total_tps_per_gpu"] < served * 0.99
    assert heavy["total_tps_per_gpu"] == pytest.approx(served, rel=1e-3)
    assert heavy["decoding_per_instance"] < 200
    more = disagg_steady_state(dep, dep, isl, osl, 400, (2, 2))
    assert more["total_tps_per_gpu"] > heavy["total_tps_per_gpu"]


def test_best_split_feeds_its_decode_pool_with_the_fewest_prefill_instances():
    from bench.sim.disagg import best_disagg_split, disagg_steady_state, prefill_step

    dep = Deployment.build("H100-SXM", "llama-3.3-70b", "fp8", 2)
    isl, osl = 4000, 500
    (x, y), best = best_disagg_split(dep, dep, isl, osl, 32, max_decode=8, max_prefill=16)
    assert best["decoding_per_instance"] == 32  # fed, not starved
    # the closed loop that keeps 32 decoding per instance (plus those in prefill) agrees
    t, t_prefill = best["tpot_s"], prefill_step(dep, isl)[1]
    users = 32 * y * (osl * t + t_prefill) / (osl * t)
    loop = disagg_steady_state(dep, dep, isl, osl, users, (x, y))
    assert loop["decoding_per_instance"] == pytest.approx(32, rel=0.02)
    assert loop["total_tps_per_gpu"] == pytest.approx(best["total_tps_per_gpu"], rel=0.02)
    users = 32 * y
    for split in [(x, y + 1), (x + 1, y)] + ([(x - 1, y)] if x > 1 else []):
        other = disagg_steady_state(dep, dep, isl, osl, users * split[1] / y, split)
        assert other["total_tps_per_gpu"] <= best["total_tps_per_gpu"] * 1.0001 or (
            split[1] > y  # a larger split may only win by a rounding of its prefill share
        )
    assert best_disagg_split(dep, dep, isl, osl, 10**6) is None  # beyond the decode KV cache


def test_slo_capacity_of_a_split_widens_by_the_disaggregated_fronts_error(tmp_path):
    """`sim run --disagg --slo`: the capacity's range folds in a split deployment's error (at
    least the disaggregated fronts'), not the colocated category's alone."""
    from bench.sim.profiles.accuracy import covering_error, held_out_error, held_out_errors

    cmd = ["sim", "run", "--gpu", "H100", "--model", "llama-3.1-8b", "--disagg", "1P1D",
           "--random-input-len", "1000", "--random-output-len", "32", "--num-prompts", "60",
           "--seed", "2", "--slo", "p99_ttft_ms<=100", "--db", str(tmp_path / "t.db")]  # fmt: skip
    res = CliRunner().invoke(app, cmd, env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    m = re.search(r"SLO capacity \(p99_ttft_ms<=100\): ([\d,]+) output tok/s per GPU "
                  r"\(range ([\d,]+)-([\d,]+)\)", res.output)  # fmt: skip
    assert m, res.output
    value, low, high = (float(g.replace(",", "")) for g in m.groups())
    split = covering_error(held_out_errors()["disagg"])
    assert split > held_out_error("H100", "llama-3.1-8b")[0]  # wider than the colocated one's
    assert low <= value / (1 + split) * 1.01 and high >= value * (1 + split) * 0.99
    why = res.output[m.end() :].split("$/Mtok")[0]
    assert "disaggregated: at least the error of published fronts" in " ".join(why.split())
