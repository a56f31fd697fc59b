"""The --summary-json contract `run` and `sweep` write for CI jobs."""

from __future__ import annotations

import json
import math
from pathlib import Path

from bench.cli.common import fail


def write_json(path: Path, doc: dict) -> None:
    """Write a JSON document a script will read; a bad path is one line, not a traceback."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(doc, indent=2))
    except OSError as exc:
        raise fail(f"cannot write {path}: {exc.strerror or exc}") from None


def failure_examples(records) -> dict[str, str]:
    """One example message per failure kind: the first one seen, as the server said it."""
    examples: dict[str, str] = {}
    for r in records:
        kind = r.error_kind or (None if r.state == "ok" else r.state)
        if kind and kind not in examples:
            examples[kind] = r.error_message or kind
    return examples


def summary_document(summary, sc, records, run_id: str | None) -> dict:
    """The --summary-json contract: the Summary's keys (unchanged) plus what a CI job needs
    to know what was measured: run id, target, load settings, token totals, the self-check's
    reasons and one example message per failure kind."""
    load = sc.load
    return {
        **summary.to_json(),
        "run_id": run_id,
        "model": sc.target.model,
        "base_url": sc.target.base_url,
        "endpoint": sc.target.endpoint,
        "backend": sc.target.backend,
        "load": {
            "shape": load.shape,
            "request_rate": load.request_rate if math.isfinite(load.request_rate) else "inf",
            "burstiness": load.burstiness,
            "max_concurrency": load.max_concurrency,
            "concurrency": load.concurrency,
            "num_prompts": load.num_prompts,
            "duration_s": load.duration_s,
            "num_warmups": load.num_warmups,
            "ramp_up": load.ramp_up.model_dump() if load.shape == "ramp_up" else None,
        },
        "total_input_tokens": summary.total_input_tokens,
        "total_output_tokens": summary.total_output_tokens,
        "client_limited_reasons": list(summary.client_limited_reasons),
        "failure_examples": failure_examples(records),
    }
