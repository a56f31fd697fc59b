"""`tokenbench synth-trace`: a synthetic multi-turn trace in Mooncake's format (bench.agentic),
for when a real trace cannot be had; replay it with --dataset-name mooncake."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from bench.cli.common import fail


def synth_trace_command(
    out: Annotated[Path | None, typer.Option("--out", help="The JSONL file to write")] = None,
    sessions: Annotated[int, typer.Option("--sessions", min=1, help="Sessions to generate")] = 100,
    seed: Annotated[int, typer.Option("--seed", help="The same seed, the same trace")] = 0,
    session_rate: Annotated[
        float | None, typer.Option("--session-rate", help="New sessions/s (default 2.27)")
    ] = None,
    turns_mean: Annotated[
        float | None, typer.Option("--turns-mean", help="Mean turns per session (default 1.5)")
    ] = None,
    delay_cap: Annotated[
        float | None,
        typer.Option("--delay-cap", help="Cap inter-turn delays at s (InferenceX AgentX: 60)"),
    ] = None,
    max_input: Annotated[
        int | None, typer.Option("--max-input", help="End a session past this context")
    ] = None,
    block_size: Annotated[
        int | None, typer.Option("--block-size", min=1, help="Tokens per hash id (512)")
    ] = None,
    sources: Annotated[
        bool, typer.Option("--sources", help="Print each default's source and exit")
    ] = False,
) -> None:
    """Sessions of turns with growing context and inter-turn delays; defaults reproduce
    Mooncake's conversation trace (--sources says where each figure comes from)."""
    from bench.agentic import SOURCES, SessionStats, describe, generate, write_trace

    if sources:
        for name, text in SOURCES.items():
            print(f"{name}: {text}")
        return
    if out is None:
        raise fail("synth-trace: give --out FILE (the JSONL trace to write)")
    given = {"session_rate": session_rate, "turns_mean": turns_mean, "delay_cap_s": delay_cap,
             "max_input": max_input, "block_size": block_size}  # fmt: skip
    try:
        stats = SessionStats(**{k: v for k, v in given.items() if v is not None})
        rows = generate(stats, sessions, seed)
        write_trace(rows, out)
    except ValueError as exc:
        raise fail(f"synth-trace: {exc}") from None
    except OSError as exc:
        raise fail(f"--out {out}: {exc.strerror or exc}") from None
    d = describe(rows, stats.block_size)
    print(
        f"wrote {out}: {d['requests']} requests of {sessions} sessions over {d['span_s']:.0f} s, "
        f"mean input {d['mean_input']:,.0f} / output {d['mean_output']:,.0f} tokens, "
        f"{d['intended_share']:.1%} of prompt tokens reusable (infinite cache, "
        f"blocks of {stats.block_size})"
    )
