"""Is an endpoint a tokenbench simulator? Runs against one are stored as simulated.

`tokenbench sim serve` announces itself in /v1/models (owned_by "tokenbench-simulated", and a
`tokenbench_simulated` entry naming the GPU, GPU count, precision and parallelism). A run
stored against it must not read as a measurement, nor be priced as the GPU the user typed.
"""

from __future__ import annotations

import json

import httpx

from bench.backends.bounds import bounded_get, bounded_request
from bench.backends.openai import MODELS_PATH, server_url

SIMULATED_OWNER = "tokenbench-simulated"
# where a simulator answers the request rate its deployment saturates at for a workload
SATURATION_PATH = "/v1/tokenbench/saturation"


def detect_simulated(
    base_url: str, api_key: str | None = None, timeout_s: float = 2.0
) -> dict | None:
    """The simulated hardware ({gpu, gpu_count, ...}) when base_url is a tokenbench simulator,
    else None (a real server, or one that does not answer /v1/models in time)."""
    url, headers = server_url(base_url, MODELS_PATH, api_key)
    try:
        status, body = bounded_get(url, headers=headers, timeout_s=timeout_s)
        models = json.loads(body).get("data") or [] if status == 200 else []
    except (httpx.HTTPError, ValueError, AttributeError, TimeoutError):
        return None
    for m in models:
        if isinstance(m, dict) and m.get("owned_by") == SIMULATED_OWNER:
            return dict(m.get("tokenbench_simulated") or {})
    return None


def simulated_saturation(
    base_url: str, input_len: float, output_len: float, api_key: str | None = None,
    timeout_s: float = 60.0,
) -> float | None:  # fmt: skip
    """The request rate a tokenbench simulator's deployment saturates at for these mean
    lengths (what `sim run` keeps with its runs), or None when it cannot say (an older
    simulator, a disaggregated one, no answer in time)."""
    url, headers = server_url(base_url, SATURATION_PATH, api_key)
    body = {"input_len": input_len, "output_len": output_len}
    try:
        status, raw = bounded_request(
            "POST", url, timeout_s=timeout_s, headers=headers, json_body=body
        )
        value = json.loads(raw).get("saturation_requests_per_s") if status == 200 else None
    except (httpx.HTTPError, ValueError, AttributeError, TimeoutError):
        return None
    return float(value) if isinstance(value, (int, float)) and value > 0 else None
