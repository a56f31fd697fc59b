"""The CLI is the validated simulator (issue 25 item 3): the validation's engine clock builds
its engine exactly as `sim run` / `sim serve` do, and every knob the validation uses is a flag."""

import re

import pytest

from bench.sim.calibration import Sim, load_published
from bench.sim.engine import ServeOptions
from bench.sim.roofline import parse_parallel
from bench.sim.virtual import VirtualExecutor, run_closed_loop


@pytest.mark.parametrize("pid", ["h200-70b-b1", "trt-h100-70b-1k1k", "trt-b200-q235-1k1k"])
def test_validation_figures_are_what_the_cli_engine_gives(pid: str) -> None:
    p = {q.id: q for q in load_published().scored}[pid]
    res = Sim(clock="engine").reproduce(p)
    conc = int(re.search(r" c(\d+)", res.config).group(1))
    # what `tokenbench sim run --gpu G --model M --precision P --parallel X --engine E
    # --max-num-seqs N` builds: N per engine instance (data-parallel rank)
    dp = parse_parallel(p.parallel)[1]
    options = ServeOptions(max_num_seqs=-(-conc // dp))
    cli = VirtualExecutor(
        p.gpu, p.model, p.precision, parallel=p.parallel, engine=p.engine, options=options
    ).build()
    r = run_closed_loop(cli, conc, (p.isl, p.isl), p.osl)
    figure = 1 / r["tpot_s"] if p.kind == "batch1" else r["output_tps"] / cli.dep.gpus
    assert figure == pytest.approx(res.simulated, rel=1e-9)


def test_sim_run_takes_every_engine_knob_and_stores_it(tmp_path) -> None:
    from typer.testing import CliRunner

    from bench.cli import app
    from bench.store.read import get_run, list_runs

    db = f"sqlite:///{tmp_path / 'k.db'}"
    args = [
        "sim", "run", "--gpu", "h100", "--model", "llama-3.3-70b", "--tp", "2",
        "--engine", "trtllm", "--max-num-seqs", "48", "--max-num-batched-tokens", "4096",
        "--kv-precision", "bf16", "--mtp", "2", "--mtp-acceptance", "0.7",
        "--memory-fraction", "0.8", "--num-prompts", "30", "--db", db,
    ]  # fmt: skip
    res = CliRunner().invoke(app, args, env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    run = get_run(list_runs(db=db)[0].id, db)
    sim = run.extra_json["sim"]
    assert (sim["engine"], sim["max_num_seqs"], sim["max_num_batched_tokens"]) == (
        "trtllm",
        48,
        4096,
    )
    assert (sim["kv_precision"], sim["mtp_tokens"], sim["mtp_acceptance"]) == ("bf16", 2, 0.7)
    assert "api_server_count" not in sim  # no front end modelled for TensorRT-LLM
    # the memory fraction reached the engine's arithmetic: less KV than the default 0.9
    default = VirtualExecutor("h100", "llama-3.3-70b", tp=2, engine="trtllm", options=ServeOptions(
        max_num_seqs=48, max_num_batched_tokens=4096, kv_precision="bf16")).build()  # fmt: skip
    assert 0 < sim["kv_capacity_tokens"] < default.capacity_tokens


def test_more_api_servers_lift_a_run_vllms_front_end_paces() -> None:
    """A small model on a fast GPU under vLLM streams its tokens through one front end by
    default (one per data-parallel rank), which caps its output at 1 / t_fe_tok_s; the CLI's
    --api-server-count spreads them, as vLLM's flag does."""
    from bench.sim.virtual import run_closed_loop

    def output_tps(servers: int | None) -> tuple[float, float]:
        options = ServeOptions(max_num_seqs=1024, api_server_count=servers)
        eng = VirtualExecutor("B200", "llama-3.1-8b", "bf16", options=options).build()
        r = run_closed_loop(eng, 1024, (256, 256), 64)
        return r["output_tps"], 1 / eng.dep.eff.t_fe_tok_s

    one, cap = output_tps(None)
    four, _ = output_tps(4)
    stored = VirtualExecutor(
        "B200", "llama-3.1-8b", "bf16", options=ServeOptions(api_server_count=4)
    )
    assert stored.stored_as().sim["api_server_count"] == 4
    assert one <= cap * 1.01  # the front end's pace, whatever the GPU could do
    assert four > cap > one  # beyond what one front end streams
    with pytest.raises(ValueError, match="trtllm's front end is not modelled"):
        VirtualExecutor(
            "B200",
            "llama-3.1-8b",
            "bf16",
            engine="trtllm",
            options=ServeOptions(api_server_count=2),
        ).build()
    with pytest.raises(ValueError, match="api-server-count 0"):
        VirtualExecutor(
            "B200", "llama-3.1-8b", "bf16", options=ServeOptions(api_server_count=0)
        ).build()
