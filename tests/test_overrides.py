"""One function applies overrides to a scenario for the CLI and the API (bench/overrides.py):
a file's values stand unless an override gives that field, and the same override means the
same on both surfaces (a rate switches the load shape; a GPU alias becomes its profile name).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.overrides import Overrides, resolve_scenario
from bench.scenario import DEFAULT_NUM_PROMPTS, load_scenario
from server.api import _overrides
from server.models import JobIn

ROOT = Path(__file__).resolve().parent.parent
BURSTY = ROOT / "scenarios" / "chat-bursty.yaml"


def resolve(overrides: Overrides, kind: str = "run", text: str | None = None, defaults=None):
    text = BURSTY.read_text() if text is None else text
    return resolve_scenario(text, "chat-bursty.yaml", overrides, kind, defaults)[0]


@pytest.mark.parametrize("kind", ["run", "sweep"])
def test_a_files_prompt_count_stands_without_a_flag(kind):
    sc = resolve(Overrides(), kind)
    assert sc.load.num_prompts == load_scenario(BURSTY).load.num_prompts == 300
    assert sc.load.shape == "on_off"


def test_a_flag_overrides_only_its_field():
    sc = resolve(Overrides(num_prompts=20))
    assert sc.load.num_prompts == 20
    assert (sc.load.shape, sc.load.burst.rate, sc.load.quiet.rate) == ("on_off", 16, 1)


def test_defaults_fill_only_what_the_file_leaves_unset():
    assert resolve(Overrides(), text="").load.num_prompts == DEFAULT_NUM_PROMPTS["run"]
    assert resolve(Overrides(), "sweep", text="").load.num_prompts == DEFAULT_NUM_PROMPTS["sweep"]
    timed = "load: {shape: closed, concurrency: 2, duration_s: 30}"
    assert resolve(Overrides(), text=timed).load.num_prompts is None  # bounded by its duration
    # `sim run`'s default rate sits below the file's rate and below a flag
    chat = (ROOT / "scenarios" / "chat.yaml").read_text()
    assert (
        resolve(Overrides(), text=chat, defaults={"load": {"request_rate": 4.5}}).load.request_rate
        == 4
    )
    assert (
        resolve(Overrides(), text="", defaults={"load": {"request_rate": 4.5}}).load.request_rate
        == 4.5
    )
    flagged = resolve(
        Overrides(request_rate=7), text=chat, defaults={"load": {"request_rate": 4.5}}
    )
    assert flagged.load.request_rate == 7


def test_a_rate_switches_the_shape_and_burstiness_makes_it_gamma():
    assert resolve(Overrides(request_rate=5)).load.shape == "poisson"
    assert resolve(Overrides(request_rate=5, burstiness=0.5)).load.shape == "gamma"
    assert resolve(Overrides(concurrency=4)).load.shape == "closed"
    capped = resolve_scenario("", "<flags>", Overrides(request_rate=5, concurrency=4), "run")
    assert (capped[0].load.shape, capped[0].load.max_concurrency) == ("poisson", 4)
    assert "at most 4 requests in flight" in capped[1][0]
    with pytest.raises(ValueError, match="give one of them"):
        resolve(Overrides(request_rate=5, concurrency=4, max_concurrency=8))


def test_the_api_applies_its_fields_as_the_cli_applies_its_flags():
    body = JobIn(scenario_name="chat-bursty", request_rate=6, gpu="h100", num_gpus=2)
    api = resolve(_overrides(body))
    cli = resolve(Overrides(request_rate=6, gpu="h100", num_gpus=2))
    assert api.model_dump() == cli.model_dump()
    assert (api.load.shape, api.load.request_rate, api.load.num_prompts) == ("poisson", 6, 300)
    assert api.gpu.type == "H100-SXM"  # the alias becomes the profile name, as on the CLI


def test_an_unknown_gpu_passes_through_with_a_note():
    sc, notes = resolve_scenario("", "<flags>", Overrides(gpu="TPU-v9"), "run")
    assert sc.gpu.type == "TPU-v9"
    assert notes == ["GPU 'TPU-v9' has no profile; no prices for it"]
