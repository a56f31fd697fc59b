"""`sim calibrate` and `--profile`: a calibration recovers the parameters runs were simulated
with, stays inside the physical ranges, names what the data cannot pin down, and its profile
file round-trips, changes predictions, and fails on a bad file with one line naming the field."""

from __future__ import annotations

import math
import re
import sys
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

pytest.importorskip("scipy")

from bench.cli import app  # noqa: E402
from bench.records import RequestRecord  # noqa: E402
from bench.sim.profiles import get_gpu  # noqa: E402
from bench.sim.user_calibration import (  # noqa: E402
    ObservedPoint,
    Settings,
    batch_bucket,
    bounds_for,
    build_engine,
    calibrate,
    efficiency_values,
    field_stats,
    gaps_by_batch,
    load_profile,
    quantities,
    replay,
    replay_records,
    sampling_spread,
    ttft_by_length,
    write_profile,
)

DEVICE = get_gpu("H100")
SETTINGS = Settings(model="llama-3.1-8b", precision="fp8", max_num_seqs=16)
TRUTH = {"mbu": 0.72, "mfu": 0.55, "kv_bw_ratio": 0.7, "t_layer_s": 2.5e-5, "t_tok_s": 5e-7,
         "t_req_s": 3e-3, "step_cv": 0.25}  # fmt: skip
# (a GPU fit's per-step overhead is per layer, t_layer_s; t_fix_s is fixed there; t_req_s is
# the endpoint's front end, which only TTFT sees; step_cv the scatter of step times; a GPU's
# GEMMs reach mfu as their token rows fill the tiles, along the published fit's ramp)


def _point(rate: float, values: dict[str, float], n: int = 40, seed: int = 0) -> ObservedPoint:
    """A load point 'measured' on the simulator itself, with the given parameters."""
    rng = np.random.default_rng(seed)
    offsets = np.cumsum(rng.exponential(1 / rate, n))
    req = np.column_stack([offsets, rng.integers(200, 1500, n), rng.integers(50, 200, n)])
    p = ObservedPoint("run", 0, f"rate {rate:g}/s", req.astype(float), {})
    eff = efficiency_values(values, DEVICE.vendor)
    records = replay_records(p, build_engine(DEVICE, SETTINGS, eff))
    p.measured, p.gaps_measured = quantities(records), gaps_by_batch(records)
    p.spread, p.ttft_lengths = sampling_spread(records), ttft_by_length(records)
    return p


@pytest.fixture(scope="module")
def fitted():
    points = [_point(r, TRUTH, seed=i) for i, r in enumerate((4, 16, 30))]
    # eight starts: from five the fourth refit's published values (2026-12-06) left the search
    # where TPOT at 30 req/s missed by 6% and a step shape was read from runs that have none
    return calibrate(points, DEVICE, SETTINGS, max_nfev=60, starts=8)


def test_recovers_the_parameters_it_was_simulated_with(fitted):
    # the fit reproduces what it was fitted on (7 parameters, 3 points: within 8%, not exactly;
    # 30 req/s is past saturation, where TTFT p50 moves most: 7.5% from the published fit of
    # 2026-12-05, 10.8% from the refit of 2026-12-06, within 12%). The search's basin follows the
    # published values the fit leaves alone (here the GEMM ramp, 191 -> 194 rows): from three
    # starts that refit ended at t_req_s 0.19 ms against the truth's 3 ms and TTFT p50 -17%,
    # hence more starts (eight since the fourth refit, above the fixture)
    for r in fitted.residuals:
        for q in ("ttft_p50", "tpot_p50", "output_tps"):
            tol = 0.12 if q == "ttft_p50" and r.load == "rate 30/s" else 0.08
            assert abs(r.error(q)) < tol, (r.load, q, r.error(q))
    for p in fitted.params:  # each pinned value lies within 3 standard errors of the truth
        if p.pinned:
            assert abs(math.log(p.value / TRUTH[p.name])) <= 3 * math.log(p.spread) + 0.05, p
    # loads it was not fitted on, below saturation (about 20 req/s here: at it, a TTFT p50
    # measures how far the queue grew over 40 requests, as the llama-server test holds its
    # held-out figures below saturation too): the calibrated device predicts what the truth
    # gives, TPOT and throughput within 6% on average over four points of 40 requests and 10%
    # at worst. TTFT p50 within the error the profile states, as the llama-server test judges
    # it, and within 12%: at light load it is the front end (t_req_s) plus a prefill (mfu),
    # which three loads' medians did not tell apart (another load's TTFT moved -11% to +9% on
    # this set with how the fit split them); the TTFT of each point's shortest and longest
    # prompts, scored too (ttft_by_length), gives the prefill's slope: -8% to +8% now
    eff = efficiency_values(fitted.values, DEVICE.vendor)
    errors = []
    for rate, seed in ((10, 7), (10, 8), (16, 9), (6, 10)):
        held = _point(rate, TRUTH, seed=seed)
        pred = replay(held, build_engine(DEVICE, SETTINGS, eff))
        errors.append({q: pred[q] / held.measured[q] - 1 for q in held.measured})
    for q in ("tpot_p50", "tpot_p99", "output_tps"):
        each = [abs(e[q]) for e in errors]
        assert np.mean(each) <= 0.06 and max(each) <= 0.10, (q, errors)
    stated = fitted.expected_error()["ttft_p50"]
    assert all(abs(e["ttft_p50"]) <= stated for e in errors), (stated, errors)
    # How close TTFT p50 comes at loads it was not fitted on depends on where the search ends
    # along a valley the data cannot tell apart (per prompt token, t_tok_s and the prefill's
    # mfu trade one for the other: t_tok_s reads "not pinned"), and the published values the
    # fit inherits (the GEMM ramp) move that end. Measured on 2026-12-06 on this fixture and
    # four variants (other seeds, 60-80 requests a load): mean 1.4-9.1%, worst 4-17%; 10.2% and
    # 11.5% worst after two earlier refits. The cost where it ends is within the noise the fit
    # allows (SIGMA_FLOOR), so this is the calibration's real spread, which the stated error
    # above covers
    assert np.mean([abs(e["ttft_p50"]) for e in errors]) <= 0.10, errors
    assert max(abs(e["ttft_p50"]) for e in errors) <= 0.18, errors


def test_ttft_by_length_separates_the_front_end_from_the_prefill():
    """The median TTFT of the shortest and of the longest third of prompts: 2 ms of front end
    plus 10 us a prompt token here, read back exactly; nothing where the prompts are alike
    (a fixed-length run) or too few to split."""
    ms = 1_000_000

    def recs(lengths: list[int]) -> list[RequestRecord]:
        return [
            RequestRecord(index=i, sent_ns=0, first_token_ns=2 * ms + n * 10_000,
                          end_ns=50 * ms, prompt_tokens=n, output_tokens=4)
            for i, n in enumerate(lengths)
        ]  # fmt: skip

    spread = [200 + 10 * i for i in range(30)] + [1200 + 10 * i for i in range(30)]
    got = ttft_by_length(recs(spread))
    short = 2e-3 + np.median(spread[:20]) * 1e-5
    long = 2e-3 + np.median(spread[-20:]) * 1e-5
    assert got == {"short": pytest.approx(short), "long": pytest.approx(long)}
    assert ttft_by_length(recs([500] * 60)) == {}  # prompts alike: no slope to read
    assert ttft_by_length(recs(spread[:10] + spread[-10:])) == {}  # 20: too few thirds


def test_the_fit_stays_inside_the_physical_ranges_and_says_so():
    """Runs made with a step overhead 50x the physical upper bound: the fit stops at the
    bound and flags the parameter instead of leaving the range."""
    wild = {**TRUTH, "t_layer_s": 2e-3}
    points = [_point(r, wild, n=30, seed=i) for i, r in enumerate((4, 12))]
    # five starts: with the published fit of 2026-12-06 (fifth refit) underneath, the default
    # three ended in a local minimum of the discrete replay at 36.5 us, inside the range but
    # short of the bound a search of more starts reaches (every parameter at a bound there)
    prof = calibrate(points, DEVICE, SETTINGS, max_nfev=25, starts=5)
    ranges = {b.name: (b.low, b.high) for b in bounds_for("nvidia")}
    for p in prof.params:
        lo, hi = ranges[p.name]
        assert lo <= p.value <= hi, p
    t_layer = next(p for p in prof.params if p.name == "t_layer_s")
    # at the bound as the profile counts it (AT_BOUND: 1% of the 20x range's log width, 3%)
    assert t_layer.value == pytest.approx(ranges["t_layer_s"][1], rel=0.03)
    assert not t_layer.pinned and "upper bound" in t_layer.why_not_pinned()


def test_profile_round_trips_and_changes_predictions(fitted, tmp_path: Path):
    path = write_profile(fitted, tmp_path / "p.yaml")
    back = load_profile(path)
    # each fitted point's sampling spread travels with its residual, so the stated error does
    assert [r.spread.keys() for r in back.residuals] == [r.spread.keys() for r in fitted.residuals]
    assert all(r.spread["ttft_p99"] > 0 for r in back.residuals)
    # a figure kept to 4 significant digits moves an error by up to ~1e-4 of (1 + error)
    assert back.expected_error() == pytest.approx(fitted.expected_error(), abs=2e-4)
    assert back.values == pytest.approx({k: float(f"{v:.4g}") for k, v in fitted.values.items()})
    assert back.settings.model == "llama-3.1-8b" and back.settings.max_num_seqs == 16
    assert back.expected_error().keys() == fitted.expected_error().keys()
    calibrated = build_engine(back.calibrated_device(), SETTINGS, {})
    shipped = build_engine(DEVICE, SETTINGS, {})
    assert calibrated.dep.eff.t_layer_s == pytest.approx(back.values["t_layer_s"])
    step = lambda e: e.dep.step_time(8, 8000, 0, 0)  # noqa: E731
    assert step(calibrated) != pytest.approx(step(shipped), rel=1e-3)


def _cli(*args: str):
    return CliRunner().invoke(app, list(args))


def test_sim_run_with_a_profile_and_bad_files(fitted, tmp_path: Path):
    good = write_profile(fitted, tmp_path / "p.yaml")
    db = str(tmp_path / "t.db")
    common = ["--num-prompts", "20", "--random-input-len", "300", "--random-output-len", "40"]
    out = _cli("sim", "run", "--profile", str(good), "--request-rates", "5", *common, "--db", db)
    assert out.exit_code == 0, out.output
    assert "H100-SXM" in out.output
    text = good.read_text()
    cases = {
        "kind": text.replace("kind: tokenbench calibration profile", "kind: other"),
        "parameters.mbu.value": re.sub(r"(  mbu:\n    value: )\S+", r"\g<1>3.0", text),
        "fitted_on": text.replace("fitted_on:", "fitted_onx:"),
    }
    for field, body in cases.items():
        bad = tmp_path / f"bad-{field}.yaml"
        bad.write_text(body)
        out = _cli("sim", "run", "--profile", str(bad), *common, "--db", db)
        assert out.exit_code == 2
        assert str(bad) in out.output and f"field {field}" in out.output, out.output
        assert "Traceback" not in out.output
    out = _cli("sim", "run", "--profile", str(good), "--gpu", "B200", "--db", db)
    assert out.exit_code == 2 and "not both" in out.output


def test_calibrate_from_a_stored_run_and_scipy_missing(tmp_path: Path, monkeypatch):
    db = str(tmp_path / "t.db")
    out = _cli(
        "sim", "run", "--gpu", "H100", "--model", "llama-3.1-8b", "--max-num-seqs", "16",
        "--request-rates", "4,16", "--num-prompts", "30", "--random-input-len", "600",
        "--random-output-len", "80", "--db", db,
    )  # fmt: skip
    assert out.exit_code == 0, out.output
    from bench.store import list_runs

    run_id = list_runs(db)[0].id
    prof_path = tmp_path / "p.yaml"
    import scipy  # noqa: F401  (imported, so that undo() puts this very module back)

    monkeypatch.setitem(sys.modules, "scipy", None)  # as if the extra were not installed
    out = _cli("sim", "calibrate", run_id, "--out", str(prof_path), "--db", db)
    assert out.exit_code == 2 and "pip install 'tokenbench[calibrate]'" in out.output
    # the module object back, not a fresh import beside its already-loaded submodules (which
    # fails on scipy's lazy attributes, depending on which submodules earlier tests loaded)
    monkeypatch.undo()
    out = _cli("sim", "calibrate", run_id, "--out", str(prof_path), "--db", db)
    assert out.exit_code == 0, out.output
    assert "Residuals" in out.output and "rate 16/s" in out.output
    assert "no load was measured twice" in out.output  # and how to measure the engine's noise
    stated = load_profile(prof_path).expected_error()
    assert f"states an error of: ttft_p50 {stated['ttft_p50']:.1%}" in out.output
    prof = load_profile(prof_path)  # model, engine and limits came from the stored run
    assert prof.settings.model == "llama-3.1-8b" and prof.settings.max_num_seqs == 16
    assert prof.device.name == "H100-SXM" and prof.runs[0]["id"] == run_id


def test_sim_run_puts_an_error_bar_on_every_figure_and_flags_saturation(fitted, tmp_path):
    """Without a profile: the category's held-out error; with one: the profile's own per
    quantity; a point offered more than the deployment can serve is flagged."""
    import json

    from bench.sim.profiles.accuracy import expected_errors

    db, out = str(tmp_path / "t.db"), tmp_path / "s.json"
    common = ["--num-prompts", "24", "--random-input-len", "300", "--random-output-len", "40"]
    res = _cli(
        "sim", "run", "--gpu", "H100", "--model", "llama-3.1-8b", "--max-num-seqs", "16",
        "--request-rates", "2,inf", *common, "--db", db, "--summary-json", str(out),
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    assert "Expected error of the simulated figures" in res.output
    doc = json.loads(out.read_text())
    errors, basis = expected_errors("H100", "llama-3.1-8b")
    err = errors["ttft_p50"]
    assert doc["simulation_error"]["basis"] == basis
    low, high = doc["points"]
    ttft = low["expected_error"]["ttft_p50"]
    assert ttft["expected_error"] == err
    assert ttft["low"] < ttft["value"] < ttft["high"] == pytest.approx(ttft["value"] * (1 + err))
    assert not low["expected_error"]["near_saturation"]
    assert high["expected_error"]["near_saturation"] and "near saturation" in res.output

    profile = write_profile(fitted, tmp_path / "p.yaml")
    res = _cli("sim", "run", "--profile", str(profile), "--request-rates", "2", *common,
               "--db", db, "--summary-json", str(out))  # fmt: skip
    assert res.exit_code == 0, res.output
    doc = json.loads(out.read_text())
    # the profile keeps 4 significant digits
    assert doc["simulation_error"]["expected_error"] == pytest.approx(
        fitted.expected_error(), abs=2e-4
    )
    assert "calibration profile" in doc["simulation_error"]["basis"]


def test_a_cpu_device_given_or_measured_simulates_a_cpu_engine(tmp_path: Path):
    """`sim device` writes a catalogue-layout device; a tiny F32 model on it calibrates
    within the CPU ranges (not the GPU ones)."""
    import json

    from bench.hardware import ProfileError
    from bench.sim.device_profile import load_device
    from bench.sim.user_calibration import CPU_BOUNDS

    path = tmp_path / "cpu.yaml"
    res = _cli("sim", "device", "--out", str(path), "--bandwidth-gbs", "10", "--gflops", "20")
    assert res.exit_code == 0, res.output
    dev = load_device(path)
    assert dev.vendor == "cpu" and dev.hbm_bw_bytes_s == 1e10 and dev.peak_flops("bf16") == 2e10
    with pytest.raises(ProfileError, match="no such device file"):
        load_device(tmp_path / "none.yaml")
    with pytest.raises(ProfileError, match="no device 'other'"):
        load_device(path, "other")
    cfg = tmp_path / "tiny" / "config.json"
    cfg.parent.mkdir()
    cfg.write_text(json.dumps({"num_hidden_layers": 2, "hidden_size": 128,
                               "num_attention_heads": 4, "num_key_value_heads": 2,
                               "intermediate_size": 256, "vocab_size": 32000}))  # fmt: skip
    settings = Settings(model=str(cfg), precision="fp32", max_num_seqs=4,
                        max_num_batched_tokens=2048)  # fmt: skip
    truth = {"mbu": 0.5, "mfu": 0.3, "mfu_prefill_ratio": 1.5, "kv_bw_ratio": 0.8,
             "t_fix_s": 2e-3, "t_tok_s": 1e-4, "t_multi_s": 1e-3, "t_req_s": 1e-3}  # fmt: skip
    points = []
    for i, rate in enumerate((5.0, 20.0)):
        rng = np.random.default_rng(i)
        req = np.column_stack([np.cumsum(rng.exponential(1 / rate, 20)),
                               np.full(20, 96), np.full(20, 32)]).astype(float)  # fmt: skip
        p = ObservedPoint("run", i, f"rate {rate:g}/s", req, {})
        p.measured = replay(p, build_engine(dev, settings, efficiency_values(truth, "cpu")))
        points.append(p)
    prof = calibrate(points, dev, settings, max_nfev=30)
    for p in prof.params:
        lo, hi, _ = CPU_BOUNDS[p.name]
        assert (p.low, p.high) == (lo, hi) and lo <= p.value <= hi
    assert max(abs(r.error("tpot_p50")) for r in prof.residuals) < 0.1


def test_held_out_error_is_stated_and_kept_in_the_file(tmp_path: Path):
    from bench.sim.user_calibration import leave_one_point_out, mean_errors

    points = [_point(r, TRUTH, n=20, seed=i) for i, r in enumerate((4, 12, 24))]
    prof = calibrate(points, DEVICE, SETTINGS, max_nfev=8)
    held = leave_one_point_out(prof, points, max_nfev=8)
    assert [h.load for h in held] == [p.load for p in points]
    stated, off = prof.expected_error(), mean_errors(held)
    assert all(stated[q] >= off[q] for q in off)
    back = load_profile(write_profile(prof, tmp_path / "p.yaml"))
    assert back.expected_error() == pytest.approx(stated, rel=5e-3)  # 4 digits in the file
    with pytest.raises(ValueError, match="3 load points"):
        leave_one_point_out(prof, points[:2])


def test_a_parameter_stopped_near_its_lower_bound_is_said_to_be_there():
    """A fit that stops 0.7% above the lower end (t_fix_s 1.007e-5 of 1e-5..0.05) was said
    to be 'on its upper bound'."""
    from bench.sim.user_calibration import ParamFit

    low = ParamFit("t_fix_s", 1.007e-5, 1e-5, 0.05, "", math.inf, at_bound=True)
    high = ParamFit("t_fix_s", 0.0497, 1e-5, 0.05, "", math.inf, at_bound=True)
    assert low.why_not_pinned().startswith("on its lower bound")
    assert high.why_not_pinned().startswith("on its upper bound")


def test_weights_that_fit_in_a_cpu_cache_stream_at_its_rate(tmp_path: Path):
    """A CPU device with a measured last-level cache: a model whose streamed weights fit in
    three quarters of it reads them at the cache's bandwidth, a larger one at memory's; the
    embedding table (rows gathered) does not count. `sim device` measures both."""
    import json

    import yaml

    from bench.hardware import MIB
    from bench.sim.device_profile import (
        _cache_entry,
        host_device,
        last_level_cache_bytes,
        load_device,
    )
    from bench.sim.profiles import get_model
    from bench.sim.roofline import Deployment

    path = tmp_path / "cpu.yaml"
    entry = {"vendor": "cpu", "hbm_gb": 16.0, "hbm_bw_tbs": 0.01, "cache_mb": 32.0,
             "cache_bw_tbs": 0.1, "tflops": {"bf16": 0.02, "fp8": None, "fp4": None},
             "tdp_w": 0.0, "world_size": 1, "source": "test"}  # fmt: skip
    path.write_text(yaml.safe_dump({"gpus": {"cpu": entry}}))
    dev = load_device(path)
    assert dev.stream_bw_bytes_s(24 * MIB) == 1e11
    assert dev.stream_bw_bytes_s(24 * MIB + 1) == 1e10
    cfg = tmp_path / "tiny" / "config.json"
    cfg.parent.mkdir()
    cfg.write_text(json.dumps({"num_hidden_layers": 2, "hidden_size": 128,
                               "num_attention_heads": 4, "num_key_value_heads": 2,
                               "intermediate_size": 256, "vocab_size": 32000}))  # fmt: skip
    tiny = Deployment.build(dev, get_model(str(cfg)), "fp32")
    # 17.7 MB streamed (LM head 16.4 MB + body); the untied embedding's 16.4 MB is gathered
    assert tiny._bw == pytest.approx(1e11 * tiny.eff.mbu)
    big = Deployment.build(dev, "llama-3.1-8b", "bf16")
    assert big._bw == pytest.approx(1e10 * big.eff.mbu)
    # a cache is kept only where it measured faster than memory: a VM may report a shared L3
    # larger than one core reaches (one of this project's 2-core VMs reports 480 MiB, and a
    # copy of a quarter of it runs at memory speed)
    assert _cache_entry({"bandwidth_bytes_s": 1e10, "cache_bytes": 32 << 20,
                         "cache_bandwidth_bytes_s": 5e10}) == {"cache_mb": 32.0,
                                                              "cache_bw_tbs": 0.05}  # fmt: skip
    assert _cache_entry({"bandwidth_bytes_s": 1e10, "cache_bytes": 480 << 20,
                         "cache_bandwidth_bytes_s": 0.9e10}) == {}  # fmt: skip
    measured = host_device("host", threads=1)
    if last_level_cache_bytes() and "cache_mb" in measured:  # Linux sysfs, measured faster
        assert measured["cache_mb"] > 0 and measured["cache_bw_tbs"] > measured["hbm_bw_tbs"]


def test_the_fields_per_request_error_is_the_median_of_nine_relative_errors():
    """field_error in the field's terms: mean/p90/p99 of TTFT, ITL and E2E, |sim/meas - 1|,
    their median. Every latency 25% longer (times stretched about each send) is 25% off on
    all nine; the same records are 0% off."""
    import copy

    from bench.sim.user_calibration import field_error, field_stats, replay_records

    p = _point(8, TRUTH)
    records = replay_records(p, build_engine(DEVICE, SETTINGS, efficiency_values(TRUTH, "nvidia")))
    measured = field_stats(records)
    assert set(measured) == {
        f"{m}_{s}" for m in ("ttft", "itl", "e2el") for s in ("mean", "p90", "p99")
    }
    assert field_error(measured, field_stats(records))["median"] == 0.0

    def stretched(r, factor: float = 1.25):
        s = copy.copy(r)
        s.first_token_ns = int(r.sent_ns + factor * (r.first_token_ns - r.sent_ns))
        s.end_ns = int(r.sent_ns + factor * (r.end_ns - r.sent_ns))
        chunks = np.asarray(r.chunk_times_ns, float)
        s.chunk_times_ns = (r.sent_ns + factor * (chunks - r.sent_ns)).astype(np.int64)
        return s

    slower = [stretched(r) for r in records]
    errs = field_error(measured, field_stats(slower))
    assert len(errs) == 10 and errs["median"] == pytest.approx(0.25, abs=1e-3)
    assert all(v == pytest.approx(0.25, abs=2e-3) for v in errs.values())


def test_front_end_time_adds_to_ttft_only_and_multi_token_steps_cost_more():
    """t_req_s: the scheduler sees a request that much after it was sent, in virtual time and
    on the real-time endpoint alike (TTFT grows by it; TPOT does not). t_multi_s: a step that
    runs more than one token costs that much more than the one-token step (llama.cpp's GEMV
    path against its tiled GEMM kernels)."""
    import asyncio

    import httpx

    from bench.sim.roofline import Deployment
    from bench.sim.server import start_sim_server_in_thread
    from bench.sim.virtual import run_virtual

    dev = get_gpu("H100")
    plain = Deployment.build(dev, "llama-3.1-8b", "fp8")
    multi = Deployment.build(dev, "llama-3.1-8b", "fp8", t_multi_s=2e-3)
    assert multi.step_time(1, 500, 0, 0) == pytest.approx(plain.step_time(1, 500, 0, 0))
    assert multi.step_time(2, 1000, 0, 0) == pytest.approx(plain.step_time(2, 1000, 0, 0) + 2e-3)

    requests = [(0.0, 200, 20), (5.0, 200, 20)]  # far apart: nothing queues
    base = run_virtual(build_engine(dev, SETTINGS, {}), requests)
    front = run_virtual(build_engine(dev, SETTINGS, {"t_req_s": 0.25}), requests)
    for b, f in zip(base, front, strict=True):
        assert f.sent_ns == b.sent_ns
        assert (f.first_token_ns - f.sent_ns) - (b.first_token_ns - b.sent_ns) == pytest.approx(
            0.25e9, abs=1e3
        )
        assert f.tpot_ns == pytest.approx(b.tpot_ns)

    async def ttft(url: str) -> float:
        async with httpx.AsyncClient(base_url=url, timeout=30) as c:
            t0 = asyncio.get_running_loop().time()
            body = {"model": "m", "prompt": "hi", "max_tokens": 2, "stream": True}
            async with c.stream("POST", "/v1/completions", json=body) as resp:
                async for line in resp.aiter_lines():
                    if line.startswith("data: {"):
                        return asyncio.get_running_loop().time() - t0
        raise AssertionError("no token")

    engine = build_engine(dev, SETTINGS, {"t_req_s": 0.3})
    url, stop = start_sim_server_in_thread("H100", "llama-3.1-8b", engine=engine)
    try:
        assert asyncio.run(ttft(url)) >= 0.3
        with httpx.Client(base_url=url, timeout=30) as c:  # refused at once, not after 0.3 s
            body = {"model": "m", "prompt": "hi", "max_tokens": 10**7}
            assert c.post("/v1/completions", json=body).status_code == 400
    finally:
        stop()


def test_points_replayed_side_by_side_give_what_one_process_gives():
    """A fit replays its points in processes side by side (PointReplays); a replay is seeded,
    so two processes give exactly the figures one gives, in the points' order."""
    from bench.sim.user_calibration import PointReplays

    points = [
        _point(r, TRUTH, n=n, seed=i) for i, (r, n) in enumerate(((4, 20), (16, 60), (8, 30)))
    ]
    eff = efficiency_values(TRUTH, DEVICE.vendor)
    with PointReplays(points, DEVICE, SETTINGS, workers=1) as one:
        alone = one(eff)
        assert one.pool is None
    with PointReplays(points, DEVICE, SETTINGS, workers=2) as two:
        assert two.pool is not None and two.order == [1, 2, 0]  # the heaviest first
        side_by_side = two(eff)
        again = two(efficiency_values({**TRUTH, "mbu": 0.5}, DEVICE.vendor))
    assert side_by_side == alone
    assert [q for q, *_ in alone] == [p.measured for p in points]  # each point's own figures
    assert [lengths for *_, lengths in alone] == [p.ttft_lengths for p in points]
    assert again[1][0]["tpot_p50"] > alone[1][0]["tpot_p50"]  # less bandwidth: slower steps
    assert PointReplays(points[:1], DEVICE, SETTINGS, workers=4).workers == 1


def test_the_search_starts_from_the_lowest_cost_points_of_a_seeded_spread():
    """A replay's objective has local minima: the fit searches from the best few of the
    ranges' mid-point and a seeded spread, the same ones every time."""
    from bench.sim.user_calibration import _best_starts

    target = np.array([0.9, 0.1, 0.7])

    def cost(u: np.ndarray) -> float:
        return float(np.sum((u - target) ** 2))

    u0 = np.full(3, 0.5)
    starts = _best_starts(u0, cost, 3)
    costs = [cost(u) for u in starts]
    assert len(starts) == 3 and costs == sorted(costs) and costs[0] < cost(u0) / 2
    assert all(np.array_equal(a, b) for a, b in zip(starts, _best_starts(u0, cost, 3), strict=True))
    assert [u.tolist() for u in _best_starts(u0, cost, 1)] == [u0.tolist()]


def test_step_time_by_batch_size_is_read_from_the_token_times():
    """gaps_by_batch: each gap between a request's tokens, by how many requests were decoding
    in the step that ended it and whether a prefill shared that step. One request alone for
    60 tokens at 1 ms; a second's prefill shares the next step (2 ms), its first token
    reaching the client 30 us after the first request's token of that step; then both run 59
    tokens at 2 ms: {(1, clean): 1 ms, (1, with a prefill): 2 ms, (2, clean): 2 ms}."""

    ms, us = 1_000_000, 1_000
    alone = np.arange(61) * ms  # 0..60 ms
    together = 60 * ms + np.arange(1, 61) * 2 * ms  # 62..180 ms
    second_times = together + 30 * us
    first = RequestRecord(
        index=0,
        sent_ns=0,
        first_token_ns=0,
        end_ns=int(together[-1]),
        chunk_times_ns=np.concatenate([alone, together]),
        output_tokens=121,
    )
    second = RequestRecord(index=1, sent_ns=59 * ms, first_token_ns=int(second_times[0]),
                           end_ns=int(second_times[-1]), chunk_times_ns=second_times,
                           output_tokens=60)  # fmt: skip
    clean = {(1, False): 1e-3, (2, False): 2e-3}
    assert gaps_by_batch([first, second]) == pytest.approx(clean)  # one shared gap: too few
    assert gaps_by_batch([first, second], min_gaps=1) == pytest.approx({**clean, (1, True): 2e-3})
    assert gaps_by_batch([first, second], min_gaps=200) == {}  # too few gaps at either size
    sizes = batch_bucket(np.array([1, 8, 9, 16, 17, 256, 257]))
    assert sizes.tolist() == [1, 8, 16, 16, 32, 256, 512]
    # a server that streams two tokens an event shows its interval, not its steps: left out
    first.output_tokens = 2 * len(first.chunk_times_ns)
    assert gaps_by_batch([first, second]) == pytest.approx({(2, False): 2e-3})


def test_step_scatter_lengthens_the_tails_not_the_averages():
    """step_cv: each step's time scatters around the roofline's (lognormal, mean 1), from one
    seeded stream, so a replay is deterministic; the throughput and the medians barely move,
    the p99s grow; 0 is exactly the unscattered engine."""
    from bench.sim.engine import StepJitter

    assert {StepJitter(0.0).next() for _ in range(10)} == {1.0}
    draws = np.array([j.next() for j in [StepJitter(0.3)] for _ in range(20000)])
    assert draws.mean() == pytest.approx(1.0, abs=0.01)
    assert draws.std() / draws.mean() == pytest.approx(0.3, rel=0.05)

    # short prompts: decode steps are the tails' only source (long ones put prefill there)
    rng = np.random.default_rng(3)
    arrivals = np.cumsum(rng.exponential(1 / 10, 200))
    lengths = np.column_stack([rng.integers(20, 60, 200), rng.integers(100, 200, 200)])
    point = ObservedPoint("run", 0, "rate 10/s", np.column_stack([arrivals, lengths]), {})
    eff = efficiency_values({**TRUTH, "step_cv": 0.0}, DEVICE.vendor)

    def run(cv: float) -> tuple[dict[str, float], dict[str, float]]:
        records = replay_records(point, build_engine(DEVICE, SETTINGS, {**eff, "step_cv": cv}))
        return quantities(records), field_stats(records)

    steady, steady_itl = run(0.0)
    assert replay(point, build_engine(DEVICE, SETTINGS, eff)) == steady
    scattered, scattered_itl = run(0.5)
    assert run(0.5) == (scattered, scattered_itl)  # the same stream every replay
    assert scattered["output_tps"] == pytest.approx(steady["output_tps"], rel=0.01)
    assert scattered["tpot_p50"] == pytest.approx(steady["tpot_p50"], rel=0.03)
    assert scattered_itl["itl_mean"] == pytest.approx(steady_itl["itl_mean"], rel=0.03)
    # a lognormal of cv 0.5 puts its p99 at 2.7x its mean: the inter-token tail grows, and
    # the TTFT tail with it; TPOT averages a request's steps, so its p99 grows less
    assert scattered_itl["itl_p99"] > 2 * steady_itl["itl_p99"]
    assert scattered["ttft_p99"] > 1.4 * steady["ttft_p99"]
    assert scattered["tpot_p99"] > 1.05 * steady["tpot_p99"]


def test_sim_check_predicts_stored_runs_and_flags_saturation(fitted, tmp_path: Path):
    """`sim check`: runs stored under a profile are predicted by it (the same engine, so within
    a per cent); under another batch limit than the run had, or with another profile, it
    misses and says the error is beyond the one the profile states; a point offered more than
    the deployment serves is flagged and not held to it."""
    import json

    good = write_profile(fitted, tmp_path / "p.yaml")
    db, out = str(tmp_path / "t.db"), tmp_path / "check.json"
    common = ["--num-prompts", "60", "--random-input-len", "600", "--random-output-len", "80"]
    made = _cli("sim", "run", "--profile", str(good), "--max-num-seqs", "8",
                "--request-rates", "6,400", *common, "--db", db)  # fmt: skip
    assert made.exit_code == 0, made.output
    from bench.store import list_runs

    run_id = list_runs(db)[0].id
    res = _cli("sim", "check", run_id, "--profile", str(good), "--summary-json", str(out),
               "--db", db)  # fmt: skip
    assert res.exit_code == 0, res.output
    assert "Predicted with the profile" in res.output and "near saturation" in res.output
    doc = json.loads(out.read_text())
    light, flooded = doc["points"]
    assert not light["near_saturation"] and flooded["near_saturation"]
    assert light["utilisation"] < 0.5 and flooded["utilisation"] > 0.9
    for q, e in light["error"].items():  # the run's own max_num_seqs (8) came from the run
        assert abs(e) < 0.01, (q, e)
    assert light["field_error"] < 0.01
    assert all(doc["within_expected"].values()) and "within the profile's" in res.output
    # the same run predicted as if its server had run 2 sequences at once: a worse prediction
    res = _cli("sim", "check", run_id, "--profile", str(good), "--max-num-seqs", "2",
               "--summary-json", str(out), "--db", db)  # fmt: skip
    assert res.exit_code == 0, res.output
    worse = json.loads(out.read_text())["points"][0]
    assert worse["error"]["ttft_p99"] > 0.2 and worse["utilisation"] > light["utilisation"]
    # with a profile whose bandwidths sit at their lower bounds, the decode is slower
    slow = tmp_path / "slow.yaml"
    text = re.sub(r"(  mbu:\n    value: )\S+", r"\g<1>0.65", good.read_text())
    slow.write_text(re.sub(r"(  kv_bw_ratio:\n    value: )\S+", r"\g<1>0.4", text))
    res = _cli("sim", "check", run_id, "--profile", str(slow), "--summary-json", str(out),
               "--db", db)  # fmt: skip
    assert res.exit_code == 0, res.output
    slower = json.loads(out.read_text())
    assert slower["points"][0]["error"]["tpot_p50"] > 0.05
    assert not slower["within_expected"]["tpot_p50"] and "beyond the profile's" in res.output
    # --record: the check's points join the profile's held-out ones, so the error it states
    # covers what it missed; recorded twice, a point replaces itself
    for _ in range(2):
        res = _cli("sim", "check", run_id, "--profile", str(slow), "--record", "--db", db)
        assert res.exit_code == 0, res.output
    recorded = load_profile(slow)
    assert len(recorded.held_out) == 1 and recorded.held_out[0].run_id == run_id
    missed = slower["points"][0]["error"]["tpot_p50"]
    assert recorded.expected_error()["tpot_p50"] == pytest.approx(missed, rel=0.01)
    res = _cli("sim", "check", run_id, "--profile", str(slow), "--summary-json", str(out),
               "--db", db)  # fmt: skip
    assert all(json.loads(out.read_text())["within_expected"].values()), res.output
    # bad input: one line naming what is wrong
    res = _cli("sim", "check", "nosuchrun", "--profile", str(good), "--db", db)
    assert res.exit_code == 2 and "nosuchrun" in res.output and "Traceback" not in res.output


def test_a_step_shape_scales_the_step_at_its_nearest_measured_batch():
    """Efficiency.step_shape: the measured step over the model's by decoding sequences; a
    batch between or beyond the measured ones takes the nearest's factor (the larger on a
    tie), steps with a prefill take only prefill entries, and a step of prompts alone none."""
    from bench.sim.roofline import Deployment, shape_factor

    shape = ((1, False, 1.0), (2, False, 0.6), (8, False, 0.9), (4, True, 1.5))
    assert [shape_factor(shape, n, False) for n in (1, 2, 3, 5, 6, 8, 64)] == [
        1.0, 0.6, 0.6, 0.9, 0.9, 0.9, 0.9,
    ]  # fmt: skip
    assert shape_factor(shape, 1, True) == 1.5 and shape_factor((), 3, False) == 1.0
    plain = Deployment.build(DEVICE, "llama-3.1-8b", "fp8")
    shaped = Deployment.build(DEVICE, "llama-3.1-8b", "fp8", step_shape=shape)
    ratio = lambda *a: shaped.step_time(*a) / plain.step_time(*a)  # noqa: E731
    assert ratio(2, 2000, 0, 0) == pytest.approx(0.6)
    assert ratio(3, 3000, 500, 1e5) == pytest.approx(1.5)  # a prefill shared the step
    assert ratio(0, 0, 500, 1e5) == pytest.approx(1.0)  # prompts alone: no gap measures it


def test_calibration_reads_a_step_shape_the_model_cannot_follow(fitted, tmp_path: Path, capsys):
    """Runs made on a device whose two-sequence step takes 0.55x the model's (llama-server's
    Q8_0 kernels on a CPU ran 0.40, 0.57, 0.89 and 1.18 ms for 1-4 sequences, a knee no
    smooth term follows): the calibration finds the factor from the token gaps, keeps it in
    the profile, and predicts a server limited to two sequences, which runs at that step
    alone; runs simulated without a shape get none (the model already follows them)."""
    from dataclasses import replace

    import yaml

    from bench.hardware import ProfileError

    kink = ((1, False, 1.0), (2, False, 0.55), (3, False, 1.0))
    settings = Settings(model="llama-3.1-8b", precision="fp8", max_num_seqs=4)

    def point(rate: float, seed: int, shape: tuple, users: int | None = None) -> ObservedPoint:
        rng = np.random.default_rng(seed)
        n = 60
        offsets = np.cumsum(rng.exponential(1 / rate, n))
        req = np.column_stack([offsets, rng.integers(100, 400, n), rng.integers(60, 160, n)])
        p = ObservedPoint("run", 0, f"rate {rate:g}/s", req.astype(float), {}, users)
        eff = {**efficiency_values(TRUTH, DEVICE.vendor), "step_shape": shape}
        limit = replace(settings, max_num_seqs=users or 4)
        records = replay_records(p, build_engine(DEVICE, limit, eff))
        p.measured, p.gaps_measured = quantities(records), gaps_by_batch(records)
        return p

    runs = [point(r, i, kink) for i, r in enumerate((1, 3, 6))]
    prof = calibrate(runs, DEVICE, settings, max_nfev=40)
    factors = {b: f for b, shared, f in prof.step_shape if not shared}
    assert factors[2] / np.mean([factors[1], factors[3]]) == pytest.approx(0.55, abs=0.08)
    back = load_profile(write_profile(prof, tmp_path / "shape.yaml"))
    assert back.step_shape == prof.step_shape
    two = point(2, 9, kink, users=2)  # a closed loop of two users on a two-sequence server
    limit = replace(settings, max_num_seqs=2)
    shaped = replay(two, build_engine(DEVICE, limit, back.efficiency()))
    smooth = replay(two, build_engine(DEVICE, limit, efficiency_values(back.values, "nvidia")))
    err = lambda sim: abs(sim["output_tps"] / two.measured["output_tps"] - 1)  # noqa: E731
    assert err(shaped) <= 0.08 < err(smooth), (err(shaped), err(smooth))
    # a profile's bad shape entry: one line naming the file and field
    doc = yaml.safe_load((tmp_path / "shape.yaml").read_text())
    doc["step_shape"][0]["factor"] = 9.0
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(doc))
    with pytest.raises(ProfileError, match=r"bad.yaml: field step_shape\[0\].factor"):
        load_profile(tmp_path / "bad.yaml")
    assert fitted.step_shape == ()  # runs the model follows (simulated without a shape)
    from bench.cli.sim_calibrate import print_profile  # the CLI says which factor hit a bound

    capsys.readouterr()
    print_profile(replace(back, step_shape=((1, False, 1.02), (2, False, 0.5))))
    shown = " ".join(capsys.readouterr().out.split())
    assert "1: x1.02, 2: x0.5 (at its bound" in shown


def test_sampling_spread_reaches_the_ends_of_the_percentiles_interval():
    """200 requests, TTFT 1..200 ms: the p50's 95% interval is two order statistics around
    the 100th; a p99 of 200 requests has no upper end the data can bound (bench.metrics
    needs ~300), so the most extreme request stands in for it."""
    from bench.metrics import percentile_ci

    ms = 1_000_000
    recs = [
        RequestRecord(index=i, sent_ns=0, first_token_ns=i * ms, end_ns=i * ms + 10 * (ms + i * 1000),
                      output_tokens=11)
        for i in range(1, 201)
    ]  # fmt: skip
    spread = sampling_spread(recs)
    ttft = np.arange(1, 201) / 1e3
    p50 = np.percentile(ttft, 50)
    lo, hi = percentile_ci(ttft, 50)
    assert spread["ttft_p50"] == pytest.approx(max(p50 / lo - 1, hi / p50 - 1))
    assert 0.05 < spread["ttft_p50"] < 0.2  # about +-14 ranks of 200 around 100 ms
    assert percentile_ci(ttft, 99)[1] is None
    p99 = np.percentile(ttft, 99)
    assert spread["ttft_p99"] == pytest.approx(
        max(p99 / percentile_ci(ttft, 99)[0] - 1, 0.2 / p99 - 1)
    )
    assert "output_tps" not in spread  # one figure per run: no interval from its requests
    assert spread["tpot_p50"] < 0.02  # TPOT 1.001-1.2 ms: +-14 us around 1.1 ms
    assert sampling_spread([]) == {}


def test_a_profile_states_its_fit_and_the_measurements_interval_in_quadrature(fitted):
    """A fit that matched its points to 3-4% still states the error a rerun of those loads
    would show: sqrt(rms residual^2 + median sampling spread^2); the held-out mean where
    larger; never below the floor."""
    from dataclasses import replace

    from bench.sim.user_calibration import SIGMA_FLOOR, PointResidual

    def res(err: float, spread: float | None) -> PointResidual:
        extra = {} if spread is None else {"ttft_p50": spread}
        return PointResidual("r", 0, "rate 1/s", {"ttft_p50": 1.0}, {"ttft_p50": 1 + err}, extra)

    prof = replace(fitted, residuals=[res(0.03, 0.10), res(-0.04, 0.20)], held_out=[])
    # -4%: the measured figure is 1/0.96 = 1.0417x the simulated, which a range must state
    rms = math.sqrt((0.03**2 + (1 / 0.96 - 1) ** 2) / 2)
    assert prof.expected_error() == pytest.approx({"ttft_p50": math.hypot(rms, 0.15)})
    no_spread = replace(prof, residuals=[res(0.03, None), res(-0.04, None)])
    assert no_spread.expected_error() == pytest.approx({"ttft_p50": SIGMA_FLOOR})
    held = replace(prof, held_out=[res(0.5, None)])
    assert held.expected_error() == pytest.approx({"ttft_p50": 0.5})
    # a held-out figure simulated 40% low is measured 1.67x the simulated: a range of x/÷ 1.4
    # misses it, so the profile states 67%, and the range it prints holds the measured figure
    low = replace(prof, held_out=[res(-0.4, None)])
    stated = low.expected_error()["ttft_p50"]
    assert stated == pytest.approx(1 / 0.6 - 1)
    simulated, measured = 0.6, 1.0
    assert simulated / (1 + stated) <= measured <= simulated * (1 + stated) + 1e-12


def test_a_profile_with_a_spread_that_is_not_a_number_is_named(fitted, tmp_path: Path):
    import yaml

    path = write_profile(fitted, tmp_path / "p.yaml")
    doc = yaml.safe_load(path.read_text())
    doc["residuals"][0]["ttft_p50"]["spread"] = "wide"
    path.write_text(yaml.safe_dump(doc))
    with pytest.raises(Exception, match=r"residuals\[0\]\.ttft_p50\.spread.*must be a number"):
        load_profile(path)


def test_one_load_measured_twice_states_how_far_the_engine_moved(fitted, tmp_path: Path):
    """A load the runs measured twice (same load, same mean lengths) says how far the engine
    is from itself; the stated error is never below it, and it survives the file. Another
    workload at the same rate, or another rate, is not a repeat."""
    from dataclasses import replace

    from bench.sim.user_calibration import repeatability

    first = _point(4, TRUTH, seed=0)
    again = replace(first, run_id="again", measured={**first.measured})
    again.measured["tpot_p50"] *= 1.25  # a busy host: the same load, a quarter slower
    again.measured["ttft_p99"] *= 0.9
    longer = replace(first, run_id="longer", requests=first.requests * [1, 2, 1])
    faster = replace(first, run_id="faster", load="rate 8/s")
    for p in (longer, faster):
        p.measured = {q: 3 * v for q, v in first.measured.items()}
    moved, loads = repeatability([first, longer, faster, again])
    assert loads == ["rate 4/s"]
    assert moved["tpot_p50"] == pytest.approx(0.25)
    assert moved["ttft_p99"] == pytest.approx(1 / 0.9 - 1)
    assert moved["ttft_p50"] == pytest.approx(0.0)
    assert repeatability([first, longer, faster]) == ({}, [])

    prof = replace(fitted, repeat=moved, repeated_loads=loads)
    stated, before = prof.expected_error(), fitted.expected_error()
    assert stated["tpot_p50"] >= 0.25 > before["tpot_p50"]
    assert stated["ttft_p50"] == pytest.approx(before["ttft_p50"])  # it did not move
    back = load_profile(write_profile(prof, tmp_path / "p.yaml"))
    assert back.repeated_loads == loads
    assert back.expected_error() == pytest.approx(stated, abs=2e-4)  # 4 digits in the file

    import yaml

    doc = yaml.safe_load((tmp_path / "p.yaml").read_text())
    doc["repeatability"]["tpot_p50"] = -1
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(doc))
    with pytest.raises(Exception, match=r"repeatability\.tpot_p50.*must be a number >= 0"):
        load_profile(tmp_path / "bad.yaml")


def test_a_value_another_equally_good_start_puts_far_away_is_not_pinned():
    """A replay's objective can have separate minima that the slopes at the best one cannot
    see: here the step scatter fits exactly at 0.03 and at 0.3 (the figures, not a replay,
    are made up so that the two exist). Read from the slopes alone it was "pinned x/÷1.002";
    the search's other start ended at the other minimum, as good, so the scatter is free within
    a factor of 10, while bandwidth, which alone sets the throughput, stays pinned."""
    from bench.sim.user_calibration import _fit

    def replays(eff: dict) -> list:
        cv = eff["step_cv"]
        bump = (math.log(cv / 0.03) * math.log(cv / 0.3)) ** 2
        return [({"tpot_p50": 0.02 * (1 + bump), "output_tps": 1000 * eff["mbu"] / 0.8}, {}, {})]

    point = ObservedPoint(
        "run", 0, "rate 1/s", np.zeros((1, 3)), {"tpot_p50": 0.02, "output_tps": 1000.0}
    )
    prof = _fit([point], DEVICE, SETTINGS, None, 60, 3, replays)
    got = {p.name: p for p in prof.params}
    assert got["step_cv"].value == pytest.approx(0.03, rel=0.05)
    assert got["step_cv"].spread >= 9 and not got["step_cv"].pinned
    assert got["mbu"].value == pytest.approx(0.8, rel=0.01) and got["mbu"].pinned
