"""Reading stored telemetry back: a run's (or a load point's) samples as one long
DataFrame, and the views figures, exports and the digest draw from it (queue depth, KV-cache
use, board power, the prompt cache).

Times are `t_s`, seconds since the load point's start, on the same perf_counter clock as
every RequestRecord, so server samples line up exactly with bench.metrics.time_series.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from bench.telemetry.prometheus import parse_labels_text
from bench.telemetry.recording import ARTIFACT_PREFIX, Recording, artifact_name, decode

if TYPE_CHECKING:  # pandas is imported where frames are built, not by every run
    import pandas as pd


def load_payloads(run_id: str, db: Any = None, load_point: int | None = None) -> list[dict]:
    """The stored telemetry artifacts of a run (one per load point), in load-point order."""
    from bench.store import load_artifact, load_artifacts

    if load_point is None:
        found = [data for _, data in load_artifacts(run_id, ARTIFACT_PREFIX, db)]
    else:
        data = load_artifact(run_id, artifact_name(load_point), db)
        found = [] if data is None else [data]
    payloads = [decode(data) for data in found]
    return sorted(payloads, key=lambda p: p.get("load_point", 0))


COLUMNS = ["load_point", "t_s", "source", "metric", "labels", "value", "name", "type"]


def frame_from_payloads(payloads: Iterable[dict]) -> pd.DataFrame:
    """Long format, one row per sample; NaN (series absent from a scrape) left out."""
    import pandas as pd

    parts: list[pd.DataFrame] = []
    for p in payloads:
        for source, src in p.get("sources", {}).items():
            t = np.asarray(src.get("t_s", []), dtype=np.float64)
            for s in src.get("series", []):
                v = np.array([np.nan if x is None else x for x in s["values"]], dtype=np.float64)
                m = min(len(t), len(v))
                keep = ~np.isnan(v[:m])
                n = int(keep.sum())
                if not n:
                    continue
                parts.append(
                    pd.DataFrame(
                        {
                            "load_point": np.full(n, p.get("load_point", 0), dtype=np.int64),
                            "t_s": t[:m][keep],
                            "source": source,
                            "metric": s["metric"],
                            "labels": s.get("labels", ""),
                            "value": v[:m][keep],
                            "name": s.get("name", s["metric"]),
                            "type": s.get("type", "untyped"),
                        }
                    )
                )
    if not parts:
        return pd.DataFrame({c: pd.Series(dtype=_dtype(c)) for c in COLUMNS})
    df = pd.concat(parts, ignore_index=True)
    return df.sort_values(["load_point", "source", "metric", "labels", "t_s"], ignore_index=True)


def _dtype(column: str) -> str:
    return {"load_point": "int64", "t_s": "float64", "value": "float64"}.get(column, "object")


def load_telemetry(run_id: str, db: Any = None, load_point: int | None = None) -> pd.DataFrame:
    """A run's telemetry (or one load point's) as a long DataFrame.

    Columns: load_point, t_s (seconds since that load point's start, the clock of its
    RequestRecords), source ("server", "dcgm", "nvml"), metric (canonical name from an
    engine's vocabulary, bench.telemetry.engines, else the exposed name), labels
    (`k="v",...`), value, name (the exposed name), type (counter, gauge, histogram, ...). Empty (with these columns) when the run
    has none. `run_id` may be an id prefix or a run name.
    """
    from bench.store import resolve_run

    run_id = resolve_run(run_id, db)
    return frame_from_payloads(load_payloads(run_id, db, load_point))


def telemetry_warnings(run_id: str, db: Any = None) -> dict[int, list[str]]:
    """Per load point, what went wrong while scraping (for "no server telemetry because...")."""
    return {p["load_point"]: p.get("warnings", []) for p in load_payloads(run_id, db)}


def _per_scrape(df: pd.DataFrame, metrics: Sequence[str], how: str) -> pd.DataFrame:
    """Server samples of the given metrics aggregated over labels, one row per scrape."""
    import pandas as pd

    sub = df[(df["source"] == "server") & df["metric"].isin(metrics)]
    cols = ["load_point", "t_s", *metrics]
    if sub.empty:
        return pd.DataFrame({c: pd.Series(dtype=_dtype(c)) for c in cols})
    wide = sub.pivot_table(
        index=["load_point", "t_s"], columns="metric", values="value", aggfunc=how
    )
    wide = wide.reindex(columns=list(metrics)).reset_index()
    wide.columns.name = None
    return wide[cols]


def queue_depth(df: pd.DataFrame) -> pd.DataFrame:
    """Requests waiting and running on the server per scrape (summed over engines/ranks).

    Columns: load_point, t_s, requests_waiting, requests_running (NaN where not exposed).
    """
    return _per_scrape(df, ["requests_waiting", "requests_running"], "sum")


def kv_cache_usage(df: pd.DataFrame) -> pd.DataFrame:
    """KV-cache use per scrape as a fraction 0..1 (the fullest engine when several).

    Columns: load_point, t_s, kv_cache_usage.
    """
    return _per_scrape(df, ["kv_cache_usage"], "max")


def _gpu(labels: str) -> str:
    found = parse_labels_text(labels)
    return found.get("gpu", found.get("UUID", labels))


def power_w(df: pd.DataFrame) -> pd.DataFrame:
    """Board power per GPU and sample: load_point, t_s, source, gpu, power_w.

    When both a DCGM exporter and NVML report, DCGM is used (one source per load point,
    so the same board is never counted twice).
    """
    import pandas as pd

    sub = df[(df["metric"] == "gpu_power_w") & df["source"].isin(["dcgm", "nvml"])]
    cols = ["load_point", "t_s", "source", "gpu", "power_w"]
    if sub.empty:
        return pd.DataFrame({c: pd.Series(dtype=_dtype(c)) for c in cols})
    keep = []
    for _, part in sub.groupby("load_point"):
        sources = set(part["source"])
        keep.append(part[part["source"] == ("dcgm" if "dcgm" in sources else "nvml")])
    out = pd.concat(keep)
    out = out.assign(gpu=out["labels"].map(_gpu), power_w=out["value"])
    return out[cols].sort_values(["load_point", "gpu", "t_s"], ignore_index=True)


def _growth(df: pd.DataFrame, metric: str) -> float | None:
    """How much a server counter grew over the samples given (summed over label sets);
    None when it is absent or went down (a restarted server)."""
    sub = df[(df["source"] == "server") & (df["metric"] == metric)]
    if sub.empty:
        return None
    grew = sub.sort_values("t_s").groupby("labels")["value"].agg(lambda v: v.iloc[-1] - v.iloc[0])
    total = float(grew.sum())
    return total if total >= 0 else None


def prompt_cache(df: pd.DataFrame) -> dict | None:
    """What the server's own counters say about its prefix cache over one load point:
    {"counters", "cached_tokens", "prompt_tokens", "share"}, or None when it exposes none.

    llama.cpp counts cached and computed prompt tokens apart; vLLM counts prefix-cache
    lookups and hits in tokens; SGLang only has a recent hit-rate gauge (its mean is used).
    """
    cached = _growth(df, "prompt_tokens_cached_total")
    computed = _growth(df, "prompt_tokens_computed_total")
    if cached is not None and computed is not None:
        total = cached + computed
        return _cache_figures("llama.cpp prompt_tokens_cached/prompt_tokens", cached, total)
    hits = _growth(df, "prefix_cache_hits_total")
    queries = _growth(df, "prefix_cache_queries_total")
    if hits is not None and queries is not None:
        return _cache_figures("vLLM prefix_cache_hits/queries", hits, queries)
    rate = df[(df["source"] == "server") & (df["metric"] == "prefix_cache_hit_rate")]
    if not rate.empty:
        return {
            "counters": f"{rate['name'].iloc[0]} (mean of the gauge)",
            "cached_tokens": None,
            "prompt_tokens": None,
            "share": float(rate["value"].mean()),
        }
    return None


def spec_decode(df: pd.DataFrame) -> dict | None:
    """What the server's speculative-decoding counters say over one load point, or None
    when it exposes none (no draft model, or an engine without them).

    vLLM: acceptance_rate = accepted / draft tokens (vLLM's "draft acceptance rate"),
    mean_acceptance_length = 1 + accepted / drafts (tokens per verify step, the bonus token
    included), per_position[i] = accepted at draft position i / drafts (position 0's is the
    chance a first draft token is accepted). SGLang only has a recent mean-length gauge.
    """
    drafts = _growth(df, "spec_decode_drafts_total")
    draft_tokens = _growth(df, "spec_decode_draft_tokens_total")
    accepted = _growth(df, "spec_decode_accepted_tokens_total")
    if drafts is not None and draft_tokens is not None and accepted is not None:
        if drafts <= 0 or draft_tokens <= 0:
            return None  # counters present but nothing drafted in this point
        sub = df[
            (df["source"] == "server") & (df["metric"] == "spec_decode_accepted_per_position_total")
        ]
        per_position: dict[int, float] = {}
        for labels, part in sub.groupby("labels"):
            pos = parse_labels_text(labels).get("position")
            if pos is None or not pos.isdigit():
                continue
            values = part.sort_values("t_s")["value"]
            grew = float(values.iloc[-1] - values.iloc[0]) / drafts  # summed over engines
            per_position[int(pos)] = per_position.get(int(pos), 0.0) + grew
        return {
            "counters": "vLLM spec_decode_num_* (drafts, draft tokens, accepted)",
            "drafts": drafts,
            "draft_tokens": draft_tokens,
            "accepted_tokens": accepted,
            "acceptance_rate": accepted / draft_tokens,
            "mean_acceptance_length": 1.0 + accepted / drafts,
            "per_position": [per_position[i] for i in sorted(per_position)],
        }
    length = df[(df["source"] == "server") & (df["metric"] == "spec_decode_accept_length")]
    if not length.empty:
        return {
            "counters": f"{length['name'].iloc[0]} (mean of the gauge)",
            "mean_acceptance_length": float(length["value"].mean()),
        }
    return None


def _cache_figures(counters: str, cached: float, total: float) -> dict:
    return {
        "counters": counters,
        "cached_tokens": int(cached),
        "prompt_tokens": int(total),
        "share": cached / total if total > 0 else None,
    }


def recording_frame(recording: Recording, t0_ns: int) -> pd.DataFrame:
    """A Recording (one load point) as load_telemetry's long DataFrame."""
    return frame_from_payloads([recording.to_payload(t0_ns, 0)])
