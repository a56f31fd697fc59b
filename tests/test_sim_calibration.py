"""Calibration: the worked example, and the simulator against every published point it can express.

The validation figures are pinned: if a profile figure, an efficiency parameter or the cost model
changes and the error against published measurements rises, these fail. Re-run
`python -m bench.sim.calibration` (add --fit to refit efficiency.yaml) and look at the table
before touching a bound. The formula-clock table of all 60 points takes well under a second;
leave-one-source-out (nine refits) and the engine clock (closed loops in virtual time) take
minutes and are @slow. test_representative_points_fast is the quick check of both clocks.
"""

import re
from pathlib import Path

import pytest

from bench.sim.calibration import (
    DISAGG_ROW,
    HELD_OUT_YAML,
    LOSS_GRID,
    MTP_ROW,
    STEP_WEIGHT,
    STEPS_HELD_ROW,
    STEPS_ROW,
    Loss,
    Point,
    Sim,
    choose_loss,
    decode_step_points,
    disagg_held_out,
    disaggregated,
    error_row,
    fit,
    fit_params,
    held_out_document,
    leave_one_source_out,
    load_published,
    loss_table,
    mean_abs_error,
    mtp_speedups,
    nim_closed_loop,
    pareto_interpolate,
    points_per_parameter,
    ratio_value,
    reproduce,
    source_disagreements,
    steps_held_out,
    summary,
    validate,
)
from bench.sim.engine import Engine
from bench.sim.profiles import EFFICIENCY_YAML, get_gpu
from bench.sim.profiles.per_request_runs import nim_s75
from bench.sim.roofline import Deployment, parse_parallel, steady_state

ROOT = Path(__file__).resolve().parents[1]

# Ceilings on the error, from the figures reached when efficiency.yaml was last fitted (formula
# clock; 14 bounded parameters, device-reported memory, each engine's own memory arithmetic,
# gpt-oss GEMMs at the rate the engines run them, a per-layer step overhead, the embedding
# gathered and the LM head on logit rows only, GEMM efficiency rising with a step's token rows
# and a routed expert's with its own rows, experts read at their own bandwidth, one bandwidth
# and one GEMM efficiency for every engine): mean abs. error 13.0% (dense 6.3%, MoE 16.7%, AMD
# 11.9%), worst point 91.5% (ix-b200-dsr1-fp8-198). The 16-parameter fit before the row ramps
# read 14.6% (dense 9.2%, MoE 17.7%) in sample, 22.1% held out by source (17.7% now) and 177.6%
# on the six points then added after the fit (15.0% on those six now). The target (8%
# in sample) is missed. A new source adds points without touching these: only the error counts.
# 12.7% over 69 since the fourth refit (GEMM tile floor, vLLM's batch limits by device; 13.5%
# before it; 13.0% on the 60)
# 11.8% since the sixth refit (fitted on the fronts the sources searched: MoE 13.5%, AMD 14.2%,
# dense 7.2%)
PINNED_MAE = 0.135
PINNED_MAE_DENSE = 0.085  # 8.1% since the decode steps [S84] joined the fit (7.0% before)
PINNED_MAE_MOE = 0.175
# 14.2% after the sixth refit (11.9% after the fourth, 15.2% before it: batch 1 no longer
# compute-bound); 12.7% over 15 since CDNA3's MLA layers are timed apart (MI300X's and
# MI325X's DeepSeek-R1 fronts at 8k/1k -13..+12%, from -16..+22%)
PINNED_MAE_AMD = 0.14
PINNED_MAX_ABS = (
    0.92  # reached 0.915 (ix-b200-dsr1-fp8-198); 0.545 since S84 joined the fit, 0.564 now
)


def _ideal(gpu: str) -> Deployment:
    """No efficiency loss, no overhead: the pure bandwidth floor of the worked example."""
    return Deployment.build(
        gpu, "llama-3.3-70b", "fp8", mbu=1.0, mfu=1.0, t_fix_s=0.0, t_layer_s=0.0, t_tok_s=0.0
    )


@pytest.mark.parametrize("gpu,ms", [("B200", 9.16), ("H100", 21.06)])
def test_worked_example_bandwidth_floor(gpu: str, ms: float) -> None:
    # seed 000: 70.55 GB / 7.7 TB/s = 9.2 ms per step (~110 tok/s); H100 at 3.35 TB/s 21.1 ms.
    # The checkpoint is 72.65 GB (its embedding table and LM head in BF16 [S76]); a step reads
    # 70.55 GB of it: the 2.1 GB embedding table is gathered (one row per token), not
    # streamed, and the BF16 head (2.1 GB) is read once, so 9.16 and 21.06 ms
    step = _ideal(gpu).step_time(1, 1, 0, 0)
    assert step * 1e3 == pytest.approx(ms, rel=0.01)


def test_worked_example_b200_tokens_per_second() -> None:
    assert 1 / _ideal("B200").step_time(1, 1, 0, 0) == pytest.approx(110, rel=0.05)


def test_one_bandwidth_per_gpu() -> None:
    # the only place a bandwidth lives is gpus.yaml; nothing in the code restates one
    assert get_gpu("B200").hbm_bw_tbs == 7.7 and get_gpu("B200-192").hbm_bw_tbs == 8.0
    code = "\n".join(p.read_text() for p in (ROOT / "bench" / "sim").rglob("*.py"))
    assert not re.search(r"\b(7\.7|3\.35|4\.8)e12\b", code)


def test_calibrated_batch1_is_floor_plus_losses() -> None:
    for gpu, floor in [("B200", 9.16e-3), ("H100", 21.06e-3)]:
        step = Deployment.build(gpu, "llama-3.3-70b", "fp8").step_time(1, 1000, 0, 0)
        assert floor * 1.1 < step < floor * 1.7


def test_kv_capacity_worked_example() -> None:
    # seed 000: 180 GB B200, ~10 GB reserved -> ~100 GB of KV ~ 610k tokens. vLLM's
    # gpu_memory_utilization 0.9 reserves 18 GB instead, so ~558k tokens: within 10%.
    dep = Deployment.build("B200", "llama-3.3-70b", "fp8")
    assert dep.kv_bytes_per_token == 163840
    assert dep.kv_capacity_tokens(0.90) == pytest.approx(610_000, rel=0.10)
    assert Engine(dep).capacity_tokens == dep.kv_capacity_tokens(0.90)


def test_nvfp4_halves_weight_read() -> None:
    # the decoder's linear layers shrink to 0.5625 bytes per parameter (4 bits + FP8 scales);
    # the embedding table and LM head stay BF16 in both checkpoints [S76]
    fp8 = Deployment.build("B200", "llama-3.3-70b", "fp8")
    fp4 = Deployment.build("B200", "llama-3.3-70b", "fp4")
    kept = fp8.model.embedding_params() * 2
    assert (fp4.weight_bytes - kept) / (fp8.weight_bytes - kept) == pytest.approx(0.5625)


# -- the reference file ------------------------------------------------------------------------


def test_every_point_and_every_cited_source_is_in_the_reference_file() -> None:
    pub = load_published()
    assert pub.scored and all(p.source in pub.sources for p in pub.points)
    assert all(p.reason for p in pub.points if not p.expressible)
    cited = set()
    for path in (
        [ROOT / "README.md", ROOT / "bench" / "data" / "prices.yaml"]
        + list((ROOT / "bench" / "sim" / "profiles").glob("*.yaml"))
        + list((ROOT / "bench" / "hardware").glob("*.yaml"))
    ):
        cited |= set(re.findall(r"\[(S\d+[a-z]?)\]", path.read_text()))
    assert cited and cited <= set(pub.sources), cited - set(pub.sources)


def test_every_fitted_parameter_is_bounded_and_observed() -> None:
    # issue 25 item 2: few parameters, each with a physical range and a source, the fit inside
    # it, and at least 4 scored observations (points or GPU ratios) per free parameter; in all,
    # the decode steps [S84] count at the weight the fit gives them (0.5 each: 168 steps of one
    # source weigh 84 observations; 69 points and 6 ratios alone are 3.95 per parameter for 19)
    import yaml

    data = yaml.safe_load(EFFICIENCY_YAML.read_text())
    params = {q.name: q for q in fit_params()}
    values = data["fitted_values"]
    assert set(values) == set(params)
    pub = load_published()
    counts = points_per_parameter(pub.scored, pub.ratios)
    for name, q in params.items():
        assert q.source and q.low < q.high, name
        assert q.low <= values[name]["value"] <= q.high, (name, values[name])
        assert counts[name] >= 4, (name, counts[name])
    observed = len(pub.scored) + len(pub.ratios) + STEP_WEIGHT * len(decode_step_points())
    assert observed / len(params) >= 4
    # the profiles the fit wrote are exactly the fitted values expanded, each naming its basis
    assert all(f["source"].startswith("fitted on ") for f in data["fitted"])


# -- calibration fixes (issue 19 item 4) -------------------------------------------------------


def test_sweep_skips_deployments_that_do_not_fit() -> None:
    # DeepSeek-R1 FP8 (671 GB) does not fit on 1, 2 or 4 B200s: the sweep skips them, no crash
    p = next(p for p in load_published().scored if p.id == "ix-b200-dsr1-8k1k-32")
    r = reproduce(p)
    assert r.simulated > 0 and not re.search(r"\b(tp|dep)[124]\b", r.config), r.config


def test_unreachable_interactivity_has_no_value() -> None:
    # np.interp used to return the front's end value for a target beyond it: a flat, wrong figure
    p = Point(
        id="x", set="dense", kind="interactivity", gpu="H100", model="llama-3.3-70b",
        precision="fp8", engine="vllm", isl=1000, osl=1000, measured=100.0, source="S15",
        sweep="dense", interactivity=2000.0,
    )  # fmt: skip
    r = reproduce(p)
    assert r.simulated == 0 and r.error == -1.0 and "front spans" in r.config
    front = [(10.0, 500.0, "a"), (20.0, 300.0, "b")]
    assert pareto_interpolate(Point(**{**p.__dict__, "interactivity": 5.0}), front).simulated == 0
    assert (
        pareto_interpolate(Point(**{**p.__dict__, "interactivity": 15.0}), front).simulated == 400
    )


def test_gptoss_on_hopper_keeps_kv_in_bf16() -> None:
    # TensorRT-LLM on Hopper runs gpt-oss W4A16 [S74]; its options: kv_cache_config dtype fp8,
    # "Hopper: use auto" [S45], i.e. the checkpoint's BF16: half the sequences fit, and each decode step reads twice the bytes
    hopper = Deployment.build("H200", "gpt-oss-120b", "mxfp4-a16", engine="trtllm")
    blackwell = Deployment.build("B200", "gpt-oss-120b", "mxfp4", engine="trtllm")
    assert hopper.kv_precision.name == "bf16" and blackwell.kv_precision.name == "fp8"
    assert hopper.kv_bytes_per_token == 2 * blackwell.kv_bytes_per_token


def test_sweeps_follow_the_sources_search() -> None:
    pub = load_published()
    pts = {p.id: p for p in pub.scored}
    # MI300X: TP8, concurrency 4-64, no MTP entry in InferenceX's AMD config [S69]
    front = Sim().front(pts["ix-mi300x-dsr1-8k1k-42"])
    concs = {int(cfg.split(" c")[-1]) for _, _, cfg in front}
    assert front and all(cfg.startswith("tp8 c") for _, _, cfg in front), front
    assert min(concs) >= 4 and max(concs) <= 64
    # B200 DeepSeek-R1 FP8: disaggregated runs put 1-4 sequences per decode worker [S68], so
    # the sweep starts at 1 and 198 tok/s/user is inside the front (it was -100%, unreachable)
    assert pub.concurrency[:2] == [1, 2]
    assert reproduce(pts["ix-b200-dsr1-fp8-198"]).simulated > 0


# -- validation against every expressible published point (issue 19 item 3) -------------------

# (point, error bound): one of each kind and family, all within the +-25% target
REPRESENTATIVE = [
    ("h200-70b-b1", 0.13),  # batch 1: the bandwidth floor plus losses (-11%; -6% before S84)
    ("trt-h100-70b-1k1k", 0.10),  # TensorRT-LLM offline maximum, dense, TP2
    ("ix-b200-70b-fp8-108", 0.15),  # InferenceX Pareto interpolation, vLLM (-13%)
    ("trt-b200-q235-1k1k", 0.15),  # MoE with expert parallelism (DEP4)
]


def test_representative_points_fast() -> None:
    # the quick check of the whole chain, both clocks: the formula the fit uses and the engine
    # users run (`sim run`, `sim serve`), memoised so shared configurations run once
    pts = {p.id: p for p in load_published().scored}
    formula, engine = Sim(), Sim(clock="engine")
    for pid, bound in REPRESENTATIVE:
        f = formula.reproduce(pts[pid])
        assert abs(f.error) <= bound, (pid, f.error, f.config)
        if not pid.startswith("ix-"):  # a whole InferenceX sweep in the engine is @slow
            e = engine.reproduce(pts[pid])
            assert abs(e.error) <= bound and e.simulated == pytest.approx(f.simulated, rel=0.08)
    ratios = {r.id: r for r in load_published().ratios}
    # reached +11.2%, +10.1% (+10.1%, +9.2% before the sixth refit, fitted on the fronts the
    # sources searched)
    for rid in ("trt-b200-h100-70b", "mlperf-b200-h100"):
        assert formula.ratio(ratios[rid]) == pytest.approx(ratios[rid].measured, rel=0.12), rid


@pytest.fixture(scope="module")
def results():
    return validate()


def test_validation_error_is_pinned(results) -> None:
    s = summary(results)
    from bench.sim.calibration import table

    report = table(results)
    assert s["mae"] <= PINNED_MAE, report
    assert s["mae_dense"] <= PINNED_MAE_DENSE, report
    assert s["mae_moe"] <= PINNED_MAE_MOE, report
    assert s["mae_amd"] <= PINNED_MAE_AMD, report
    assert s["max_abs"] <= PINNED_MAX_ABS, report


def test_readme_carries_the_validation_table_the_fit_gives(results) -> None:
    """The README's validation table is benchmarks/simulator.py's: its in-sample, after-the-fit
    disaggregated and MTP rows are recomputed here (the held-out row is checked against
    held_out.yaml by the slow LOSO test, and the engine-clock row by the slow engine test's
    ceiling)."""
    readme = (ROOT / "README.md").read_text()
    after = validate(points=load_published().after_fit)
    for row in (
        error_row("in sample (formula clock, the fit's)", results),
        error_row("points added after the fit", after),
        error_row(DISAGG_ROW, disaggregated()),
        error_row(MTP_ROW, mtp_speedups()),
        error_row(STEPS_ROW.format(w=STEP_WEIGHT), validate(points=decode_step_points())),
    ):
        assert row in readme, row


def test_disaggregated_fronts_count_both_pools() -> None:
    """Points whose source also ran xPyD splits [S68] are fitted and scored with those splits
    in their fronts (every GPU of both pools counted, at most 72), with the single-node runs
    from the scripts' concurrency 4; disagg=False keeps a single-pool front."""
    pts = {p.id: p for p in load_published().points}
    split = {r.point.id: r for r in disaggregated()}
    assert set(split) == {i for i, p in pts.items() if p.disagg and p.expressible}
    is_split = re.compile(r"^(\d+)P(\d+)D (\w+)/(\w+)")
    sim = Sim()
    for pid in ("ix-b200-dsr1-fp8-198", "ix-gb200-dsr1-8k1k-120"):
        front = sim.front(pts[pid])
        for _, _, cfg in front:
            m = is_split.match(cfg)
            if m:
                x, y, pre, dec = m.groups()
                assert int(x) * _gpus(pre) + int(y) * _gpus(dec) <= 72, cfg
            else:  # a single-node run, where the source ran those too
                assert pts[pid].disagg == "also" and int(cfg.rsplit("c", 1)[1]) >= 4, cfg
        assert any(is_split.match(c) for *_, c in front)
    assert all(is_split.match(c) for *_, c in sim.front(pts["ix-gb200-dsr1-8k1k-120"]))
    # disagg=False: single-pool fronts (the fit and the validation score these points on the
    # fronts above, the default)
    single = reproduce(pts["ix-b200-dsr1-fp4-73"], disagg=False)
    assert not is_split.match(single.config.split(" .. ")[0])
    assert is_split.match(reproduce(pts["ix-b200-dsr1-fp4-73"]).config.split(" .. ")[0])
    # a split feeds its decode pool without prompts in its steps: more per GPU at 73 tok/s/user
    assert split["ix-b200-dsr1-fp4-73"].simulated > single.simulated


def _gpus(parallel: str) -> int:
    tp, dp, _ = parse_parallel(parallel)
    return tp * dp


def test_sources_publishing_one_curve_are_compared() -> None:
    # S19b and S19c both publish B200 FP8 DeepSeek-R1 8k/1k: they agree where the simulator
    # misses most (73-75 tok/s/user) and differ beyond the target at 120 and 164
    lines = source_disagreements()
    assert any(x.startswith("ok ix-b200-dsr1-8k1k-75 (S19b)") for x in lines), lines
    assert any(x.startswith("!! ix-b200-dsr1-8k1k-120 (S19b)") for x in lines), lines


def test_engines_share_the_hardware_path_and_differ_in_memory_and_scheduling() -> None:
    """Bandwidth and GEMM efficiency are the GPU's and its kernel libraries': one value for
    every engine. Fitted per engine (16 parameters) the three MBUs all went to the range's
    top and the held-out error was 27.2% against 22.7% shared (the engine-scoped values
    followed the MoE points of one engine's sources). What differs is what the engines
    decide (how much KV they keep and whom they admit), their own front end's per-token work
    and one kernel of their own: vLLM's grouped GEMMs for block-scaled FP8 experts, which its
    own decode steps [S84] put behind its BF16 ones at the same parallelism (Qwen3-235B-A22B
    FP8 24.6 against 19.0 ms at 8 sequences on 4 x B200) although they read half the bytes.
    Each is vLLM's, the engine its sources measure; no source measures the others'."""
    from bench.sim.calibration import fit_params

    scoped = {p.name for p in fit_params() if "." in p.name}
    assert scoped == {"t_fe_tok_s.vllm", "fp8_moe_mfu_ratio.vllm"}
    trt = Deployment.build("B200", "llama-3.3-70b", "fp4", engine="trtllm")
    vllm = Deployment.build("B200", "llama-3.3-70b", "fp4", engine="vllm")
    assert trt.eff.mbu == vllm.eff.mbu and trt.eff.mfu == vllm.eff.mfu
    assert trt.kv_capacity_tokens() != vllm.kv_capacity_tokens()
    # the FP8 expert kernel is the engine's: BF16 experts and dense FP8 GEMMs are shared
    moe = {
        (engine, fmt): Deployment.build("B200", "qwen3-235b-a22b", fmt, 4, engine=engine)
        for engine in ("vllm", "sglang") for fmt in ("fp8", "bf16")
    }  # fmt: skip
    assert moe["vllm", "fp8"]._expert_format_ratio < moe["sglang", "fp8"]._expert_format_ratio
    assert moe["vllm", "bf16"]._expert_format_ratio == moe["sglang", "bf16"]._expert_format_ratio
    assert trt._expert_format_ratio == vllm._expert_format_ratio == 1.0


def test_gpu_ratios(results) -> None:
    # MLPerf / TensorRT-LLM per-GPU ratios, simulated at the same method (the fit scores them
    # too). Reached (2026-12-06, the fourth refit: the GEMM tile floor and vLLM's batch limits
    # by device): trt H200/H100 +11.6% (+10.4% before it), trt B200/H100 +9.7% (+8.1%), MLPerf
    # B200/H100 +8.8% (+7.2%), B200/H200 +1.1%, H200 (one GPU) / H100 (two) +7.6%; MI300X/H100
    # -27% (-25% before, +1% on 2026-12-05): AMD's MLPerf v4.1 submission (one MI300X, its
    # tuned FP8 GEMMs) is 1.36x what AMD's own public vLLM container [S77], beside it in the
    # AMD factors' fit, makes of the same GPU's compute
    got = {r.id: (r.measured, ratio_value(r)) for r in load_published().ratios}
    for rid in ("trt-h200-h100-70b", "trt-b200-h100-70b", "mlperf-b200-h100"):
        assert got[rid][1] == pytest.approx(got[rid][0], rel=0.12), rid
    for rid in ("mlperf-b200-h200", "mlperf-h200-h100"):
        assert got[rid][1] == pytest.approx(got[rid][0], rel=0.20), rid
    assert got["mlperf-mi300x-h100"][1] == pytest.approx(got["mlperf-mi300x-h100"][0], rel=0.3)


def test_engine_clock_agrees_with_the_formula() -> None:
    # the fit runs the steady-state formula; users run the engine: they must agree
    pts = {p.id: p for p in load_published().scored}
    for pid in ("h200-70b-b1", "trt-h100-70b-1k1k", "trt-b200-q235-1k1k"):
        f = reproduce(pts[pid]).simulated
        e = reproduce(pts[pid], clock="engine").simulated
        assert e == pytest.approx(f, rel=0.08), pid


# -- MoE, EP, MTP, rack scale (issue 19 items 1-2) ---------------------------------------------


def test_dep_replicates_attention_and_spreads_experts() -> None:
    tp8 = Deployment.build("B200", "deepseek-r1", "fp8", 8)
    dep8 = Deployment.build("B200", "deepseek-r1", "fp8", dp=8, ep=8)
    # MLA's latent KV is replicated on TP ranks, split by DP: DEP holds ~8x the sequences
    assert dep8.kv_capacity_tokens() > 5 * tp8.kv_capacity_tokens()
    # all-to-all cost appears only with EP; all-reduce only with TP
    assert (
        dep8._comm_time(1000) > 0
        and Deployment.build("B200", "deepseek-r1", "fp8", 8)._comm_time(1) > 0
    )


def test_mla_decode_attention_is_compute_bound() -> None:
    dep = Deployment.build("H100", "deepseek-r1", "fp8", dp=8, ep=8, mtp=False)
    ctx = 64 * 8000.0
    kv_time = ctx / 8 * dep.kv_bytes_per_token / dep._bw
    flops_time = (
        ctx / 8 * dep.model.attn_pair_flops(decode=True) / (dep.attn_flops * dep.eff.mfu_attn)
    )
    assert flops_time > kv_time


def test_mtp_raises_interactivity() -> None:
    off = Deployment.build("B200", "deepseek-r1", "fp8", dp=8, ep=8, engine="sglang", mtp=False)
    on = Deployment.build(
        "B200", "deepseek-r1", "fp8", dp=8, ep=8, engine="sglang", mtp=True, mtp_acceptance=0.85
    )  # the validation's acceptance (its sources' random-token prompts); 1.92 by default [S80]
    assert on.mtp_gain == pytest.approx(1.85)
    s_off, s_on = steady_state(off, 8192, 1024, 8), steady_state(on, 8192, 1024, 8)
    assert 1.3 < s_on["interactivity"] / s_off["interactivity"] < 1.85


def test_rack_scale_nvl72() -> None:
    gb = Deployment.build("GB200", "deepseek-r1", "fp8", dp=72, ep=72, engine="sglang")
    assert gb.gpus == 72 and gb.gpu.rack_gpus == 72
    with pytest.raises(ValueError, match="scale-up domain"):
        Deployment.build("B200", "deepseek-r1", "fp8", dp=16, ep=16)
    # wide EP on one NVLink domain beats an 8-GPU node per GPU at the same interactivity, on
    # the fronts both sources searched (published 3,988 against 1,110 tok/s per GPU: 3.6x)
    sim = Sim()
    pts = {p.id: p for p in sim.pub.scored}
    gb_pt, b_pt = pts["ix-gb200-dsr1-8k1k-120"], pts["ix-b200-dsr1-8k1k-120"]
    assert sim.reproduce(gb_pt).simulated > 2 * sim.reproduce(b_pt).simulated


# -- slow: held-out error and the engine clock -------------------------------------------------

# Since AMD's own figures [S77] fit the AMD factors (2026-12-06, third refit): the 19 points
# after the fit 24.4% (MI325X gpt-oss -6%..+27%); held out and the engine clock below.
# Since the decode steps [S84] joined the fit (2026-12-06): held out 18.5%, the engine clock in
# sample 13.1%, the 28 points added after the fit 38.3% (MI325X gpt-oss +59%..+133%), the decode
# steps with S84 held out 30.7%. Before (the figures below): held out (formula clock): 17.7%
# mean over the 60 fitted points, each scored by a fit without
# its source (target 15%: missed; 22.1% with the 16-parameter fit before the row-dependent
# GEMM efficiency, 28.9% before gpt-oss's GEMM rates and the per-layer overhead); the engine
# clock in sample 13.0%; the 27 points added after the fit 38.6%: MI325X (with the profile from
# AMD's datasheet) 15.0% (DeepSeek-R1 -13%..+24%, gpt-oss on vLLM -27%..-4%; +206%..+480%
# before the row ramps); AMD's own vLLM figures for MI300X [S77] +15%..+54% at maximum
# throughput, -10% at batch 1; InferenceX's DeepSeek-R1 FP4 1k/1k fronts with and without MTP
# [S78][S79] -51%..+226% (27.5% over the first 15 before them); AMD's SGLang DeepSeek-V3 at
# one request [S81] +169% (38.6% over 27 before it). Ceilings, not point counts.
# 20.9% over 69 since S77 fits the AMD factors (held out, its nine read 29%, as they did after
# the fit; on the other 60 19.6%: S17's MI300X DeepSeek held out reads -38% from AMD's dense vLLM
# figures); 18.8% on the 60 before, 17.7% before the decode steps [S84] joined the fit; 20.6%
# after the fourth refit (20.1% with its GEMM tile floor alone), 18.9% since the fifth chose the
# fit's loss by this figure (calibration.choose_loss); 16.3% since the sixth, fitted on the fronts
# the sources searched, with vLLM's block-FP8 expert factor and MLA's per-layer cost; 14.8%
# over 72 since CDNA3's MLA layers are timed apart and AMD's points fit the vendor stage alone
PINNED_LOSO_MAE = 0.16
PINNED_ENGINE_MAE = 0.135
# 27.6% of 19 since the sixth refit (TensorRT-LLM's FP4 DeepSeek-R1 without MTP reads slow:
# -21..-55%); 25.4% after the fifth, 26.3% after the fourth, 24.4% before it; 39.2% once
# 22.3% of 16 since CDNA3's MLA layers are timed apart (S18's three points joined the fit;
# AMD's DeepSeek-V3 at one user [S81] +36% from +119%)
PINNED_AFTER_FIT_MAE = 0.25


def test_points_added_after_the_fit_are_scored_never_fitted() -> None:
    import yaml

    pub = load_published()
    after = {p.id for p in pub.after_fit}
    assert after and not after & {p.id for p in pub.scored}
    fitted_on = yaml.safe_load(EFFICIENCY_YAML.read_text())["fitted"][0]["source"]
    shared = [p for p in pub.scored if p.vendor != "amd"]
    assert fitted_on.startswith(f"fitted on {len(shared)} points and 5 ratios")
    assert f"and {len(decode_step_points())} decode steps of S84" in fitted_on
    # AMD's figures inform AMD's parameters alone (the fit's second stage): its own vLLM
    # figures [S77] and InferenceX's MI300X and MI325X DeepSeek-R1 fronts
    amd = [p for p in pub.scored if p.vendor == "amd"]
    assert {p.source for p in amd} == {"S17", "S18", "S77"}
    assert fitted_on.endswith(
        f"the AMD parameters on {len(amd)} points and 1 ratio of S17, S18, S77"
    )
    res = validate(points=pub.after_fit)
    assert mean_abs_error(res) <= PINNED_AFTER_FIT_MAE, [(r.point.id, r.error) for r in res]


def test_amds_own_figures_are_reproduced_at_their_runs_batch_limit() -> None:
    """AMD's vLLM throughput test [S77] runs each row at its own max-num-seqs (3,200 for 70B at
    128/2048), not vLLM's default: the point's max_conc is the run's limit. They inform the AMD
    factors alone (the fit's second stage): one factor for compute and bandwidth read the maxima
    +7% to +59% and batch 1 -8%; since the fourth refit (2026-12-06) -16% to +17% and batch 1
    -4% (its weight reads; -21% before the dense GEMMs' tile floor); since CDNA3's MLA layers
    are timed apart (2026-12-07: ROCm's GEMMs at 0.39 of NVIDIA's efficiency, its HBM at
    NVIDIA's fraction of peak) -10% to +26%, batch 1 +8%."""
    pub = load_published()
    amd = {p.id: p for p in pub.scored if p.source == "S77"}
    assert len(amd) == 9 and all(p.vendor == "amd" for p in amd.values())
    res = {r.point.id: r for r in validate(points=list(amd.values()))}
    assert res["amd-mi300x-70b-128-2048"].config == "tp8 c3200"
    assert res["amd-mi300x-405b-2048-2048"].config == "tp8 c500"
    assert all(abs(r.error) <= 0.3 for r in res.values()), [(k, r.error) for k, r in res.items()]


def test_cdna3_mla_layers_are_timed_apart_and_carry_to_amds_own_runs() -> None:
    """DeepSeek's MLA layers on CDNA3 (MI300X, MI325X) have their own per-layer time, fitted
    on InferenceX's fronts of both GPUs [S17][S18]: with one time for every GPU, AMD's factors
    read CDNA3's slow few-sequence steps as slow HBM (0.66 of NVIDIA's), every AMD GPU inherited
    it, and AMD's own SGLang run of DeepSeek-V3 at one user on MI300X [S81], never fitted, read
    +119%, its MTP speed-ups at 1-8 users -10% to -20%."""
    import yaml

    from bench.sim.profiles import efficiency_for

    fitted = yaml.safe_load(EFFICIENCY_YAML.read_text())["fitted_values"]
    cdna3, shared = fitted["t_mla_layer_s_cdna3"]["value"], fitted["t_mla_layer_s"]["value"]
    assert cdna3 > 5 * shared  # sglang#3237: ~590 us a layer at 4 sequences on MI300X
    for gpu, want in (("MI300X", cdna3), ("MI325X", cdna3), ("MI355X", shared), ("H200", shared)):
        for engine in ("sglang", "vllm"):
            got = efficiency_for(get_gpu(gpu), "fp8", engine).t_mla_layer_s
            assert got == pytest.approx(want), (gpu, engine)
    assert fitted["t_mla_layer_s_cdna3"]["observations"] == 6
    pub = load_published()
    b1 = next(p for p in pub.after_fit if p.id == "amd-mi300x-dsv3-b1")
    assert abs(validate(points=[b1])[0].error) <= 0.40
    few = [r for r in mtp_speedups() if re.fullmatch(r"amd-mi300x-dsv3-mtp2-c[1248]", r.point.id)]
    assert len(few) == 4 and all(abs(r.error) <= 0.10 for r in few), [r.error for r in few]


def test_a_gpu_scoped_fit_parameter_names_what_it_sets_or_is_refused(tmp_path) -> None:
    """A `scope: gpu` parameter must say which efficiency parameter it sets and on which GPUs:
    without them the fit would free a value no deployment reads."""
    path = tmp_path / "efficiency.yaml"
    path.write_text(
        "schema_version: 1\nparameters: {}\nfit:\n  t_x:\n    initial: 1.0\n"
        "    range: [0.0, 2.0]\n    scope: gpu\n    sets: t_mla_layer_s\n    source: s\n"
    )
    with pytest.raises(
        ValueError, match=r"efficiency.yaml: fit t_x: scope gpu needs `sets` and `gpus`"
    ):
        fit_params(path)
    named = tmp_path / "named.yaml"  # another file: parsed files are cached by path
    named.write_text(path.read_text() + "    gpus: [MI300X]\n")
    (q,) = fit_params(named)
    assert (q.name, q.sets, q.gpus, q.low, q.high) == (
        "t_x",
        "t_mla_layer_s",
        ("MI300X",),
        0.0,
        2.0,
    )


def test_amds_factors_carry_to_a_gpu_and_model_they_never_saw() -> None:
    """InferenceX's gpt-oss-120b on 8 x MI325X (W4A16 on vLLM [S16]) is in no fit: with one AMD
    factor fitted on four observations it read +55% to +145%; with AMD's own figures fitting
    a compute and a bandwidth factor -6% to +27%, and -32% to -4% since the fourth refit."""
    pub = load_published()
    pts = [p for p in pub.after_fit if p.id.startswith("ix-mi325x-gptoss")]
    assert len(pts) == 3
    errs = [r.error for r in validate(points=pts)]
    assert max(abs(e) for e in errs) <= 0.35, errs


def test_vllm_front_end_sets_the_pace_of_large_batches() -> None:
    """vLLM detokenises and streams every output token in a front-end process beside the engine
    (t_fe_tok_s, fitted on ML.ENERGY's vLLM decode steps [S84]): overlapped with the GPU, it
    adds nothing at a few sequences and sets the pace once it is the slower, per data-parallel
    rank. TensorRT-LLM has no measured front end. AMD's vLLM test at 3,200 sequences [S77],
    which the front end's fit never saw, is read at that pace (+52% without it)."""
    kw = {"gpu": "B200", "model": "llama-3.1-8b", "precision": "bf16"}
    vllm, trt = Deployment.build(**kw, engine="vllm"), Deployment.build(**kw, engine="trtllm")
    fe = vllm.eff.t_fe_tok_s
    assert 3e-5 <= fe <= 1.5e-4 and trt.eff.t_fe_tok_s == 0
    ctx = 1500
    assert vllm.step_time(8, 8 * ctx, 0, 0) == pytest.approx(trt.step_time(8, 8 * ctx, 0, 0))
    assert vllm.step_time(1024, 1024 * ctx, 0, 0) == pytest.approx(1024 * fe)
    assert trt.step_time(1024, 1024 * ctx, 0, 0) < 1024 * fe
    two = Deployment.build(**kw, engine="vllm", dp=2)  # two engines, two front ends
    assert two.step_time(2048, 2048 * ctx, 0, 0) == pytest.approx(1024 * fe)
    amd = next(p for p in load_published().scored if p.id == "amd-mi300x-70b-128-2048")
    (r,) = validate(points=[amd])
    assert r.simulated == pytest.approx(1 / fe / 8, rel=0.01)  # one front end for 8 GPUs
    assert abs(r.error) <= 0.10, r.error


@pytest.mark.slow
def test_leave_one_source_out_is_pinned_and_is_what_the_ranges_state() -> None:
    """The held-out errors every simulated range reads (held_out.yaml) are the fit's own: a
    refit that does not rewrite them (--loso --write-held-out) fails here."""
    import yaml

    pub = load_published()
    held = leave_one_source_out(pub.scored)
    assert mean_abs_error(held) <= PINNED_LOSO_MAE
    row = error_row("leave-one-source-out (each source held out of the fit)", held)
    assert row in (ROOT / "README.md").read_text(), row
    after = validate(points=pub.after_fit)
    fresh = held_out_document(held, after, disagg_held_out(held, after), mtp_speedups())
    stored = yaml.safe_load(HELD_OUT_YAML.read_text())
    key = lambda rows: {r["id"]: r["error"] for r in rows}  # noqa: E731
    assert key(stored["points"]) == pytest.approx(key(fresh["points"]), abs=0.01)
    assert key(stored["ttft"]) == pytest.approx(key(fresh["ttft"]), abs=0.01)
    pairs = lambda rows: {(r["a"], r["b"]): r["error"] for r in rows}  # noqa: E731
    assert pairs(stored["gpu_pairs"]) == pytest.approx(pairs(fresh["gpu_pairs"]), abs=0.01)
    runs = lambda rows: {(r["suite"], r["run"], r["figure"]): r["error"] for r in rows}  # noqa: E731
    assert runs(stored["per_request"]) == pytest.approx(runs(fresh["per_request"]), abs=0.01)


@pytest.mark.slow
def test_decode_steps_held_out_of_the_fit_are_what_the_readme_says() -> None:
    """The decode steps [S84] scored by a fit that never saw them: worse than in the fit (they
    inform it), within a ceiling, and the README's row is this one."""
    held = steps_held_out(load_published().scored)
    fitted = validate(points=decode_step_points())
    assert mean_abs_error(fitted) < mean_abs_error(held) <= 0.33  # 26.4% and 30.7%
    row = error_row(STEPS_HELD_ROW, held)
    assert row in (ROOT / "README.md").read_text(), row


@pytest.mark.slow
def test_engine_clock_validation_is_pinned() -> None:
    res = validate(clock="engine")
    assert mean_abs_error(res) <= PINNED_ENGINE_MAE


@pytest.mark.parametrize(("isl", "osl", "conc", "ttft_ms", "itl_ms", "tps"), nim_s75())
def test_moderate_batch_decode_predicts_an_independent_source(isl, osl, conc, ttft_ms, itl_ms, tps):
    """Published measurements never fitted on [S75]: the engine clock at NIM's concurrency gives
    its inter-token latency and throughput within the dense category's error plus a margin:
    15%. Measured after the 2026-12-05 refit (GEMM efficiency rising with rows): ITL -9%, -6%,
    -4%, throughput +7%, -1%, -4%, and the batch-1 ITL -12% (-10/-9/-8%, +9/+5/+2% and -12%
    before). TTFT misses (-26%, -9%, -9%; -46%, -33%, -32% before: the simulated prefill is
    faster than NIM's); it is not asserted here but carried into every simulated TTFT's
    expected error (held_out.yaml's `ttft`, bench.sim.profiles.accuracy)."""
    from bench.metrics import summarize

    summary = summarize(nim_closed_loop(isl, osl, conc))
    itl = summary.metrics["itl"].as_dict()["mean"]
    assert itl == pytest.approx(itl_ms, rel=0.15)
    if tps is not None:
        assert summary.output_tokens_per_s == pytest.approx(tps, rel=0.15)


def test_the_fit_takes_the_loss_it_is_given() -> None:
    """A prior weight far above the residuals' holds every parameter at its initial value; none
    lets the points move them (the knob choose_loss scores reaches the search)."""
    points = [p for p in load_published().scored if p.source == "S46"]
    initial = {q.name: q.initial for q in fit_params()}
    _, held = fit(points, ratios=[], steps=[], loss=Loss(prior_weight=100.0))
    _, free = fit(points, ratios=[], steps=[], loss=Loss(prior_weight=0.0))
    assert held == pytest.approx(initial, rel=1e-3)
    assert free["mbu"] != pytest.approx(initial["mbu"], rel=0.05)
    assert Loss() in LOSS_GRID  # the published loss is among the settings it was chosen from


@pytest.mark.slow
def test_choose_loss_scores_each_setting_by_the_sources_held_out() -> None:
    """Two sources, two settings, each a fit and its leave-one-source-out fits: the prior that
    pins every parameter fits its points worse, and the table marks the lowest held out."""
    points = [p for p in load_published().scored if p.source in ("S46", "S47")]
    rows = choose_loss(points, grid=(Loss(), Loss(prior_weight=100.0)))
    chosen, pinned = rows
    assert chosen["in_sample"] < pinned["in_sample"]
    lowest = min(rows, key=lambda r: r["held_out"])
    table = loss_table(rows).splitlines()
    assert len(table) == 4 and sum("(lowest)" in line for line in table) == 1
    assert f"{lowest['held_out']:.1%} (lowest)" in table[2 + rows.index(lowest)]
