"""Choosing a setting (bench.choose): an experiment's runs ranked by $/Mtok and capacity at the
SLO with their ranges; the verdict names the winner and how far ahead it is, or says "not
separable" when the ranges overlap; compare, the dashboard and the deck all show it."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from typer.testing import CliRunner

from bench.choose import rank_settings
from bench.cli import app
from bench.cost import cost_table, load_catalogue
from bench.curves import Capacity, RunComparison, RunCurve, point_from_summary
from bench.metrics import parse_thresholds
from bench.scenario import parse_scenario
from bench.sim_tune import Space, search
from tests.helpers import TINY_TUNE_SCENARIO

SLO = parse_thresholds("p99_ttft_ms<=500,p99_tpot_ms<=25")


def _comparison(run_id: str, value: float, low: float, high: float, gpu: str = "B200"):
    """A run at capacity `value` output tok/s per GPU (range low-high) on one `gpu`."""
    point = point_from_summary(
        {"throughput": {"output_tokens_per_s": value, "total_tokens_per_s": 3 * value,
                        "requests_per_s": value / 100}, "completed": 100},
        load_point=0, title="rate 1 req/s", offered=1.0, gpus=1,
    )  # fmt: skip
    cap = Capacity("interpolated", SLO, point, low=low, high=high)
    curve = RunCurve(run_id, run_id, run_id, gpu, 1, "m", True, None, "completed")
    rows = cost_table(gpu, 1, value, 3 * value, load_catalogue())
    return RunComparison(curve, point, None, rows, "SLO capacity", cap)


def _info(settings: dict | None, experiment: str = "exp"):
    tune = {"experiment": experiment, "settings": settings} if settings is not None else None
    return SimpleNamespace(extra_json={"tune": tune} if tune else {})


def test_the_winner_and_how_far_ahead_when_the_ranges_separate():
    comps = [_comparison("slow", 1000, 950, 1050), _comparison("fast", 2000, 1900, 2100)]
    ranking = rank_settings(comps, [_info({"seqs": 8}), _info({"seqs": 64})])
    assert [r.name for r in ranking.ranked] == ["seqs=64", "seqs=8"]
    assert ranking.experiment == "exp" and "$/Mtok" in ranking.basis
    v = ranking.verdict
    assert v.startswith("Winner: seqs=64, 2,000 tok/s per GPU (range 1,900-2,100)")
    assert "2.00x (range 1.81x-2.21x) the runner-up's capacity (seqs=8)" in v
    assert "2.00x lower $/Mtok" in v and v.endswith("ahead beyond both ranges")
    first = ranking.rows()[0]
    assert first[1] == "seqs=64" and "range $" in first[4]


def test_overlapping_ranges_are_not_separable():
    comps = [_comparison("a", 1000, 800, 1200), _comparison("b", 1100, 900, 1300)]
    ranking = rank_settings(comps, [_info({"tp": 1}), _info({"tp": 2})])
    assert ranking.ranked[0].name == "tp=2"
    assert "1.10x" in ranking.verdict
    assert ranking.verdict.endswith("not separable (the ranges overlap, so the order could flip)")


def test_runs_that_are_not_an_experiments_settings_are_not_ranked():
    comps = [_comparison("a", 1000, 800, 1200), _comparison("b", 1100, 900, 1300)]
    assert rank_settings(comps, [_info(None), _info(None)]) is None
    assert rank_settings(comps, [_info({"tp": 1}), _info(None)]) is None


def test_unpriced_runs_are_ranked_by_capacity():
    comps = [_comparison("a", 1000, 990, 1010), _comparison("b", 3000, 2900, 3100)]
    for c in comps:
        c.cost_rows = []
    ranking = rank_settings(comps, [_info({"x": 1}), _info({"x": 2})])
    assert ranking.basis == "capacity per GPU at the SLO"
    assert ranking.ranked[0].name == "x=2"
    assert "3.00x" in ranking.verdict and "ahead" in ranking.verdict


@pytest.fixture(scope="module")
def tuned(tmp_path_factory):
    """A stored sim tune: H100 at two batch limits, so two runs of one experiment."""
    db = str(tmp_path_factory.mktemp("choose") / "t.db")
    sc = parse_scenario(
        TINY_TUNE_SCENARIO,
        source="tiny",
    )
    space = Space(gpus=["H100"], precisions=["fp8"], mtp=[0], max_num_seqs=[4, 16],
                  parallels=["tp1"], refine=False, disagg=[])  # fmt: skip
    result = search(sc, "llama-3.1-8b", space, SLO, load_catalogue(), db=db, top=2,
                    slo_iterations=5, slo_draws=0, experiment="tiny-tune", prune=False)  # fmt: skip
    return db, result


def test_compare_ranks_a_sim_tunes_runs(tuned):
    db, result = tuned
    ids = [o.run_id for o in result.searched()]
    res = CliRunner().invoke(app, ["compare", *ids[::-1], "--db", db], env={"COLUMNS": "250"})
    assert res.exit_code == 0, res.output
    assert "Settings of tiny-tune ranked by" in res.output
    best = result.searched()[0].config
    assert (
        f"Winner: gpu=H100, parallel=tp1, precision=fp8, mtp=0, max_num_seqs={best.max_num_seqs}"
        in res.output
    )


def test_report_html_deck_and_dashboard_show_the_ranking(tuned, tmp_path):
    from fastapi.testclient import TestClient

    from bench.export.html import render_html
    from bench.export.report import build_report
    from server.app import create_app

    db, result = tuned
    ids = [o.run_id for o in result.searched()]
    report = build_report(ids, db)
    assert report.ranking is not None and report.ranking.experiment == "tiny-tune"
    table = next(t for t in report.tables if t.name == "settings")
    assert table.note == report.ranking.verdict and len(table.rows) == 2
    html = render_html(report)
    assert 'id="settings-ranking"' in html and "Winner:" in html
    pytest.importorskip("pptx")
    from pptx import Presentation

    from bench.export.pptx import write_pptx

    deck = Presentation(str(write_pptx(report, tmp_path / "deck.pptx")))
    texts = [
        " ".join(sh.text_frame.text for sh in slide.shapes if sh.has_text_frame)
        for slide in deck.slides
    ]
    ranked = [t for t in texts if "Settings of tiny-tune ranked" in t]
    assert ranked and "Winner:" in ranked[0]
    app_ = create_app(db, api_token="t", allow_hosts=[], open_reads=True,
                      server_names=["testserver"])  # fmt: skip
    try:
        with TestClient(app_) as client:
            page = client.get("/compare", params=[("run", i) for i in ids])
            assert page.status_code == 200
            assert 'id="settings-verdict"' in page.text and "Winner:" in page.text
    finally:
        app_.state.tb.jobs.shutdown()
