"""Scenario files: every shipped one validates; bad ones get errors naming line and field."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.executor import plan_from_scenario
from bench.scenario import ScenarioError, load_scenario, parse_scenario

SCENARIOS = sorted((Path(__file__).parent.parent / "scenarios").glob("*.yaml"))


def test_required_scenarios_are_shipped():
    names = {p.stem for p in SCENARIOS}
    assert {
        "chat",
        "chat-bursty",
        "rag-8k",
        "reasoning",
        "1k-1k",
        "1k-8k",
        "8k-1k",
        "trace-replay",
    } <= names


@pytest.mark.parametrize("path", SCENARIOS, ids=lambda p: p.stem)
def test_shipped_scenario_builds_a_plan(path):
    text = path.read_text()
    assert text.lstrip().startswith("#"), "each scenario says in a comment what it models"
    sc = load_scenario(path)
    sc.target.base_url = "http://127.0.0.1:1"
    plan = plan_from_scenario(sc, base_dir=path.parent)
    assert len(plan.specs) > 0
    assert plan.offsets_s is not None and len(plan.offsets_s) == len(plan.specs)


def test_trace_scenario_uses_recorded_lengths():
    path = next(p for p in SCENARIOS if p.stem == "trace-replay")
    sc = load_scenario(path)
    sc.target.base_url = "http://127.0.0.1:1"
    plan = plan_from_scenario(sc, base_dir=path.parent)
    assert len(plan.specs) == 120
    assert plan.specs[0].input_len == 505 and plan.specs[0].output_len == 24
    assert plan.offsets_s[0] == 0 and plan.offsets_s[-1] > 10


def test_error_names_file_line_field_and_value(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nload:\n  shape: poisson\n  request_rate: -2\n")
    with pytest.raises(ScenarioError) as err:
        load_scenario(bad)
    msg = str(err.value)
    assert f"{bad} line 4: load.request_rate" in msg and "-2" in msg


def test_unknown_field_and_missing_shape_fields():
    with pytest.raises(ScenarioError, match=r"line 3: workload.inptu: unknown field") as err:
        parse_scenario("name: x\nworkload:\n  inptu: {mean: 3}\n")
    # the nearest field, and the fields there are, instead of pointing at docs
    assert "did you mean 'input'?" in str(err.value) and "docs" not in str(err.value)
    assert "fields of workload: dataset, dataset_path, input, output" in str(err.value)
    with pytest.raises(ScenarioError, match=r"load.steps.0.duraton_s: unknown field; did you mea"):
        parse_scenario("load:\n  shape: steps\n  steps:\n  - {rate: 1, duraton_s: 3}\n")
    with pytest.raises(ScenarioError, match="shape 'on_off' needs burst, quiet"):
        parse_scenario("load:\n  shape: on_off\n")
    with pytest.raises(ScenarioError, match="not valid YAML"):
        parse_scenario("load: [\n")


def test_flags_override_file_values():
    sc = parse_scenario(
        "load:\n  request_rate: 3\n  num_prompts: 10\n", overrides={"load": {"num_prompts": 4}}
    )
    assert sc.load.request_rate == 3 and sc.load.num_prompts == 4
