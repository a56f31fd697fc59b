"""Golden tests for the pricing catalogue and the cost model; expected values worked by hand."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from bench import cost
from bench.cli import app
from bench.cost import (
    PriceCatalogueError,
    cost_at_utilisation,
    cost_table,
    dollars_per_mtok,
    energy_cost_per_mtok,
    energy_estimate,
    joules_per_token,
    load_catalogue,
    price_per_gpu_hour,
    tco_breakdown,
    utilisation_multiple,
)

SHIPPED_GPUS = ["H100-SXM", "H200-SXM", "B200-SXM", "B300-SXM", "MI300X", "MI355X"]


def _profiles_available() -> bool:
    try:
        from bench.sim.profiles import get_gpu

        get_gpu("H100-SXM")
    except Exception:
        return False
    return True


needs_profiles = pytest.mark.skipif(
    not _profiles_available(), reason="bench.sim.profiles (GPU TDP) not importable yet"
)


@pytest.fixture(scope="module")
def cat() -> cost.Catalogue:
    return load_catalogue()


def write(tmp_path: Path, data: object, name: str = "mine.yaml") -> Path:
    p = tmp_path / name
    p.write_text(data if isinstance(data, str) else yaml.safe_dump(data), "utf-8")
    return p


# --------------------------------------------------------------------------- the formula


def test_seed_figure_2_50_per_hour_at_1000_tokens_per_s():
    # $2.50 / (1,000 tok/s x 3,600 s) x 1e6 = 2.5 / 3.6 = 0.69444...
    assert dollars_per_mtok(2.50, 1, 1000.0) == pytest.approx(0.694444, rel=1e-6)
    assert round(dollars_per_mtok(2.50, 1, 1000.0), 3) == 0.694


def test_gpu_count_multiplies_price_and_throughput_is_the_deployments():
    # 8 GPUs at $2.50 = $20/h; 8,000 tok/s -> same per-token cost as 1 GPU at 1,000 tok/s.
    assert dollars_per_mtok(2.50, 8, 8000.0) == pytest.approx(0.694444, rel=1e-6)
    # 8 GPUs sharing 1,000 tok/s: 20 / 3.6 = 5.5556
    assert dollars_per_mtok(2.50, 8, 1000.0) == pytest.approx(5.555556, rel=1e-6)


def test_inferencex_formula_reproduces_published_b200_gptoss_point(cat):
    # published.md 2b: B200 gpt-oss 25,320 tok/s/GPU, costh $1.95:
    # 25,320 x 3,600 / 1e6 = 91.152 Mtok/h; 1.95 / 91.152 = 0.021393 $/Mtok (page shows 0.022).
    price = price_per_gpu_hour(cat.tier("B200-SXM", "inferencex-own-hyperscaler"), cat)
    assert price == 1.95
    assert dollars_per_mtok(price, 8, 8 * 25_320.0) == pytest.approx(0.0213928, rel=1e-5)
    # InferenceX's own form: price / (tput_per_gpu x 3600 / 1e6)
    assert dollars_per_mtok(price, 1, 25_320.0) == pytest.approx(1.95 / (25_320 * 3600 / 1e6))


@pytest.mark.parametrize("tps", [0.0, -5.0, math.nan, None])
def test_no_throughput_is_none_not_zero_division(tps):
    assert dollars_per_mtok(2.5, 1, tps) is None
    assert joules_per_token(700.0, 1, tps) is None
    assert energy_cost_per_mtok(700.0, 1, tps, 0.08) is None
    assert cost_at_utilisation(None, 0.5) is None


@pytest.mark.parametrize("gpus", [0, -1, 1.5, True])
def test_bad_gpu_count_is_a_clear_error(gpus):
    with pytest.raises(PriceCatalogueError, match="GPU count"):
        dollars_per_mtok(2.5, gpus, 1000.0)


def test_negative_price_is_an_error():
    with pytest.raises(PriceCatalogueError, match="price per GPU-hour"):
        dollars_per_mtok(-1.0, 1, 1000.0)


# --------------------------------------------------------------------------- utilisation


def test_utilisation_30_vs_85_percent_is_2_83x():
    # 0.85 / 0.30 = 2.8333
    assert utilisation_multiple(0.30, 0.85) == pytest.approx(2.833333, rel=1e-6)
    busy = dollars_per_mtok(2.50, 1, 1000.0)  # 0.69444
    at30 = cost_at_utilisation(busy, 0.30)  # 0.69444 / 0.30 = 2.31481
    at85 = cost_at_utilisation(busy, 0.85)  # 0.69444 / 0.85 = 0.81699
    assert at30 == pytest.approx(2.314815, rel=1e-6)
    assert at85 == pytest.approx(0.816993, rel=1e-6)
    assert at30 / at85 == pytest.approx(2.833333, rel=1e-6)
    assert cost_at_utilisation(busy, 1.0) == busy


@pytest.mark.parametrize("u", [0.0, -0.2, 1.5, 30, math.nan])
def test_bad_utilisation(u):
    with pytest.raises(PriceCatalogueError, match=r"utilisation must be in \(0, 1\]"):
        cost_at_utilisation(1.0, u)


# --------------------------------------------------------------------------- energy


def test_energy_per_token_hand_computed():
    # 8 GPUs x 700 W = 5,600 W; / 20,000 tok/s = 0.28 J/token
    assert joules_per_token(700.0, 8, 20_000.0) == pytest.approx(0.28)
    # 1e6 tokens x 0.28 J = 280,000 J = 0.0777... kWh; x PUE 1.3 = 0.10111 kWh; x $0.08 = $0.0080889
    assert energy_cost_per_mtok(700.0, 8, 20_000.0, 0.08, 1.3) == pytest.approx(
        0.00808889, rel=1e-6
    )
    assert energy_cost_per_mtok(700.0, 8, 20_000.0, 0.08) == pytest.approx(0.00622222, rel=1e-6)


@needs_profiles
def test_energy_estimate_defaults_to_profile_tdp_and_prefers_measured(cat):
    from bench.sim.profiles import get_gpu

    tdp = get_gpu("B200-SXM").tdp_w
    est = energy_estimate("B200-SXM", 1, 10_000.0, cat)
    assert est.power_from == "profile TDP"
    assert est.power_w == tdp
    assert est.joules_per_token == pytest.approx(tdp / 10_000.0)
    # measured 600 W: 0.06 J/token; 1e6 x 0.06 = 60,000 J = 0.016667 kWh; x1.3 x0.08 = 0.0017333
    est = energy_estimate("B200-SXM", 1, 10_000.0, cat, measured_power_w=600.0)
    assert est.power_from == "measured"
    assert est.joules_per_token == pytest.approx(0.06)
    assert est.kwh_per_mtok == pytest.approx(0.0166667, rel=1e-5)
    assert est.energy_usd_per_mtok == pytest.approx(0.00173333, rel=1e-5)
    none = energy_estimate("B200-SXM", 1, 0.0, cat, measured_power_w=600.0)
    assert none.joules_per_token is None and "no throughput" in none.note


# --------------------------------------------------------------------------- TCO


@needs_profiles
def test_owned_tco_h100_hand_computed(cat):
    # Uses the H100 profile's TDP (700 W in bench/sim/profiles/gpus.yaml; never typed in prices.yaml).
    # amortisation 30,000 / (4 x 8,760) = 0.856164; power 0.700 kW x 1.3 x $0.08 = 0.0728;
    # hosting 0.20 + operations 0.10  ->  1.228964 $/GPU-h
    from bench.sim.profiles import get_gpu

    assert get_gpu("H100-SXM").tdp_w == 700
    tier = cat.tier("H100-SXM", "owned-tco")
    b = tco_breakdown(tier, cat.tco_defaults)
    assert b.power_from == "profile TDP"
    assert b.amortisation_usd_per_gpu_hr == pytest.approx(0.856164, rel=1e-5)
    assert b.power_usd_per_gpu_hr == pytest.approx(0.0728)
    assert b.total_usd_per_gpu_hr == pytest.approx(1.228964, rel=1e-5)
    assert price_per_gpu_hour(tier, cat) == pytest.approx(1.228964, rel=1e-5)


def test_owned_tco_with_stated_power_needs_no_profile(tmp_path):
    # capex 20,000 over 5 years: 20,000 / 43,800 = 0.456621; power 1,500 W x 1.2 / 1000 x 0.10 = 0.18;
    # hosting 0.30 + operations 0.05  ->  0.986621
    f = write(
        tmp_path,
        {
            "gpus": {
                "A100-SXM": {
                    "mine": {
                        "kind": "owned",
                        "provider": "self",
                        "source": "my finance team",
                        "date": "2026-06",
                        "tco": {
                            "capex_usd_per_gpu": {"value": 20000, "source": "invoice"},
                            "life_years": {"value": 5, "note": "assumption"},
                            "pue": {"value": 1.2, "note": "assumption"},
                            "usd_per_kwh": {"value": 0.10, "source": "tariff"},
                            "hosting_usd_per_gpu_hr": {"value": 0.30, "note": "assumption"},
                            "operations_usd_per_gpu_hr": {"value": 0.05, "note": "assumption"},
                            "power_w": {"value": 1500, "note": "all-in measured at the wall"},
                        },
                    }
                }
            }
        },
    )
    cat = load_catalogue(f)
    tier = cat.tier("A100-SXM", "mine")
    b = tco_breakdown(tier, cat.tco_defaults)
    assert b.power_from == "tier power_w"
    assert b.amortisation_usd_per_gpu_hr == pytest.approx(0.456621, rel=1e-5)
    assert b.power_usd_per_gpu_hr == pytest.approx(0.18)
    assert price_per_gpu_hour(tier, cat) == pytest.approx(0.986621, rel=1e-5)


@needs_profiles
def test_user_tco_defaults_reprice_every_owned_tier(tmp_path, cat):
    # $/kWh 0.08 -> 0.18 adds 0.700 kW x 1.3 x 0.10 = 0.091 to the H100 owned tier
    f = write(tmp_path, {"tco_defaults": {"usd_per_kwh": {"value": 0.18, "source": "my tariff"}}})
    mine = load_catalogue(f)
    before = price_per_gpu_hour(cat.tier("H100-SXM", "owned-tco"), cat)
    after = price_per_gpu_hour(mine.tier("H100-SXM", "owned-tco"), mine)
    assert after - before == pytest.approx(0.091)


# --------------------------------------------------------------------------- shipped catalogue


def test_shipped_catalogue_has_every_gpu_and_documented_tiers(cat):
    assert set(SHIPPED_GPUS) <= set(cat.gpu_names())
    for gpu in SHIPPED_GPUS:
        names = {t.name for t in cat.tiers(gpu)}
        # the three InferenceX tiers, so users can reproduce its $/Mtok exactly
        assert {
            "inferencex-own-hyperscaler",
            "inferencex-own-neocloud",
            "inferencex-rental-3yr",
        } <= names
        for t in cat.tiers(gpu):
            assert t.source and t.date, (gpu, t.name)
    assert {"hyperscaler-on-demand", "neocloud-on-demand", "reserved-1yr", "spot", "owned-tco"} <= {
        t.name for t in cat.tiers("B200-SXM")
    }


def test_shipped_inferencex_and_market_figures(cat):
    px = {(t.gpu, t.name): t.price_usd_per_gpu_hr for t in cat.tiers()}
    assert px[("B200-SXM", "inferencex-own-hyperscaler")] == 1.95
    assert px[("B200-SXM", "inferencex-own-neocloud")] == 2.34
    assert px[("B200-SXM", "inferencex-rental-3yr")] == 2.90
    assert px[("H100-SXM", "inferencex-own-hyperscaler")] == 1.30
    assert px[("H100-SXM", "neocloud-on-demand")] == 2.99
    # reserved 1-yr = 0.625 x on-demand: 2.99 x 0.625 = 1.86875
    assert price_per_gpu_hour(cat.tier("H100-SXM", "reserved-1yr"), cat) == pytest.approx(1.86875)


def test_tdp_is_never_typed_into_prices_yaml():
    text = (Path(cost.__file__).parent / "data" / "prices.yaml").read_text("utf-8")
    data = yaml.safe_load(text)

    def keys(node):
        if isinstance(node, dict):
            for k, v in node.items():
                yield k
                yield from keys(v)

    assert not {"tdp", "tdp_w", "power_w"} & set(keys(data))


@needs_profiles
def test_shipped_gpu_names_match_profiles_and_aliases_resolve(cat):
    from bench.sim.profiles import get_gpu

    for gpu in SHIPPED_GPUS:
        assert get_gpu(gpu).name == gpu
    assert cat.resolve_gpu("b200") == "B200-SXM"
    assert cat.resolve_gpu("mi300x") == "MI300X"


def test_unknown_gpu_is_a_clear_error(cat):
    with pytest.raises(PriceCatalogueError, match="no prices for GPU 'TPU-v9'"):
        cat.tiers("TPU-v9")


# --------------------------------------------------------------------------- cost_table


def test_cost_table_b200_spot_hand_computed(cat):
    # 8 x B200 at $2.25 = $18/h; output 8,000 tok/s -> 18 / 28.8 = 0.625 $/Mtok;
    # total 16,000 tok/s -> 0.3125; at 30% utilisation: 0.625 / 0.3 = 2.08333
    rows = cost_table("B200-SXM", 8, 8000.0, 16000.0, cat, utilisation=0.3)
    spot = next(r for r in rows if r.tier == "spot")
    assert spot.price_usd_per_gpu_hr == 2.25
    assert spot.output_usd_per_mtok == pytest.approx(0.625)
    assert spot.total_usd_per_mtok == pytest.approx(0.3125)
    assert spot.output_usd_per_mtok_at_utilisation == pytest.approx(2.083333, rel=1e-6)
    assert spot.total_usd_per_mtok_at_utilisation == pytest.approx(1.041667, rel=1e-6)
    assert spot.idle_multiple == pytest.approx(3.333333, rel=1e-6)
    assert {r.tier for r in rows} == {t.name for t in cat.tiers("B200-SXM")}
    assert all(r.gpu == "B200-SXM" for r in rows)


def test_cost_table_seed_figure_via_cli_override(cat):
    mine = load_catalogue(overrides=["H100-SXM:seed=2.50"])
    rows = cost_table("h100", 1, 1000.0, 3000.0, mine)
    seed = next(r for r in rows if r.tier == "seed")
    assert round(seed.output_usd_per_mtok, 3) == 0.694
    assert seed.total_usd_per_mtok == pytest.approx(0.231481, rel=1e-5)  # 2.5 / 10.8


def test_cost_table_without_throughput_gives_none_and_a_note(cat):
    rows = cost_table("B200-SXM", 8, 0.0, 0.0, cat)
    assert rows and all(r.output_usd_per_mtok is None for r in rows)
    assert all(r.output_usd_per_mtok_at_utilisation is None for r in rows)
    assert all("no output throughput" in r.note for r in rows)


# --------------------------------------------------------------------------- user file and CLI overrides


def test_user_file_overrides_price_and_derived_tiers_follow(tmp_path):
    f = write(
        tmp_path,
        {
            "gpus": {
                "b200": {  # an alias
                    "neocloud-on-demand": {"price_usd_per_gpu_hr": 5.00, "source": "my quote"},
                    "my-contract": {
                        "kind": "reserved",
                        "provider": "neocloud",
                        "term_years": 2,
                        "price_usd_per_gpu_hr": 3.40,
                        "source": "signed contract",
                        "date": "2026-07",
                    },
                }
            }
        },
    )
    cat = load_catalogue(f)
    tier = cat.tier("B200-SXM", "neocloud-on-demand")
    assert tier.price_usd_per_gpu_hr == 5.00 and tier.source == "my quote"
    assert tier.kind == "on_demand" and tier.date == "2026-03"  # other fields kept
    # reserved-1yr = 0.625 x 5.00 = 3.125; hyperscaler = 2 x 5.00 = 10
    assert price_per_gpu_hour(cat.tier("B200-SXM", "reserved-1yr"), cat) == pytest.approx(3.125)
    assert price_per_gpu_hour(cat.tier("B200-SXM", "hyperscaler-on-demand"), cat) == pytest.approx(
        10
    )
    assert cat.tier("B200-SXM", "my-contract").price_usd_per_gpu_hr == 3.40
    # the rest of the shipped catalogue is still there
    assert cat.tier("H100-SXM", "inferencex-own-hyperscaler").price_usd_per_gpu_hr == 1.30


def test_cli_override_replaces_existing_and_adds_new():
    cat = load_catalogue(
        overrides=["B200-SXM:my-deal=3.10", "b200:spot=2.00", "H100-SXM:owned-tco=1.10"]
    )
    deal = cat.tier("B200-SXM", "my-deal")
    assert deal.price_usd_per_gpu_hr == 3.10 and deal.kind == "custom"
    assert "--price" in deal.source
    spot = cat.tier("B200-SXM", "spot")
    assert spot.price_usd_per_gpu_hr == 2.00 and spot.kind == "spot"
    owned = cat.tier("H100-SXM", "owned-tco")
    assert owned.tco is None and owned.kind == "custom"
    assert price_per_gpu_hour(owned, cat) == 1.10


def test_file_then_cli_override_order(tmp_path):
    f = write(tmp_path, {"gpus": {"B200-SXM": {"spot": {"price_usd_per_gpu_hr": 2.10}}}})
    cat = load_catalogue(f, ["B200-SXM:spot=1.90"])
    assert cat.tier("B200-SXM", "spot").price_usd_per_gpu_hr == 1.90


# --------------------------------------------------------------------------- bad input


def test_bad_price_in_file_names_file_field_and_value(tmp_path):
    f = write(tmp_path, {"gpus": {"B200-SXM": {"spot": {"price_usd_per_gpu_hr": -3}}}})
    with pytest.raises(PriceCatalogueError) as exc:
        load_catalogue(f)
    msg = str(exc.value)
    assert str(f) in msg
    assert "gpus.B200-SXM.spot.price_usd_per_gpu_hr" in msg
    assert "-3" in msg


def test_non_numeric_price_in_file(tmp_path):
    f = write(tmp_path, {"gpus": {"H100-SXM": {"spot": {"price_usd_per_gpu_hr": "cheap"}}}})
    with pytest.raises(PriceCatalogueError, match=r"price_usd_per_gpu_hr.*'cheap'"):
        load_catalogue(f)


def test_new_tier_missing_fields(tmp_path):
    f = write(tmp_path, {"gpus": {"H100-SXM": {"deal": {"price_usd_per_gpu_hr": 2.0}}}})
    with pytest.raises(PriceCatalogueError) as exc:
        load_catalogue(f)
    msg = str(exc.value)
    assert "gpus.H100-SXM.deal.kind" in msg and "gpus.H100-SXM.deal.source" in msg


def test_typo_field_is_rejected(tmp_path):
    f = write(tmp_path, {"gpus": {"H100-SXM": {"spot": {"prise_usd_per_gpu_hr": 2.0}}}})
    with pytest.raises(PriceCatalogueError, match="prise_usd_per_gpu_hr"):
        load_catalogue(f)


def test_assumption_without_provenance_is_rejected(tmp_path):
    f = write(tmp_path, {"tco_defaults": {"pue": {"value": 1.5}}})
    with pytest.raises(PriceCatalogueError, match=r"tco_defaults\.pue.*source.*note"):
        load_catalogue(f)


def test_derived_from_missing_tier(tmp_path):
    f = write(
        tmp_path,
        {"gpus": {"H100-SXM": {"reserved-1yr": {"derived": {"from_tier": "nope", "factor": 0.6}}}}},
    )
    with pytest.raises(PriceCatalogueError, match=r"reserved-1yr\.derived\.from_tier.*'nope'"):
        load_catalogue(f)


def test_invalid_yaml_names_file(tmp_path):
    f = write(tmp_path, "gpus: {B200-SXM: [unclosed\n")
    with pytest.raises(PriceCatalogueError, match=rf"{f.name}.*not valid YAML"):
        load_catalogue(f)


def test_missing_file(tmp_path):
    with pytest.raises(PriceCatalogueError, match="cannot read prices file"):
        load_catalogue(tmp_path / "absent.yaml")


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("B200-SXM=3.1", "expected GPU:tier=price"),
        ("B200-SXM:deal=abc", "'abc' must be a positive number"),
        ("B200-SXM:deal=0", "'0' must be a positive number"),
        ("B20-SXM:deal=3.1", "no prices for GPU 'B20-SXM'"),
    ],
)
def test_bad_cli_overrides(text, match):
    with pytest.raises(PriceCatalogueError, match=match):
        load_catalogue(overrides=[text])


# --------------------------------------------------------------------------- the prices command


def test_prices_command_lists_catalogue():
    r = CliRunner().invoke(app, ["prices"])
    assert r.exit_code == 0, r.output
    for gpu in SHIPPED_GPUS:
        assert gpu in r.output
    assert "inferencex-own-hyperscaler" in r.output and "1.95" in r.output


def test_prices_command_filters_and_overrides(tmp_path):
    f = write(tmp_path, {"gpus": {"B200-SXM": {"spot": {"price_usd_per_gpu_hr": 2.05}}}})
    r = CliRunner().invoke(
        app,
        ["prices", "--gpu", "b200", "--prices-file", str(f), "--price", "B200-SXM:my-deal=3.10"],
    )
    assert r.exit_code == 0, r.output
    assert "my-deal" in r.output and "3.10" in r.output and "2.05" in r.output
    assert "H100-SXM" not in r.output


def test_prices_command_bad_input_exits_2_with_message():
    r = CliRunner().invoke(app, ["prices", "--price", "B200-SXM:deal=-1"])
    assert r.exit_code == 2
    assert "must be a positive number" in r.output


def test_price_of_user_tier_needs_no_catalogue_argument(tmp_path):
    # a tier remembers its catalogue: 0.5 x the user's 4.00 = 2.00, not 0.5 x the shipped 6.00
    f = write(
        tmp_path,
        {
            "gpus": {
                "B200-SXM": {
                    "neocloud-on-demand": {"price_usd_per_gpu_hr": 4.00},
                    "half": {
                        "kind": "reserved",
                        "derived": {"from_tier": "neocloud-on-demand", "factor": 0.5},
                        "source": "test",
                        "date": "2026-07",
                    },
                }
            }
        },
    )
    assert price_per_gpu_hour(load_catalogue(f).tier("B200-SXM", "half")) == pytest.approx(2.0)


def test_numpy_gpu_count_is_accepted():
    np = pytest.importorskip("numpy")
    assert dollars_per_mtok(2.5, np.int64(1), np.float64(1000.0)) == pytest.approx(
        0.694444, rel=1e-6
    )
