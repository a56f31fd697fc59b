"""ML.ENERGY's vLLM decode steps at a measured batch [S84] (decode_steps.yaml), as data.

One home for the rows: the check that scores them (bench.sim.decode_steps) and the fit that
uses most of them (bench.sim.calibration.decode_step_points) both read them here.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

import yaml

DECODE_STEPS_YAML: Path = Path(__file__).with_name("decode_steps.yaml")


@dataclass(frozen=True)
class Row:
    """One measured deployment at one batch limit."""

    task: str
    model: str
    gpu: str
    parallel: str
    precision: str
    max_num_seqs: int
    batch: float  # the measured average batch while full
    context: float  # tokens a running sequence's step reads: prompt + length-biased generated
    itl_p50: float  # ms
    itl_p90: float
    itl_p99: float

    @property
    def label(self) -> str:
        return f"{self.task} {self.model} {self.precision} {self.gpu} {self.parallel}"


def load_rows(
    path: Path = DECODE_STEPS_YAML,
    scale_prompts: float = 1.0,
    sources: Collection[str] | None = None,
) -> list[Row]:
    """Every row of the file, its context the task's assumed prompt (x scale_prompts: a
    sensitivity check of the assumption) plus the row's length-biased generated tokens; a file
    citing a source not in `sources` (the published list, where given), or a row of a task the
    file does not describe, is refused with the file and row named."""
    doc = yaml.safe_load(Path(path).read_text())
    if sources is not None and doc["source"] not in sources:
        raise ValueError(f"{path}: cites {doc['source']}, not in the published sources")
    tasks = doc.get("tasks") or {}
    rows = []
    for i, r in enumerate(doc["rows"]):
        if r["task"] not in tasks:
            raise ValueError(f"{path}: rows[{i}]: task {r['task']!r}, not one of {list(tasks)}")
        prompt = tasks[r["task"]]["input_tokens"] * scale_prompts
        fields = {k: r[k] for k in ("task", "model", "gpu", "parallel", "precision")}
        figures = {k: r[k] for k in ("max_num_seqs", "batch", "itl_p50", "itl_p90", "itl_p99")}
        rows.append(Row(**fields, **figures, context=prompt + r["out_biased"]))
    return rows


def fit_rows(path: Path = DECODE_STEPS_YAML, sources: Collection[str] | None = None) -> list[Row]:
    """The rows the efficiency fit uses (the file's `fit`): at most its max_num_seqs, less the
    runs it leaves out (each with its reason)."""
    spec = yaml.safe_load(Path(path).read_text())["fit"]
    left_out = {
        (x["task"], x["gpu"], model) for x in spec.get("left_out") or () for model in x["models"]
    }
    return [
        r
        for r in load_rows(path, sources=sources)
        if r.max_num_seqs <= spec["max_num_seqs"] and (r.task, r.gpu, r.model) not in left_out
    ]
