"""How simulated drafts are accepted (bench.sim.roofline.mtp_per_position) and what a verify
step costs, against TensorRT-LLM's published DeepSeek-R1 measurement [S80]."""

import pytest

from bench.sim.roofline import Deployment, steady_state

# [S80] DeepSeek-R1 on 8 x B200, FP4 MoE, 1k in / 2k out, batch 1: mean acceptance length and
# speed-up over no MTP for 1-5 drafts
PUBLISHED_AL = (1.92, 2.58, 2.82, 2.99, 3.01)
PUBLISHED_SPEEDUP = (1.78, 2.25, 2.28, 2.21, 2.15)


def _dsr1(parallel: str, drafts: int, **acceptance: float) -> Deployment:
    tp, ep = 8, (8 if parallel == "tep8" else 1)
    return Deployment.build(
        "B200", "deepseek-r1", "fp4", tp, ep=ep, engine="trtllm", mtp=drafts, **acceptance
    )


def test_deepseek_r1_accepts_drafts_as_published_by_default() -> None:
    """--mtp N without an acceptance: the model's published curve, each position's share
    AL(k) - AL(k-1); a stated acceptance keeps one figure for every draft."""
    for drafts, al in enumerate(PUBLISHED_AL, start=1):
        assert _dsr1("tp8", drafts).mtp_gain == pytest.approx(al, abs=1e-6)
    assert _dsr1("tp8", 3).mtp_positions == pytest.approx((0.92, 0.66, 0.24))
    assert _dsr1("tp8", 3, mtp_acceptance=0.85).mtp_gain == pytest.approx(
        1 + 0.85 + 0.85**2 + 0.85**3
    )
    beyond = _dsr1("tp8", 8).mtp_positions  # past the curve: its last ratio, never rising
    assert all(a >= b for a, b in zip(beyond, beyond[1:], strict=False))
    assert 3.01 < 1 + sum(beyond) < 3.02
    llama = Deployment.build("B200", "llama-3.3-70b", "fp8", 8, mtp=2)  # no published curve
    assert llama.mtp_positions == pytest.approx((0.85, 0.85**2))


def test_a_stated_acceptance_length_is_the_gain() -> None:
    dep = _dsr1("tp8", 3, mtp_acceptance_length=2.5)
    assert dep.mtp_gain == pytest.approx(2.5)
    a = dep.mtp_positions[0]
    assert dep.mtp_positions == pytest.approx((a, a**2, a**3))
    with pytest.raises(ValueError, match="1 to 4 tokens"):
        _dsr1("tp8", 3, mtp_acceptance_length=4.5)
    with pytest.raises(ValueError, match="give one"):
        _dsr1("tp8", 3, mtp_acceptance=0.8, mtp_acceptance_length=2.5)
    with pytest.raises(ValueError, match="give --mtp N too"):
        _dsr1("tp8", 0, mtp_acceptance_length=2.5)


@pytest.mark.parametrize(("parallel", "within"), [("tp8", 0.07), ("tep8", 0.10)])
def test_draft_and_verify_cost_gives_the_published_speedups(parallel: str, within: float) -> None:
    """Never fitted on: with the published acceptance lengths, what the simulator charges for
    drafting and verifying (roofline._draft_time, the verify step's extra rows) gives
    TensorRT-LLM's batch-1 speed-ups of 1-5 drafts (1.78, 2.25, 2.28, 2.21, 2.15) within 7% on
    TP8 (simulated 1.79, 2.26, 2.33, 2.34, 2.25; within 5% before the sixth refit added MLA's
    per-layer cost to every step, the one draft layer's share of it to a draft: 1.78, 2.23,
    2.30, 2.30, 2.19) and within 10% on TEP8 (1.81, 2.28, 2.36, 2.37, 2.27; the blog's experts
    run EP4TP2, between the two), and 3
    drafts best as published (within 1% of the best; with 0.85 for every draft the simulated
    speed-up kept rising to 2.86 at 5)."""
    base = steady_state(_dsr1(parallel, 0), 1024, 2048, 1)["tpot_s"]
    speedups = [
        base / steady_state(_dsr1(parallel, d), 1024, 2048, 1)["tpot_s"] for d in range(1, 6)
    ]
    assert speedups == pytest.approx(PUBLISHED_SPEEDUP, rel=within)
    assert speedups[2] >= max(speedups) * 0.99 and speedups[4] < speedups[2]


def test_sim_run_says_and_stores_how_drafts_were_accepted(tmp_path) -> None:
    from typer.testing import CliRunner

    from bench.cli import app
    from bench.store.read import get_run, list_runs

    db = f"sqlite:///{tmp_path / 'm.db'}"
    args = [
        "sim", "run", "--gpu", "b200", "--model", "deepseek-r1", "--precision", "fp4",
        "--tp", "8", "--engine", "trtllm", "--mtp", "3", "--concurrency", "1",
        "--num-prompts", "4", "--db", db,
    ]  # fmt: skip
    res = CliRunner().invoke(app, args, env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    assert "mean acceptance length 2.82" in res.output and "published curve" in res.output
    assert "with MTP: at least the error of published MTP speed-ups" in " ".join(res.output.split())
    run = get_run(list_runs(db=db)[0].id, db)
    sim = run.extra_json["sim"]
    assert sim["mtp_per_position"] == pytest.approx([0.92, 0.66, 0.24])
    assert sim["mtp_acceptance_length"] == pytest.approx(2.82)
    from bench.curves import run_error_bars  # the stored run states what `sim run` printed

    assert "MTP speed-ups" in run_error_bars(run, db)["basis"]
    bad = CliRunner().invoke(app, [*args[:-2], "--mtp-acceptance-length", "5", "--db", db])
    assert bad.exit_code == 2 and "1 to 4 tokens per sequence" in bad.output
