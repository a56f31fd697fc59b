"""Small facts typed once: metric names, default percentiles, the measured window.

An SLO is judged on a live summary during a sweep (Summary.value) and on a stored curve
afterwards (CurvePoint.value, for capacity and compare): every name the SLO grammar accepts
must read the same figure from both, or a capacity silently disagrees with its sweep.
"""

from __future__ import annotations

import numpy as np
import pytest

from bench.curves import point_from_summary
from bench.metrics import (
    DEFAULT_PERCENTILES,
    FLAT_METRICS,
    LATENCY_LABELS,
    LATENCY_METRICS,
    Columns,
    parse_goodput,
    parse_slo,
    percentile_key,
    summarize,
)
from bench.records import FAILED, OK, RequestRecord
from bench.scenario import Scenario

MS = 1_000_000


def records(n: int = 40) -> list[RequestRecord]:
    """n requests 10 ms apart (intended = sent), 20 ms to the first of 5 tokens 2 ms apart;
    every 8th fails."""
    out = []
    for i in range(n):
        sent = i * 10 * MS
        rec = RequestRecord(index=i, intended_ns=sent, sent_ns=sent, prompt_tokens=16)
        if i % 8 == 7:
            rec.state, rec.error_kind, rec.end_ns = FAILED, "http_5xx", sent + MS
        else:
            rec.chunk_times_ns = sent + 20 * MS + np.arange(5, dtype=np.int64) * 2 * MS
            rec.first_token_ns, rec.end_ns = int(rec.chunk_times_ns[0]), sent + 28 * MS
            rec.output_tokens, rec.state = 5, OK
        out.append(rec)
    return out


SLO_NAMES = [*FLAT_METRICS] + [
    f"{stat}_{metric}_ms"
    for metric in LATENCY_METRICS
    for stat in ("mean", *(percentile_key(p) for p in DEFAULT_PERCENTILES))
]


@pytest.mark.parametrize("name", SLO_NAMES)
def test_every_slo_name_reads_the_same_figure_live_and_stored(name):
    parse_slo(f"{name}<=1e9", flag="--slo")  # the grammar accepts it
    summary = summarize(records(), goodput=parse_goodput("ttft:100"))
    point = point_from_summary(summary.to_json(), load_point=0, title="t", offered=1.0, gpus=1)
    live, stored = summary.value(name), point.value(name)
    assert live is not None and stored == pytest.approx(live), name


def test_defaults_and_labels_come_from_one_place():
    sc = Scenario()
    assert tuple(sc.percentiles) == DEFAULT_PERCENTILES
    assert tuple(sc.percentile_metrics) == LATENCY_METRICS
    assert set(LATENCY_LABELS) == set(LATENCY_METRICS)


def test_the_measured_window_leaves_out_warm_up_and_cool_down_by_schedule():
    cols = Columns.from_records(records())  # intended 0, 10, ..., 390 ms
    assert cols.measured() is cols and cols.measured(0.0, None) is cols
    kept = cols.measured(0.1, 0.05)  # from 100 ms to 390 - 50 = 340 ms inclusive
    assert (kept.intended_ns / MS).tolist() == list(range(100, 341, 10))
    empty = Columns.from_records([])
    assert len(empty.measured(1.0, 1.0).state) == 0


def test_every_backend_name_has_one_dialect():
    """The API's `backend` field and --backend accept exactly the dialects the wire knows."""
    from bench.backends.dialects import DIALECTS
    from server.models import TargetIn

    backend = TargetIn.model_json_schema()["properties"]["backend"]["anyOf"][0]
    assert backend["enum"] == list(DIALECTS.names()) == ["vllm", "sglang", "trtllm", "openai"]
