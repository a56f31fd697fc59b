"""One line about a load point's telemetry for the terminal, printed when the point ends:
what the server's own counters and the GPUs' power say beside the client's figures."""

from __future__ import annotations

from bench.telemetry.energy import mean_power
from bench.telemetry.readers import (
    kv_cache_usage,
    power_w,
    prompt_cache,
    queue_depth,
    recording_frame,
)
from bench.telemetry.recording import Recording


def digest(recording: Recording, t0_ns: int, duration_s: float) -> str | None:
    """One line about a load point's telemetry ("server: waiting max 12, KV max 93%, ...")."""
    if not recording.scrapes:  # nothing to say, and no frame (nor pandas) to make
        return None
    df = recording_frame(recording, t0_ns)
    if df.empty:
        return None
    bits = []
    q = queue_depth(df)
    if q["requests_waiting"].notna().any():
        bits.append(f"waiting max {q['requests_waiting'].max():,.0f}")
    if q["requests_running"].notna().any():
        bits.append(f"running max {q['requests_running'].max():,.0f}")
    kv = kv_cache_usage(df)
    if kv["kv_cache_usage"].notna().any():
        bits.append(f"KV cache max {kv['kv_cache_usage'].max():.0%}")
    pre = df[(df["source"] == "server") & (df["metric"] == "preemptions_total")]
    if not pre.empty:
        grew = pre.groupby("labels")["value"].agg(lambda v: v.iloc[-1] - v.iloc[0]).sum()
        bits.append(f"preemptions +{grew:,.0f}")
    cache = prompt_cache(df)
    if cache is not None and cache["share"] is not None:
        of = f" of {cache['prompt_tokens']:,} prompt tokens" if cache["prompt_tokens"] else ""
        bits.append(f"prompt cache {cache['share']:.0%}{of}")
    power = power_w(df)
    if not power.empty:
        means = [
            mean_power(g["t_s"].to_numpy(), g["power_w"].to_numpy(), duration_s)
            for _, g in power.groupby("gpu")
        ]
        means = [m for m in means if m is not None]
        if means:
            bits.append(f"GPU power {sum(means) / len(means):,.0f} W/GPU x{len(means)}")
    return "server telemetry: " + ", ".join(bits) if bits else None
