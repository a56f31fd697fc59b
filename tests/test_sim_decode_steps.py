"""The simulator's decode step against vLLM measured at a known batch [S84] (issue 25)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from bench.sim.decode_steps import load_rows, step_errors, summary

README = Path(__file__).resolve().parents[1] / "README.md"


@pytest.fixture(scope="module")
def errors():
    return step_errors()


def test_rows_load_as_published():
    rows = load_rows()
    assert len(rows) == 150  # ML.ENERGY's gpqa configurations of the nine profiled models
    assert {r.model for r in rows} == {
        "qwen3-8b", "qwen3-32b", "qwen3-30b-a3b", "qwen3-235b-a22b", "gpt-oss-120b",
        "gpt-oss-20b", "deepseek-r1", "deepseek-v3",
    }  # fmt: skip
    for r in rows:
        # a transcription check: the batch never exceeds its limit, the gaps are ordered
        assert 1 <= r.batch <= r.max_num_seqs * 1.001, r
        assert 0 < r.itl_p50 <= r.itl_p90 <= r.itl_p99, r
        assert r.context > 300  # the prompt plus what a running sequence has generated


def test_decode_step_error_ceiling_and_readme(errors):
    s = summary(errors)
    # a ceiling, not the figure (31% when added): a change that makes the step worse fails
    assert s["rows"] == 150 and s["median_abs"] <= 0.35
    # the direction of the misses the README describes: MoE in FP8 on expert parallel at 8
    # sequences simulated too fast; gpt-oss's W4A16 on H100 at small batches too slow
    fp8_moe = [x.error for x in errors if x.row.precision == "fp8" and x.row.batch <= 8]
    assert fp8_moe and max(fp8_moe) < -0.4
    w4a16 = [x.error for x in errors if x.row.precision == "mxfp4-a16" and x.row.batch <= 64]
    assert min(w4a16) > 0.25
    text = " ".join(README.read_text().split())
    stated = re.search(r"decode steps' median \|error\| is (\d+)%", text)
    assert stated and int(stated.group(1)) == round(100 * s["median_abs"])
    assert f"hold {s['held_by_stated_range']} of the {s['rows']} measured steps" in text


def test_the_prompt_length_assumption_barely_moves_the_figure():
    # prompt lengths are not published; the rows' contexts are 80-97% generated tokens
    short, long = (summary(step_errors(load_rows(input_tokens=n))) for n in (150, 600))
    assert abs(short["median_abs"] - long["median_abs"]) < 0.02


def test_a_file_citing_an_unknown_source_is_refused(tmp_path):
    bad = tmp_path / "decode_steps.yaml"
    bad.write_text("schema_version: 1\nsource: S999\nengine: vllm\ninput_tokens: 300\nrows: []\n")
    with pytest.raises(ValueError, match="decode_steps.yaml: cites S999"):
        load_rows(bad)
