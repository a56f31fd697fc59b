"""The shipped datasets. Readers import bench.workload when called, so listing the
datasets (the CLI's --help) imports no numpy."""

from __future__ import annotations

from pathlib import Path

from bench.datasets import DATASETS, Dataset, Prompt


def _sharegpt(path: Path) -> list[Prompt]:
    from bench.workload import load_sharegpt

    return load_sharegpt(path)


def _jsonl(path: Path) -> list[Prompt]:
    from bench.workload import load_jsonl_prompts

    return load_jsonl_prompts(path)


DATASETS.register(
    "random", "synthetic prompts of workload.input's lengths (vLLM's random)", Dataset()
)
DATASETS.register(
    "sharegpt",
    "ShareGPT JSON: each conversation's first turn, its reply's length as the output length",
    Dataset(_sharegpt),
)
DATASETS.register(
    "jsonl",
    'JSONL prompts: {"prompt"|"text"|"messages": ..., "output_len": optional}',
    Dataset(_jsonl),
)
DATASETS.register(
    "trace",
    "synthetic prompts of the lengths the replayed trace gives (load.shape: trace)",
    Dataset(),
)
