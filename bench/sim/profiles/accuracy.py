"""How far the simulator's figures are expected to be from hardware, per kind of model.

The one place a simulated capacity's range reads the simulator's error from. The figures
are the leave-one-source-out mean absolute errors of throughput per GPU over the published
points (README, "Simulator validation"; pinned by tests/test_sim_calibration.py): each
source's points predicted by a fit that never saw that source, so they say how far a point
the simulator was not tuned on is off, which is the situation of every user's run.
"""

from __future__ import annotations

# Held-out (leave-one-source-out) mean absolute error, by the category the validation table
# reports: dense Llama models, mixture-of-experts models, AMD GPUs, and all points.
HELD_OUT_ERROR = {"dense": 0.140, "moe": 0.257, "amd": 0.435, "all": 0.227}
BASIS = "held-out (leave-one-source-out) mean error for {what}"


def expected_error(gpu: str | None, model: str | None) -> tuple[float, str]:
    """(relative error, where it comes from in words) for a simulated run of `model` on
    `gpu`; the all-points figure when the model or GPU is not in the simulator's profiles."""
    from bench.sim.profiles import get_gpu, get_model

    try:
        vendor = get_gpu(gpu).vendor.lower() if gpu else None
        arch = get_model(model).arch if model else None
    except (KeyError, ValueError):
        vendor = arch = None
    if vendor == "amd":
        key, what = "amd", "AMD GPUs"
    elif arch == "moe":
        key, what = "moe", "mixture-of-experts models"
    elif arch == "dense":
        key, what = "dense", "dense models"
    else:
        key, what = "all", "all published points"
    return HELD_OUT_ERROR[key], BASIS.format(what=what)
