"""Synthetic multi-turn sessions, written as a Mooncake-format trace (for when a real one
cannot be had).

Sessions start as a Poisson process; each has a geometric number of turns; every turn
re-sends the session's context, which grows by the previous reply and a new message, after
an inter-turn delay. Every prompt opens with the same system-prompt block(s). Hash ids follow
Mooncake's convention: a block that was full in an earlier turn keeps its id, a new or short
last block gets the next unused integer. The result replays with `--dataset-name mooncake`.

The defaults reproduce Mooncake's conversation trace (kvcache-ai/Mooncake,
FAST25-release/traces/conversation_trace.jsonl, commit 3b5a594), as measured by linking each
request to the latest earlier one whose full blocks are a prefix of its own (its previous
turn): each default's source is in SOURCES. Lengths and delays are lognormal (the median,
and a sigma fitted to the mean where the tail decides the token volume); turns are
geometric, fitted to the mean.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, fields
from pathlib import Path

import numpy as np

from bench.blocks import DEFAULT_BLOCK_SIZE, intended_reuse

_CONVERSATION = (
    "Mooncake conversation_trace.jsonl (12,031 requests over 3,537 s; 8,028 sessions found "
    "by prefix-linking turns), measured for issue 29"
)
SOURCES: dict[str, str] = {
    "session_rate": f"2.27 new sessions/s: {_CONVERSATION}",
    "turns_mean": f"1.50 turns per session (p50 1, p90 2, max 43): {_CONVERSATION}",
    "delay_median_s": f"inter-turn delay p50 123 s: {_CONVERSATION}",
    "delay_sigma": f"1.06: the trace's mean delay 216 s (p90 480; the fit gives 477): "
    f"{_CONVERSATION}",
    "delay_cap_s": "none by default; InferenceX AgentX replays cap inter-turn delay at 60 s "
    "(SemiAnalysisAI/InferenceX PR 1201)",
    "first_input_median": f"first-turn input p50 5,955 tokens: {_CONVERSATION}",
    "first_input_sigma": f"1.13: the trace's mean first-turn input 11,293 tokens (p90 26,348; "
    f"the fit gives 25,300): {_CONVERSATION}",
    "output_median": f"output p50 350 tokens: {_CONVERSATION}",
    "output_sigma": f"0.42: the trace's output p90 597 (its mean, 343, is below its median, "
    f"which no lognormal has): {_CONVERSATION}",
    "growth_median": f"context added per turn beyond the reply, p50 26 tokens: {_CONVERSATION}",
    "growth_sigma": f"2.80: the trace's mean added context 1,292 tokens (its p90 is 4,321, "
    f"the fit's 936: the real tail is heavier): {_CONVERSATION}",
    "system_blocks": f"1: every request opens with hash id 0: {_CONVERSATION}",
    "block_size": "512 tokens: Mooncake's traces (FAST25-release)",
    "max_input": "none by default; InferenceX AgentX reports hit rates with a 131k context cap",
}


@dataclass(frozen=True)
class SessionStats:
    """What a synthetic trace reproduces; each default's source is SOURCES[field].
    Lengths and delays are lognormal: a median and the sigma of the log."""

    session_rate: float = 2.27
    turns_mean: float = 1.50
    delay_median_s: float = 123.0
    delay_sigma: float = 1.06
    delay_cap_s: float | None = None
    first_input_median: int = 5955
    first_input_sigma: float = 1.13
    output_median: int = 350
    output_sigma: float = 0.42
    growth_median: int = 26
    growth_sigma: float = 2.80
    system_blocks: int = 1
    block_size: int = DEFAULT_BLOCK_SIZE
    max_input: int | None = None

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if value is not None and value <= 0 and f.name != "system_blocks":
                raise ValueError(f"{f.name} must be > 0 (got {value})")
        if self.turns_mean < 1:
            raise ValueError(f"turns_mean must be >= 1 (got {self.turns_mean})")


def _lognormal(rng: np.random.Generator, median: float, sigma: float) -> float:
    return float(median * math.exp(rng.normal() * sigma))


def generate(stats: SessionStats, sessions: int, seed: int) -> list[dict]:
    """`sessions` sessions as Mooncake rows ({timestamp ms, input_length, output_length,
    hash_ids}), sorted by timestamp; the same seed gives the same rows."""
    if sessions < 1:
        raise ValueError(f"sessions must be >= 1 (got {sessions})")
    rng = np.random.default_rng([seed, 29])
    block = stats.block_size
    starts = np.cumsum(rng.exponential(1 / stats.session_rate, sessions))
    starts -= starts[0]
    next_id = stats.system_blocks
    rows: list[tuple[float, int, dict]] = []
    for s in range(sessions):
        turns = int(rng.geometric(1 / stats.turns_mean))
        t = float(starts[s])
        ctx = max(stats.system_blocks * block + 1,
                  round(_lognormal(rng, stats.first_input_median, stats.first_input_sigma)))  # fmt: skip
        full = list(range(stats.system_blocks))  # ids of the context's full blocks so far
        for _ in range(turns):
            if stats.max_input is not None and ctx > stats.max_input:
                break
            out = max(1, round(_lognormal(rng, stats.output_median, stats.output_sigma)))
            while len(full) < ctx // block:
                full.append(next_id)
                next_id += 1
            ids = full[: math.ceil(ctx / block)]
            if len(ids) < math.ceil(ctx / block):  # a short last block: text of its own
                ids.append(next_id)
                next_id += 1
            row = {"timestamp": round(t * 1000), "input_length": ctx, "output_length": out,
                   "hash_ids": ids}  # fmt: skip
            rows.append((row["timestamp"], len(rows), row))
            delay = _lognormal(rng, stats.delay_median_s, stats.delay_sigma)
            if stats.delay_cap_s is not None:
                delay = min(delay, stats.delay_cap_s)
            t += delay
            ctx += out + max(1, round(_lognormal(rng, stats.growth_median, stats.growth_sigma)))
    return [row for _, _, row in sorted(rows, key=lambda r: (r[0], r[1]))]


def write_trace(rows: list[dict], path: Path) -> None:
    """One JSON object a line, as Mooncake's traces are."""
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def describe(rows: list[dict], block_size: int) -> dict:
    """What a trace holds: requests, span, lengths, and the reuse it implies."""
    span = (rows[-1]["timestamp"] - rows[0]["timestamp"]) / 1000 if rows else 0.0
    reuse = intended_reuse(
        [r["hash_ids"] for r in rows], [r["input_length"] for r in rows], block_size
    )
    return {
        "requests": len(rows),
        "span_s": span,
        "mean_input": float(np.mean([r["input_length"] for r in rows])),
        "mean_output": float(np.mean([r["output_length"] for r in rows])),
        "intended_share": reuse["share"],
    }
