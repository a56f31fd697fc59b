"""The simulator's per-request error against published real-engine runs (issue 25, item 5)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from bench.sim.per_request import (
    RunError,
    by_suite,
    first_token_choices,
    first_token_latency,
    load_runs,
    per_request_errors,
    report,
    simulate,
    stated_coverage,
    summary,
)
from bench.sim.profiles import efficiency_for, get_gpu
from bench.sim.profiles.accuracy import COVERAGE
from bench.sim.profiles.per_request_runs import nim_s75

README = Path(__file__).resolve().parents[1] / "README.md"
MINIMAX, NIM = "minimax-m2.5-h200-vllm", "llama-3.3-70b-h100-nim"
P50_P99 = ("ttft_p50", "ttft_p99", "tpot_p50", "tpot_p99", "e2el_p50", "e2el_p99")


@pytest.fixture(scope="module")
def errors():
    """MiniMax's and NIM's runs (seconds); InferenceX's DeepSeek-R1 suites [S85] take minutes
    and are scored in the @slow test below."""
    return per_request_errors([r for r in load_runs() if r.suite in (MINIMAX, NIM)])


def test_runs_load_as_published():
    suites = {k: [e for e in load_runs() if e.suite == k] for k in (MINIMAX, NIM)}
    runs = suites[MINIMAX]
    assert len(runs) == 72  # InferenceX's MiniMax-M2.5 results directory, every file
    assert {r.parallel for r in runs} == {"tep8", "dep8"}
    for r in runs:
        assert r.source == "S82" and r.client == "vllm-bench" and r.prompts == 10 * r.concurrency
        m = r.measured
        assert set(m) == set(P50_P99) and all(v > 0 for v in m.values())
        # a request's end-to-end time is its TTFT plus 127 token gaps, so each median is below
        # the end-to-end one, and each p99 at least its median (a transcription check)
        assert m["ttft_p50"] < m["e2el_p50"] and (r.osl - 1) * m["tpot_p50"] < m["e2el_p50"]
        assert all(m[f"{k}_p50"] <= m[f"{k}_p99"] for k in ("ttft", "tpot", "e2el")), r.label
    nim = suites[NIM]
    assert len(nim) == 9 and {(r.source, r.client, r.parallel) for r in nim} == {
        ("S75", "genai-perf", "tp2")
    }
    for r in nim:
        assert set(r.measured) == {"ttft_mean", "tpot_mean"}
        # a closed loop's throughput is its users over a request's time (Little's law): TTFT
        # plus the token gaps; genai-perf's window and rounding leave a few per cent
        per_request_s = (r.measured["ttft_mean"] + (r.osl - 1) * r.measured["tpot_mean"]) / 1e3
        assert r.output_tps == pytest.approx(r.concurrency * r.osl / per_request_s, rel=0.08)


def test_nims_table_lives_in_one_place():
    # the TTFT checks and the moderate-batch ITL test read the per-request suite's rows below
    # the table's saturation: 100-250 users (917-921 tok/s) are its plateau
    rows = nim_s75()
    assert [(isl, osl, c) for isl, osl, c, *_ in rows] == [
        (5000, 500, 1), (5000, 500, 5), (5000, 500, 25), (5000, 500, 50), (500, 2000, 1)
    ]  # fmt: skip
    assert rows[1][3:] == (546.7, 21.83, 218.48)


def test_simulated_run_is_the_clients_measurement():
    run = next(r for r in load_runs() if r.parallel == "tep8" and r.isl == 4096)
    assert run.client == "vllm-bench"
    sim = simulate(run)
    assert sim["ttft_p50"] <= sim["ttft_p99"] and sim["tpot_p50"] <= sim["tpot_p99"]
    # one request's end-to-end time is its TTFT plus osl - 1 gaps of its TPOT
    assert sim["ttft_p50"] + (run.osl - 1) * sim["tpot_p50"] == pytest.approx(
        sim["e2el_p50"], rel=0.25
    )


def test_per_request_error_ceiling_and_readme(errors):
    s = summary(by_suite(errors)[MINIMAX])
    assert s["runs"] == 72
    # a ceiling, not the figure: a change that makes the per-request error worse fails here
    assert s["median_mape"] <= 0.55  # 50% since the sixth refit (59% before)
    # far shorter to the first token (the harness's TTFT holds more than an engine's prefill)
    # and, since the sixth refit, longer end to end at the median run: vLLM's block-FP8 expert
    # factor slows the long prompts' prefill chunks the simulated engine puts into the decode
    # steps (README; shorter by 15-50% before, the few-sequence MoE step too fast)
    assert 0.1 < s["median_error_e2el_p50"] < 0.5
    assert s["median_error_ttft_p50"] < -0.6
    text = README.read_text()
    stated = re.search(r"per-request error against them is (\d+)%", text)
    assert stated, "README states the per-request error against real GPU runs"
    assert int(stated.group(1)) == round(100 * s["median_mape"])
    # how many measured figures the printed ranges hold: README says it as computed here
    held = re.search(r"hold (\d+) of these (\d+) measured figures", text)
    assert held and (int(held.group(1)), int(held.group(2))) == (
        s["held_by_stated_range"],
        s["figures"],
    )
    assert s["figures"] == 6 * 72 and s["held_by_stated_range"] < s["figures"]


def test_nim_suite_per_request_error_and_the_readme_says_so(errors):
    s = summary(by_suite(errors)[NIM])
    assert s["runs"] == 9 and s["figures"] == 18
    # NIM's dense TP2 runs (means over a stable window): 14.5% at the median run since the
    # decode steps [S84] joined the fit (9.9%, within the issue's 10%, before: the GEMM ceiling
    # rose and the 5,000-token prefill reads faster), 15.9% after the fourth refit (the ceiling
    # at 0.75, TPOT -5.2%), 16.6% since the fifth (the loss leave-one-source-out chose: held
    # out by source 18.9% against 20.6%), the worst run the knee of the loop at 100 users (31%);
    # 9.6% since the sixth (fitted on the fronts the sources searched: the GEMM ceiling 0.61,
    # TTFT -12% at the median run), within the issue's 10%
    assert s["median_mape"] <= 0.11 and s["max_mape"] <= 0.4
    assert abs(s["median_error_tpot_mean"]) < 0.06 and -0.3 < s["median_error_ttft_mean"] < 0
    text = " ".join(README.read_text().split())  # as read, whatever the line breaks
    stated = re.search(r"its per-request error is (\d+\.\d)% \(runs (\d+)%-(\d+)%", text)
    assert stated and float(stated.group(1)) == round(100 * s["median_mape"], 1)
    assert f"printed ranges hold {s['held_by_stated_range']} of its {s['figures']}" in text
    both = summary(errors)
    assert f"Both suites together read {round(100 * both['median_mape'])}%" in text


def test_a_suite_citing_an_unknown_source_is_refused(tmp_path):
    bad = tmp_path / "per_request.yaml"
    bad.write_text(
        "suites:\n  - {id: x, source: S999, gpu: H200-SXM, model: minimax-m2.5, precision: fp8,"
        " engine: vllm, output_tokens: 8, runs: []}\n"
    )
    with pytest.raises(ValueError, match="per_request.yaml: suite x cites S999"):
        load_runs(bad)


def test_a_suite_with_an_unknown_client_or_figure_is_refused(tmp_path):
    head = (
        "suites:\n  - {id: x, source: S82, gpu: H200-SXM, model: minimax-m2.5, precision: fp8,"
        " engine: vllm, output_tokens: 8, client: %s, runs: [%s]}\n"
    )
    bad = tmp_path / "per_request.yaml"
    bad.write_text(head % ("locust", ""))
    with pytest.raises(ValueError, match="suite x: client 'locust', not one of"):
        load_runs(bad)
    run = "{parallel: tp8, isl: 8, concurrency: 1, ttft_p95: 3.0}"
    bad.write_text(head % ("vllm-bench", run))
    with pytest.raises(ValueError, match=r"suite x: a run with \['ttft_p95'\]; figures are"):
        load_runs(bad)
    bad.write_text(
        head.replace(" output_tokens: 8,", "") % ("vllm-bench", run.replace("ttft_p95", "ttft_p50"))
    )
    with pytest.raises(ValueError, match="suite x: a run without output tokens"):
        load_runs(bad)


def test_a_range_ratio_draws_each_prompts_lengths_as_the_client_did():
    run = next(r for r in load_runs() if r.source == "S85" and r.osl == 8192)
    assert run.range_ratio == 0.8 and run.prompts == 10 * run.concurrency
    lengths = run.lengths()
    assert lengths.shape == (run.prompts, 2)
    for column, n in ((lengths[:, 0], run.isl), (lengths[:, 1], run.osl)):
        # InferenceX's sample_uniform: integers from int(0.8 x n) to n, both ends included
        assert column.min() >= int(0.8 * n) and column.max() <= n
        assert column.mean() == pytest.approx(0.9 * n, rel=0.05)
    assert (run.lengths() == lengths).all()  # the same draws on every replay
    fixed = next(r for r in load_runs() if r.suite == MINIMAX)
    assert (fixed.lengths() == [fixed.isl, fixed.osl]).all()
    # each simulated request's TPOT is over its own output: a run of drawn lengths replays
    # with them (the end-to-end time of a request is its TTFT plus its own token gaps)
    sim = simulate(run)
    assert sim["ttft_p50"] + (0.9 * run.osl - 1) * sim["tpot_p50"] == pytest.approx(
        sim["e2el_p50"], rel=0.15
    )


def test_inferencex_suites_load_as_transcribed():
    runs = [r for r in load_runs() if r.source == "S85"]
    assert len(runs) == 361 and len({r.suite for r in runs}) == 12
    assert {r.engine for r in runs} == {"sglang", "trtllm"}
    assert {r.gpu for r in runs} == {
        "H200-SXM", "B200-SXM", "B300-SXM", "MI300X", "MI325X", "MI355X"
    }  # fmt: skip
    for r in runs:
        m = r.measured
        assert set(m) == set(P50_P99) and r.client == "vllm-bench", r.label
        assert all(m[f"{k}_p50"] <= m[f"{k}_p99"] for k in ("ttft", "tpot", "e2el")), r.label
        # a request's end-to-end time is its TTFT plus (output - 1) gaps of its TPOT, its
        # output between 0.8 and 1 x osl: the medians bracket it (a transcription check)
        low = m["ttft_p50"] + (0.8 * r.osl - 1) * m["tpot_p50"]
        high = m["ttft_p99"] + (r.osl - 1) * m["tpot_p99"]
        assert 0.9 * low <= m["e2el_p50"] <= 1.1 * high, (r.suite, r.label)


@pytest.mark.slow
def test_inferencex_deepseek_suites_per_request_error_and_the_readme_says_so():
    """InferenceX's single-node DeepSeek-R1 runs on SGLang and TensorRT-LLM [S85], replayed
    with their own lengths, users and request counts: the decode pace and end-to-end times
    within a few per cent at the median run; the first token, with the latency the H200 runs
    read before the scheduler (t_req_s), within a quarter at the median run (README)."""
    errs = per_request_errors([r for r in load_runs() if r.source == "S85"])
    cover = stated_coverage(errs)
    s = summary(errs, cover)
    assert s["runs"] == 361
    # 30% when added (2026-12-07; TTFT p50 -71% at the median run), 26% with t_req_s
    assert s["median_mape"] <= 0.29
    assert abs(s["median_error_tpot_p50"]) < 0.1 and abs(s["median_error_e2el_p50"]) < 0.1
    assert -0.35 < s["median_error_ttft_p50"] < 0
    text = " ".join(README.read_text().split())
    stated = re.search(r"InferenceX's own API rows \[S85\].*?per-request error is (\d+)%", text)
    assert stated and int(stated.group(1)) == round(100 * s["median_mape"])
    # the ranges a simulated latency states for these deployments are read from these runs
    held = re.search(r"the printed ranges hold (\d+) of their (\d+) figures", text)
    assert held and (int(held.group(1)), int(held.group(2))) == (
        s["held_by_stated_range"], s["figures"]
    )  # fmt: skip
    # each figure's range holds COVERAGE of them, as every figure's of every suite must
    for figure, (held_n, n) in cover.items():
        assert held_n >= COVERAGE * n, (figure, held_n, n)


def test_trtllm_issue_ttfts_score_alone_and_the_readme_says_so():
    """TensorRT-LLM issue #5929's LLMPerf TTFTs [S86], DeepSeek-R1 on 8 x H200 (FP8) and 8 x B200
    (FP4): a suite that publishes one figure scores that figure alone, and the report prints its
    runs without the figures it lacks. Its H200 runs are among those TensorRT-LLM's
    first-token latency is read from (t_req_s): there the simulated first token is within a
    third of the server's; on B200, where nothing was read, it still comes far sooner (README)."""
    runs = [r for r in load_runs() if r.source == "S86"]
    assert len(runs) == 10 and {r.client for r in runs} == {"llmperf"}
    assert {r.parallel for r in runs} == {"tp8", "tep8"} and all(r.osl == 600 for r in runs)
    assert all(set(r.measured) == {"ttft_p50"} for r in runs)
    h200 = next(r for r in runs if r.gpu == "H200-SXM" and r.parallel == "tp8" and r.isl == 1600)
    assert (h200.concurrency, h200.measured["ttft_p50"]) == (1, 164.63)
    errs = per_request_errors(runs)
    assert all(set(e.errors) == {"ttft_p50"} for e in errs)
    text = report(errs)
    assert "deepseek-r1-h200-trtllm-fp8-llmperf [S86]" in text
    assert re.search(r"tp8 isl 1600 c1 +\d+ / +165 +[\d.]+ / +- ", text)  # no TPOT published
    short = [e for e in errs if e.run.isl == 1600 and e.run.concurrency == 1]
    assert len(short) == 4
    for e in short:  # before t_req_s: -24% to -74% on both GPUs
        if e.run.gpu == "H200-SXM":
            assert abs(e.errors["ttft_p50"]) < 0.33, e.run.label
        else:
            assert e.errors["ttft_p50"] < -0.2, e.run.label
    s = summary(errs)
    readme = " ".join(README.read_text().split())
    stated = re.search(r"TensorRT-LLM issue #5929 \[S86\].*?per-request error is (\d+)%", readme)
    assert stated and int(stated.group(1)) == round(100 * s["median_mape"])


def test_first_token_latency_is_the_shift_with_the_lowest_per_request_error():
    """The choice moves every TTFT and end-to-end figure by (candidate - shipped) and keeps the
    lowest median MAPE: a run simulated 100 ms short on its TTFTs and end-to-end times reads
    100 ms, and from a shipped 40 ms the same runs read the same answer."""
    run = next(r for r in load_runs() if r.source == "S85" and r.concurrency == 4)
    early = {k: v - 100.0 if k.startswith(("ttft", "e2el")) else v for k, v in run.measured.items()}
    assert first_token_latency([RunError(run, early)], shipped_s=0.0) == pytest.approx(0.1)
    later = {k: v + 40.0 if k.startswith(("ttft", "e2el")) else v for k, v in early.items()}
    assert first_token_latency([RunError(run, later)], shipped_s=0.04) == pytest.approx(0.1)
    with pytest.raises(ValueError, match="no runs"):
        first_token_latency([], 0.0)


def test_the_first_token_latency_is_scoped_to_what_measured_it():
    """SGLang's and TensorRT-LLM's DeepSeek-R1 (and DeepSeek-V3, the same network) carry the
    first-token latency their H200 runs read; vLLM's, NIM's dense TensorRT-LLM deployment
    (48 ms measured at a 500-token prompt) and every other model keep none."""
    h200, h100 = get_gpu("H200"), get_gpu("H100")
    for model in ("deepseek-r1", "deepseek-v3"):
        assert efficiency_for(h200, "fp8", "sglang", model).t_req_s > 0.05
        assert efficiency_for(h200, "fp8", "trtllm", model).t_req_s > 0.03
        assert efficiency_for(get_gpu("MI300X"), "fp8", "sglang", model).t_req_s > 0.05
        assert efficiency_for(h200, "fp8", "vllm", model).t_req_s == 0
    assert efficiency_for(h100, "fp8", "trtllm", "llama-3.3-70b").t_req_s == 0
    assert efficiency_for(h200, "fp8", "sglang", "qwen3-235b-a22b").t_req_s == 0


@pytest.mark.slow
def test_the_shipped_first_token_latency_is_what_the_h200_runs_choose():
    """efficiency.yaml's t_req_s for SGLang and TensorRT-LLM serving DeepSeek-R1 is what their
    H200 runs (S85's two suites and S86's) choose (`python -m bench.sim.per_request
    --first-token`), re-read from runs simulated with it: within 10 ms (the error is flat
    within a few points over 50-70 ms for TensorRT-LLM, so the choice moves a grid step with
    the closed loop's feedback). A refit that moves the simulated prefill fails here until
    the value is re-read."""
    choices = first_token_choices(load_runs())
    assert {c.engine for c in choices} == {"sglang", "trtllm"}
    assert sum(c.runs for c in choices) == 51  # S85's 15 + 30 H200 runs, S86's 6
    for c in choices:
        assert c.model == "deepseek-r1" and c.shipped_s > 0, c
        assert abs(c.chosen_s - c.shipped_s) <= 0.010 + 1e-9, c
