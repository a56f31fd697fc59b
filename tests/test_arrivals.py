"""Arrival processes checked statistically, and workloads checked for determinism."""

from __future__ import annotations

import math

import numpy as np
import pytest

from bench import arrivals
from bench.workload import LengthDist, Workload


def rng(seed=0):
    return np.random.default_rng(seed)


def test_poisson_rate_and_exponential_gaps():
    offs = arrivals.renewal(20.0, 20_000, rng())
    gaps = np.diff(offs)
    assert offs[0] == 0
    assert gaps.mean() == pytest.approx(1 / 20, rel=0.03)
    # Exponential: std equals mean, and P(gap > mean) = e^-1.
    assert gaps.std() == pytest.approx(gaps.mean(), rel=0.05)
    assert (gaps > gaps.mean()).mean() == pytest.approx(math.exp(-1), abs=0.02)
    # Kolmogorov-Smirnov against Exp(20): D well below the 1% critical value 1.63/sqrt(n).
    x = np.sort(gaps)
    cdf = 1 - np.exp(-20 * x)
    d = np.max(np.abs(cdf - np.arange(1, len(x) + 1) / len(x)))
    assert d < 1.63 / math.sqrt(len(x))


def test_gamma_burstiness_keeps_rate_changes_variance():
    for b in (0.25, 4.0):
        gaps = np.diff(arrivals.renewal(10.0, 20_000, rng(1), burstiness=b))
        assert gaps.mean() == pytest.approx(0.1, rel=0.04)
        # Gamma(shape b): coefficient of variation 1/sqrt(b).
        assert gaps.std() / gaps.mean() == pytest.approx(1 / math.sqrt(b), rel=0.08)


def test_constant_and_infinite_rate():
    assert np.allclose(np.diff(arrivals.renewal(4.0, 10, rng(), burstiness=math.inf)), 0.25)
    assert (arrivals.renewal(math.inf, 5, rng()) == 0).all()


def test_on_off_rates_in_each_phase():
    offs = arrivals.on_off(50.0, 2.0, 5.0, 8.0, rng(2), duration_s=1000.0)
    phase = offs % 10.0
    burst, quiet = (phase < 2).sum(), (phase >= 2).sum()
    assert burst / (100 * 2) == pytest.approx(50, rel=0.05)
    assert quiet / (100 * 8) == pytest.approx(5, rel=0.06)
    assert offs.max() < 1000


def test_on_off_by_count_and_steps_and_ramp():
    offs = arrivals.on_off(40.0, 1.0, 0.0, 4.0, rng(3), num_requests=500)
    assert len(offs) == 500 and (np.diff(offs) >= 0).all()
    assert ((offs % 5.0) < 1.0).all()  # nothing in the silent phase
    st = arrivals.steps([(10, 50), (40, 50)], rng(4))
    assert (st < 50).sum() == pytest.approx(500, rel=0.1)
    assert (st >= 50).sum() == pytest.approx(2000, rel=0.06)
    rp = arrivals.ramp(0.0, 100.0, 100.0, rng(5), process="constant")
    # Λ(t) = t^2 / 2: 1250 arrivals by t=50, 5000 in all.
    assert len(rp) == pytest.approx(5000, abs=2)
    assert (rp < 50).sum() == pytest.approx(1250, abs=2)


def test_trace_replay_csv_and_jsonl(tmp_path):
    csv = tmp_path / "azure.csv"
    csv.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 18:15:46.6805900,374,44\n"
        "2023-11-16 18:15:50.9951690,396,109\n"
        "2023-11-16 18:15:47.0000000,100,10\n"
    )
    tr = arrivals.load_trace(csv, time_scale=2.0)
    assert tr.offsets_s.tolist() == pytest.approx([0, 0.15970, 2.15729], abs=1e-4)
    assert tr.input_lens.tolist() == [374, 100, 396]
    jl = tmp_path / "burst.jsonl"
    jl.write_text(
        '{"Timestamp": 5, "Request tokens": 3, "Response tokens": 4}\n{"Timestamp": 7.5}\n'
    )
    with pytest.raises(ValueError, match="row 2: 'Request tokens' missing"):
        arrivals.load_trace(jl)  # second row lacks the lengths the first declared
    jl.write_text('{"Timestamp": 5}\n{"Timestamp": 7.5}\n')
    assert arrivals.load_trace(jl).offsets_s.tolist() == [0, 2.5]
    bad = tmp_path / "bad.csv"
    bad.write_text("when,x\n1,2\n")
    with pytest.raises(ValueError, match="no timestamp column"):
        arrivals.load_trace(bad)


def test_same_seed_same_schedule_and_prompts():
    w1 = Workload(
        seed=7,
        input=LengthDist("lognormal", 300, sigma=0.8),
        output=LengthDist("uniform", 100, range_ratio=0.5),
    )
    w2 = Workload(
        seed=7,
        input=LengthDist("lognormal", 300, sigma=0.8),
        output=LengthDist("uniform", 100, range_ratio=0.5),
    )
    s1, s2 = w1.specs(200), w2.specs(200)
    assert [(a.input_len, a.output_len) for a in s1] == [(b.input_len, b.output_len) for b in s2]
    assert w1.render(s1[17]) == w2.render(s2[17])
    assert w1.render(s1[17]) != w1.render(s1[18])
    outs = np.array([s.output_len for s in s1])
    assert outs.min() >= 50 and outs.max() <= 150
    ins = np.array([s.input_len for s in w1.specs(5000)])
    assert ins.mean() == pytest.approx(300, rel=0.06)
    assert np.array_equal(arrivals.renewal(5, 50, rng(9)), arrivals.renewal(5, 50, rng(9)))


def test_prompt_lengths_prefix_sharing_and_multi_turn():
    w = Workload(seed=1, input=LengthDist(mean=100), prefix_ratio=0.5, num_prefixes=2, turns=3)
    specs = w.specs(6)
    prompts = [w.render(s)[0] for s in specs]
    assert len(prompts[0].split()) == 100
    # Sessions of 3 turns: the third turn carries two earlier user turns and two replies.
    assert [s.turn for s in specs] == [0, 1, 2, 0, 1, 2]
    assert len(w.render(specs[2])[1]) == 5
    # Requests 0 and 2 share prefix group 0: their first 50 words are equal.
    first = w._user_text(0, 100).split()
    third = w._user_text(2, 100).split()
    other = w._user_text(1, 100).split()
    assert first[:50] == third[:50] and first[:50] != other[:50]
    ids, _ = Workload(seed=1, input=LengthDist(mean=64), prompt_format="token_ids").render(
        Workload(seed=1, input=LengthDist(mean=64)).specs(1)[0]
    )
    assert len(ids) == 64 and all(isinstance(i, int) for i in ids)


def test_sharegpt_and_jsonl_datasets(tmp_path):
    import json

    from bench.workload import load_jsonl_prompts, load_sharegpt

    sg = tmp_path / "sg.json"
    sg.write_text(json.dumps([
        {"conversations": [{"from": "human", "value": "hello there"}, {"from": "gpt", "value": "x" * 40}]},
        {"conversations": [{"from": "human", "value": "only one turn"}]},
    ]))  # fmt: skip
    assert load_sharegpt(sg) == [("hello there", 10)]
    jl = tmp_path / "p.jsonl"
    jl.write_text(
        '{"prompt": "a b c", "output_len": 7}\n{"messages": [{"role": "user", "content": "hi"}]}\n'
    )
    data = load_jsonl_prompts(jl)
    w = Workload(seed=1, output=LengthDist(mean=5), dataset=data)
    specs = w.specs(4)
    assert sorted(s.output_len for s in specs[:2]) == [5, 7]
    assert w.render(specs[0])[1][0]["role"] == "user"
    jl.write_text('{"nope": 1}\n')
    with pytest.raises(ValueError, match="line 1: needs a 'prompt'"):
        load_jsonl_prompts(jl)


def test_prompts_are_fresh_per_run_and_per_load_point_unless_the_seed_is_fixed():
    from bench.executor import plan_from_scenario
    from bench.scenario import parse_scenario
    from bench.sweep import PointSpec, scenario_at

    text = "target: {base_url: 'http://x'}\nload: {num_prompts: 3}\nworkload: {input: {mean: 20}}"

    def prompts(sc, load_point=0):
        plan = plan_from_scenario(sc, load_point=load_point)
        return [plan.workload.render(s)[0] for s in plan.specs]

    a, b = parse_scenario(text), parse_scenario(text)
    assert not a.seed_fixed and a.run_seed() != b.run_seed()  # 1 in 2**32 to collide
    assert prompts(a) != prompts(b)  # two runs: fresh prompts
    assert prompts(a) == prompts(a)  # one run's plan is stable (its seed is drawn once)
    # A sweep's points share the run seed (stored once) but draw prompts of their own.
    p0, p1 = scenario_at(a, PointSpec("rate", 1.0)), scenario_at(a, PointSpec("rate", 2.0))
    assert p0.run_seed() == p1.run_seed() == a.run_seed()
    assert prompts(p0, 0) != prompts(p1, 1)
    # --seed fixed: the same prompts every run and at every point, as vLLM does.
    c, d = parse_scenario(text + "\nseed: 7"), parse_scenario(text + "\nseed: 7")
    assert c.seed_fixed and prompts(c) == prompts(d) == prompts(c, 3)
