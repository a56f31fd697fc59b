"""The simulator's decode step against vLLM measured at a known batch [S84] (issue 25)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from bench.sim.calibration import load_published
from bench.sim.decode_steps import step_errors, summary
from bench.sim.profiles.decode_step_rows import load_rows

README = Path(__file__).resolve().parents[1] / "README.md"


@pytest.fixture(scope="module")
def errors():
    return step_errors()


def test_rows_load_as_published():
    rows = load_rows()
    gpqa = [r for r in rows if r.task == "gpqa"]
    chat = [r for r in rows if r.task == "lm-arena-chat"]
    # ML.ENERGY's gpqa configurations of the eight profiled models; its lm-arena-chat ones of
    # the dense profiled models at up to 64 sequences
    assert (len(gpqa), len(chat)) == (150, 55)
    assert {r.model for r in gpqa} == {
        "qwen3-8b", "qwen3-32b", "qwen3-30b-a3b", "qwen3-235b-a22b", "gpt-oss-120b",
        "gpt-oss-20b", "deepseek-r1", "deepseek-v3",
    }  # fmt: skip
    assert {r.model for r in chat} == {
        "llama-3.1-8b", "llama-3.3-70b", "llama-3.1-405b", "qwen3-8b", "qwen3-32b"
    }  # fmt: skip
    assert all(r.batch <= 64 and r.parallel.startswith("tp") for r in chat)
    for r in rows:
        # a transcription check: the batch never exceeds its limit, the gaps are ordered
        assert 1 <= r.batch <= r.max_num_seqs * 1.001, r
        assert 0 < r.itl_p50 <= r.itl_p90 <= r.itl_p99, r
        assert r.context > 300  # the prompt plus what a running sequence has generated


def test_decode_step_error_ceiling_and_readme(errors):
    s = summary(errors)
    # ceilings, not the figures (11% in all, 8% on the dense chat rows since the sixth refit
    # brought in vLLM's block-FP8 experts; 16% and 8% before; 23% and 8% when the rows were
    # scored only): a change that makes the step worse fails
    assert s["rows"] == 205 and s["median_abs"] <= 0.14
    chat = summary([x for x in errors if x.row.task == "lm-arena-chat"])
    assert chat["median_abs"] <= 0.10
    # the direction of the misses the README describes: MoE in FP8 on expert parallel at 8
    # sequences still simulated fast, by less since vLLM's block-FP8 expert factor (-10% to
    # -27%; -40% to -50% before); gpt-oss on B200 at thousands of sequences slower than
    # measured: vLLM's front end (fitted on rows of at most 512 sequences at 71 us a token)
    # took 43-60 us a token there; without it these rows read -55% to -65%
    fp8_moe = [
        x.error
        for x in errors
        if x.row.task == "gpqa" and x.row.precision == "fp8" and x.row.batch <= 8
    ]
    assert fp8_moe and min(fp8_moe) > -0.35 and max(fp8_moe) < 0
    crowded = [x.error for x in errors if x.row.gpu == "B200-SXM" and x.row.batch > 2000]
    assert crowded and min(crowded) > 0 and max(crowded) < 0.7
    text = " ".join(README.read_text().split())
    stated = re.search(r"decode steps' median \|error\| is (\d+)%", text)
    assert stated and int(stated.group(1)) == round(100 * s["median_abs"])
    assert f"hold {s['held_by_stated_range']} of the {s['rows']} measured steps" in text


def test_the_prompt_length_assumptions_move_the_figures_little():
    # prompt lengths are not published; the gpqa rows' contexts are 80-97% generated tokens,
    # the chat rows are at most 64 sequences, where KV reads are a small part of a step
    def by_task(scale: float) -> dict[str, float]:
        errs = step_errors(load_rows(scale_prompts=scale))
        return {
            t: summary([x for x in errs if x.row.task == t])["median_abs"]
            for t in ("gpqa", "lm-arena-chat")
        }

    half, double = by_task(0.5), by_task(2.0)
    assert abs(half["gpqa"] - double["gpqa"]) < 0.02
    assert max(half["lm-arena-chat"], double["lm-arena-chat"]) < 0.15


def test_a_file_citing_an_unknown_source_is_refused(tmp_path):
    bad = tmp_path / "decode_steps.yaml"
    bad.write_text("schema_version: 1\nsource: S999\nengine: vllm\ntasks: {}\nrows: []\n")
    with pytest.raises(ValueError, match="decode_steps.yaml: cites S999"):
        load_rows(bad, sources=load_published().sources)
    bad.write_text("source: S84\ntasks: {gpqa: {input_tokens: 300}}\nrows: [{task: chat}]\n")
    with pytest.raises(ValueError, match=r"decode_steps.yaml: rows\[0\]: task 'chat', not one"):
        load_rows(bad)


def test_the_fit_uses_the_steps_of_at_most_512_sequences_less_the_runs_left_out(errors):
    """decode_steps.yaml's `fit`: the rows of at most 512 sequences (above, vLLM's host work per
    sequence decides the step), less the B200 gpqa runs of Qwen3-8B/32B/30B-A3B (3-4x slower
    than the same models on H100 and than their own chat rows); each one the fit reproduces
    is the step this check scores, on the same step model."""
    from bench.sim.calibration import Sim, decode_step_points
    from bench.sim.profiles.decode_step_rows import fit_rows

    rows = fit_rows()
    assert len(rows) == 168 and max(r.max_num_seqs for r in rows) == 512
    left_out = {(r.task, r.gpu, r.model) for r in load_rows()} - {
        (r.task, r.gpu, r.model) for r in rows
    }
    assert left_out == {("gpqa", "B200-SXM", m) for m in ("qwen3-8b", "qwen3-32b", "qwen3-30b-a3b")}
    points = decode_step_points()
    assert len({p.id for p in points}) == len(points) == 168
    scored = {(x.row.label, x.row.max_num_seqs, x.row.itl_p50): x for x in errors}
    sim = Sim()
    for p, row in list(zip(points, rows, strict=True))[::17]:
        x = scored[(row.label, row.max_num_seqs, row.itl_p50)]
        assert p.measured == pytest.approx(1000 / row.itl_p50)
        assert 1 / sim.reproduce(p).simulated == pytest.approx(x.simulated_ms / 1000, rel=1e-9)
