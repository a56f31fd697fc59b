"""What tokenbench sends, flag for flag, as `vllm bench serve` sends it (issue 23).

vLLM's bench (vllm/benchmarks/serve.py, lib/endpoint_request_func.py) sends no temperature
unless --temperature is given ("the default will be determined on the server side"), sends
ignore_eos for synthetic (random) prompts only, puts --temperature/--top-p/--top-k/--min-p
and --extra-body (which wins) into every body, and --header KEY=VALUE into every request.
"""

from __future__ import annotations

import json

import pytest

from bench.backends.dialects import get_dialect
from bench.backends.openai import CHAT, COMPLETIONS, MODELS_PATH, build_body, server_url
from bench.backends.transport import RawTransport
from bench.cli.common import flag_overrides
from bench.executor import plan_from_scenario
from bench.overrides import resolve_scenario


def plan_for(**flags):
    vllm = {k: flags.pop(k) for k in list(flags) if k in VLLM_FLAGS}
    overrides = flag_overrides(base_url=flags.pop("base_url", "http://127.0.0.1:9"), vllm=vllm,
                               **flags)  # fmt: skip
    sc, _ = resolve_scenario("", "<flags>", overrides, "run")
    return sc, plan_from_scenario(sc)


VLLM_FLAGS = ("temperature", "top_p", "top_k", "min_p", "extra_body", "header", "host", "port")


def body_of(plan) -> dict:
    return json.loads(
        build_body(
            dialect=plan.dialect,
            endpoint=plan.endpoint,
            model="m",
            prompt="hi",
            max_tokens=8,
            ignore_eos=plan.ignore_eos,
            extra=plan.extra_body,
        )  # fmt: skip
    )


def test_by_default_no_sampling_setting_is_sent_and_random_prompts_force_the_length():
    _, plan = plan_for()
    body = body_of(plan)
    assert "temperature" not in body and "min_tokens" not in body
    assert body["ignore_eos"] is True and body["max_tokens"] == 8


def test_dataset_prompts_end_where_the_model_ends_them(tmp_path):
    data = tmp_path / "sharegpt.json"
    data.write_text(json.dumps([{"conversations": [{"from": "human", "value": "hello"},
                                                   {"from": "gpt", "value": "hi there"}]}]))  # fmt: skip
    _, plan = plan_for(dataset_name="sharegpt", dataset_path=str(data), num_prompts=1)
    assert "ignore_eos" not in body_of(plan)
    _, forced = plan_for(dataset_name="sharegpt", dataset_path=str(data), num_prompts=1,
                         ignore_eos=True)  # fmt: skip
    assert body_of(forced)["ignore_eos"] is True  # --ignore-eos, as vLLM's


def test_sampling_flags_and_extra_body_go_into_every_body():
    _, plan = plan_for(temperature=0.0, top_p=0.9, top_k=5, min_p=0.1,
                       extra_body='{"top_k": 7, "seed": 3}')  # fmt: skip
    body = body_of(plan)
    assert (body["temperature"], body["top_p"], body["min_p"]) == (0.0, 0.9, 0.1)
    assert (body["top_k"], body["seed"]) == (7, 3)  # --extra-body wins, as in vLLM


def test_headers_go_with_every_request():
    _, plan = plan_for(header=["X-Team=infra", "X-Trace = on"])
    assert plan.headers == {"X-Team": "infra", "X-Trace": "on"}
    head = RawTransport(plan.base_url, headers=plan.headers).prepare(COMPLETIONS, b"{}")
    assert b"\r\nX-Team: infra\r\nX-Trace: on\r\n" in head
    with pytest.raises(ValueError, match="one-line value"):
        plan_for(header=["X-Bad=a\r\nInjected: 1"])


def test_the_key_goes_with_every_request_and_a_base_url_may_end_in_v1():
    head = RawTransport("http://127.0.0.1:9", api_key="sk-abc").prepare(COMPLETIONS, b"{}")
    assert b"\r\nAuthorization: Bearer sk-abc\r\n" in head
    assert b"Authorization" not in RawTransport("http://127.0.0.1:9").prepare(COMPLETIONS, b"{}")
    # /v1/models on the same server whether the base URL has its /v1 (OpenAI's) or not (vLLM's)
    for base in ("http://h:1", "http://h:1/", "http://h:1/v1", "http://h:1/v1/"):
        assert server_url(base, MODELS_PATH, "k") == (
            "http://h:1/v1/models",
            {"Authorization": "Bearer k"},
        )
    assert server_url("http://h:1", MODELS_PATH) == ("http://h:1/v1/models", {})


def test_host_port_and_openai_chat_mean_what_they_mean_in_vllm():
    sc, plan = plan_for(base_url=None, host="10.0.0.5", port=8001, backend="openai-chat")
    assert plan.base_url == "http://10.0.0.5:8001"
    assert (plan.endpoint, plan.dialect) == (CHAT, get_dialect("vllm"))
    sc, _ = plan_for(base_url=None, port=8002)
    assert sc.target.base_url == "http://127.0.0.1:8002"
    sc, _ = plan_for(base_url="http://h:1", host="other")  # --base-url wins, as in vLLM
    assert sc.target.base_url == "http://h:1"
