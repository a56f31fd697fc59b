"""Synthetic multi-turn traces in Mooncake's format (issue 29 item 4): valid, reproducible,
sessions that grow block by block, and the statistics they were fitted to."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import fields

import numpy as np
import pytest

from bench.agentic import SOURCES, SessionStats, describe, generate, write_trace
from bench.blocks import BlockPrompts
from bench.traces import TRACE_FORMATS
from bench.workload import _WORDS


def test_every_statistic_has_a_source():
    assert set(SOURCES) == {f.name for f in fields(SessionStats)}


def test_the_trace_is_valid_mooncake_and_reproducible(tmp_path):
    rows = generate(SessionStats(block_size=64, first_input_median=300), 40, seed=5)
    path = tmp_path / "t.jsonl"
    write_trace(rows, path)
    read = TRACE_FORMATS.get("mooncake").rows(
        path
    )  # every line checked: lengths, ids, timestamps in order
    assert len(read) == len(rows) > 40
    BlockPrompts(read, block_size=64, seed=0, vocabulary=_WORDS, path=path)  # ids fit
    assert generate(SessionStats(block_size=64, first_input_median=300), 40, seed=5) == rows
    assert generate(SessionStats(block_size=64, first_input_median=300), 40, seed=6) != rows


def test_a_session_resends_its_context_and_grows():
    stats = SessionStats(turns_mean=6, block_size=64, first_input_median=200, growth_median=50,
                         growth_sigma=0.3, delay_cap_s=60, system_blocks=2)  # fmt: skip
    # one session of at least 3 turns (turns are geometric: the first seed that has them)
    rows = next(r for seed in range(50) if len(r := generate(stats, 1, seed)) >= 3)
    for before, after in zip(rows, rows[1:], strict=False):
        full = before["hash_ids"][: before["input_length"] // 64]
        assert after["hash_ids"][: len(full)] == full  # full blocks keep their ids
        assert after["input_length"] > before["input_length"] + before["output_length"]
        assert 0 < after["timestamp"] - before["timestamp"] <= 60_000
        assert after["hash_ids"][:2] == [0, 1]  # the shared system prompt


def test_defaults_reproduce_the_conversation_traces_figures():
    rows = generate(SessionStats(), 3000, seed=2)
    turns = len(rows) / 3000
    assert turns == pytest.approx(1.50, rel=0.08)
    assert np.mean([r["input_length"] for r in rows]) == pytest.approx(12035, rel=0.15)
    # Mooncake's conversation trace implies 37.4% reuse with an infinite cache
    assert describe(rows, 512)["intended_share"] == pytest.approx(0.374, abs=0.06)


def test_bad_statistics_are_refused():
    with pytest.raises(ValueError, match="turns_mean must be >= 1"):
        SessionStats(turns_mean=0.5)
    with pytest.raises(ValueError, match="delay_cap_s must be > 0"):
        SessionStats(delay_cap_s=0)


@pytest.mark.slow
def test_cli_writes_a_trace_that_replays(tmp_path):
    out = tmp_path / "s.jsonl"
    proc = subprocess.run(
        [sys.executable, "-m", "bench", "synth-trace", "--out", str(out), "--sessions", "5",
         "--seed", "1", "--block-size", "64"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "reusable (infinite cache, blocks of 64)" in proc.stdout
    assert all(json.loads(line)["hash_ids"] for line in out.read_text().splitlines())
