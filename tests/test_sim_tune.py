"""`tokenbench sim tune`: the pruned search finds what brute force finds on a tiny space, never
prunes the configuration brute force ranks best, drops configurations that cannot run with the
reason, stores each searched configuration, and prints the documented --json document."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from bench.choose import usd_range
from bench.cli import app
from bench.cost import load_catalogue
from bench.metrics import parse_thresholds
from bench.scenario import parse_scenario
from bench.sim_tune import PRUNE_MARGIN, Config, Space, search, tier_verdict
from bench.store import get_run
from tests.helpers import TINY_TUNE_SCENARIO

SLO = "p99_ttft_ms<=500,p99_tpot_ms<=25"
# llama-3.1-8b on H100: TP 1 or 2, MTP off or on, two batch limits: 8 configurations.
TINY = dict(gpus=["H100"], precisions=["fp8"], mtp=[0, 2], max_num_seqs=[4, 16],
            parallels=["tp1", "tp2"], refine=False, disagg=[])  # fmt: skip


def _search(**kw):
    sc = parse_scenario(TINY_TUNE_SCENARIO, source="tiny")
    return search(sc, "llama-3.1-8b", Space(**{**TINY, **kw.pop("space", {})}),
                  parse_thresholds(SLO), load_catalogue(), store=False, slo_iterations=5,
                  slo_draws=0, top=1, **kw)  # fmt: skip


@pytest.fixture(scope="module")
def brute():
    return _search(prune=False)


@pytest.fixture(scope="module")
def pruned():
    return _search()


def test_brute_force_searches_every_configuration(brute):
    assert len(brute.outcomes) == 8
    assert all(o.status == "searched" for o in brute.outcomes)
    values = [o.value for o in brute.outcomes]
    assert len(set(values)) > 1  # the settings matter, so the search has something to find


def test_pruned_search_finds_the_brute_force_best(brute, pruned):
    best = brute.searched()[0]
    found = pruned.searched()[0]
    assert found.config == best.config
    assert found.value == pytest.approx(best.value)
    # the cheapest on every tier is the same configuration, at the same $/Mtok
    want = {t["tier"]: t["by_gpu"][0] for t in brute.tiers()}
    got = {t["tier"]: t["by_gpu"][0] for t in pruned.tiers()}
    assert want.keys() == got.keys() and want
    for tier, entry in want.items():
        assert got[tier]["config"] == entry["config"]
        assert got[tier]["output_usd_per_mtok"] == pytest.approx(entry["output_usd_per_mtok"])


def test_pruning_skips_work_but_never_the_best(brute, pruned):
    by_config = {o.config: o for o in pruned.outcomes}
    assert by_config[brute.searched()[0].config].status == "searched"
    skipped = [o for o in pruned.outcomes if o.status == "pruned"]
    assert skipped, "nothing pruned: the bound did no work on this space"
    assert pruned.simulated_requests < brute.simulated_requests
    for o in brute.outcomes:  # the bound the pruning rests on, with its margin
        assert o.value <= o.peak_per_gpu * PRUNE_MARGIN
    for o in skipped:  # each skipped one really could not have beaten the one kept
        assert "saturated throughput" in o.reason
        full = next(b for b in brute.outcomes if b.config == o.config)
        assert full.value < brute.searched()[0].value


def test_a_configuration_that_does_not_fit_is_dropped_with_the_reason():
    sc = parse_scenario(TINY_TUNE_SCENARIO, source="tiny")
    space = Space(gpus=["H100"], precisions=["bf16", "fp4"], mtp=[0], max_num_seqs=[8],
                  parallels=["tp1"], refine=False)  # fmt: skip
    result = search(sc, "llama-3.3-70b", space, parse_thresholds(SLO), load_catalogue(),
                    store=False)  # fmt: skip
    reasons = {o.config.precision: o.reason for o in result.outcomes}
    assert all(o.status == "unfit" for o in result.outcomes)
    assert "does not fit" in reasons["bf16"]
    assert "cannot serve fp4" in reasons["fp4"]
    assert result.searched() == [] and result.simulated_requests == 0


def test_sensitivity_names_the_setting_that_moved_capacity_most(brute):
    rows = brute.sensitivity()
    assert {r["setting"] for r in rows} == {"parallel", "mtp", "max_num_seqs"}
    top = rows[0]
    assert top["loss"] == max(r["loss"] for r in rows) > 0
    best = brute.searched()[0]
    assert top["best_value"] == getattr(best.config, top["setting"])


def test_refinement_tries_batch_limits_between_the_coarse_ones():
    from bench.sim_tune import refinements

    space = Space(gpus=["H100"], max_num_seqs=[32, 128, 512])
    out = refinements(Config("H100", "tp1", "fp8", 0, 128, None), space)
    assert {c.max_num_seqs for c in out} == {64, 128, 256}
    assert {c.max_num_batched_tokens for c in out} == {None, 4096, 16384}


def test_tier_verdict_says_not_separable_when_the_ranges_overlap():
    a = {"gpu": "B200", "config": "B200 tp1 fp8", "output_usd_per_mtok": 1.0,
         "output_usd_per_mtok_low": 0.8, "output_usd_per_mtok_high": 1.2}  # fmt: skip
    b = {**a, "gpu": "H100", "config": "H100 tp2 fp8", "output_usd_per_mtok": 1.3,
         "output_usd_per_mtok_low": 1.1, "output_usd_per_mtok_high": 1.5}  # fmt: skip
    assert tier_verdict([a, b]).endswith("not separable (their ranges overlap)")
    assert "1.30x cheaper than H100" in tier_verdict([a, b])
    apart = {**b, "output_usd_per_mtok": 2.0, "output_usd_per_mtok_low": 1.7}
    assert "not separable" not in tier_verdict([a, apart])


def test_tier_verdict_of_two_simulated_gpus_reads_the_fits_error_on_their_ratio():
    """Two GPUs simulated with the published fit share its errors: 1.4x cheaper is apart
    when the ratio's range (measured parts x/÷ the fit's error on a ratio of GPUs) keeps
    the order, though each side's own $/Mtok range (x/÷ its full error) overlaps the other's."""
    from bench.curves import capacity_at_slo
    from tests.test_capacity_properties import SLO, _curve, _point

    def cap(tps: float, run: str):
        pts = [_point(8, tps, 900, 40), _point(10, tps * 1.05, 900, 60)]
        return capacity_at_slo(_curve(pts, run, simulated=True), SLO)

    fast, slow = cap(2800, "a"), cap(1000, "b")  # 2.8x the capacity at 2x the price: 1.4x
    a = {"gpu": "B200", "config": "B200", "output_usd_per_mtok": 1.0}
    b = {"gpu": "H100", "config": "H100", "output_usd_per_mtok": 1.4}
    for e, c in ((a, fast), (b, slow)):
        e["output_usd_per_mtok_low"], e["output_usd_per_mtok_high"] = usd_range(
            e["output_usd_per_mtok"], c
        )
    assert a["output_usd_per_mtok_high"] > b["output_usd_per_mtok_low"]  # each side overlaps
    assert tier_verdict([a, b]).endswith("not separable (their ranges overlap)")
    assert "not separable" not in tier_verdict([a, b], [fast, slow])
    # 1.1x cheaper is within the fit's error on a ratio (13% for dense models): not apart
    close = {**b, "output_usd_per_mtok": 1.1}
    assert "not separable" in tier_verdict([a, close], [fast, slow])


def test_cli_json_document_and_stored_runs(tmp_path):
    scenario = tmp_path / "tiny.yaml"
    scenario.write_text(TINY_TUNE_SCENARIO.replace("seed: 7\n", ""))  # a drawn seed, shared by all
    db = str(tmp_path / "t.db")
    args = ["sim", "tune", "--model", "llama-3.1-8b", "--gpus", "H100,B200", "--slo", SLO,
            "--scenario", str(scenario), "--precisions", "fp8", "--mtp", "0",
            "--max-num-seqs", "4,16", "--parallel", "tp1", "--no-refine", "--slo-draws", "0",
            "--top", "2", "--name", "tiny-tune", "--disagg", "none", "--json", "--db", db]  # fmt: skip
    res = CliRunner().invoke(app, args, env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["simulated"] is True and doc["experiment"] == "tiny-tune"
    assert doc["slo"] == SLO and doc["model"] == "llama-3.1-8b"
    assert set(doc["expected_error"]) == {"H100", "B200"}
    assert 0 < doc["expected_error"]["H100"]["relative"] < 1
    assert set(doc["counts"]) == {"searched", "pruned", "unfit", "failed"}
    assert len(doc["configs"]) == 4
    for gpu in ("H100", "B200"):
        best = doc["best"][gpu][0]
        cap = best["capacity"]
        assert cap["kind"] == "interpolated"
        assert cap["low"] <= cap["output_tps_per_gpu"] <= cap["high"]
        assert cap["simulator_error"] == doc["expected_error"][gpu]["relative"]
        info = get_run(best["run_id"], db)
        assert info.simulated and info.gpu_type.startswith(gpu)
        tune = info.extra_json["tune"]
        assert tune["experiment"] == "tiny-tune" and tune["settings"] == best["settings"]
        assert tune["command"].startswith("tokenbench sim run --gpu " + gpu)
    seeds = {get_run(o["run_id"], db).extra_json.get("prompts", {}).get("seed")
             for o in doc["configs"] if o["run_id"]}  # fmt: skip
    assert len(seeds) == 1 and None not in seeds  # every configuration saw the same workload
    tier = next(t for t in doc["tiers"] if len(t["by_gpu"]) == 2)
    first, second = tier["by_gpu"]
    assert first["output_usd_per_mtok"] <= second["output_usd_per_mtok"]
    assert tier["verdict"].startswith(first["gpu"])
    assert {"gpu", "setting", "values", "loss", "loss_is_bound"} <= set(doc["sensitivity"][0])


def test_cli_needs_a_fitting_slo():
    res = CliRunner().invoke(app, ["sim", "tune", "--slo", "p99_ttft<=nope"])
    assert res.exit_code != 0
    assert "--slo" in res.output


def test_cli_says_when_no_configuration_meets_the_slo(tmp_path):
    args = ["sim", "tune", "--model", "llama-3.1-8b", "--gpus", "H100", "--slo", "p99_ttft_ms<=1",
            "--precisions", "fp8", "--mtp", "0", "--max-num-seqs", "16", "--parallel", "tp1",
            "--num-prompts", "40", "--no-refine", "--slo-draws", "0", "--disagg", "none",
            "--db", str(tmp_path / "t.db")]  # fmt: skip
    res = CliRunner().invoke(app, args, env={"COLUMNS": "200"})
    assert res.exit_code == 1
    assert "no configuration met the SLO" in res.output
    assert (
        "No configuration met the SLO" in res.output and "Cheapest configuration" not in res.output
    )


def test_a_gpu_whose_best_configuration_drafts_states_the_mtp_error(tmp_path):
    """The per-GPU expected error says what its best configuration's range carries: with MTP
    drafts, at least the published MTP speed-ups' error (bench.sim.profiles.accuracy)."""
    scenario = tmp_path / "tiny.yaml"
    scenario.write_text(TINY_TUNE_SCENARIO)
    args = ["sim", "tune", "--model", "llama-3.1-8b", "--gpus", "H100", "--slo", SLO,
            "--scenario", str(scenario), "--precisions", "fp8", "--mtp", "2",
            "--max-num-seqs", "16", "--parallel", "tp1", "--no-refine", "--slo-draws", "0",
            "--disagg", "none", "--json", "--db", str(tmp_path / "t.db")]  # fmt: skip
    res = CliRunner().invoke(app, args, env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    err = doc["expected_error"]["H100"]
    assert "MTP speed-ups" in err["basis"]
    assert err["per_quantity"]["output_tps"] >= 0.25  # above the dense category's 21%
