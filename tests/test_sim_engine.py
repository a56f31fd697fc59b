"""Engine behaviour: batching limits, chunked prefill, KV accounting, preemption, MoE bytes."""

from dataclasses import replace

import numpy as np
import pytest

from bench.sim.calibration import max_concurrency
from bench.sim.engine import Engine, EngineConfig
from bench.sim.profiles import get_gpu
from bench.sim.roofline import GEMM_TILE_ROWS, Deployment
from bench.sim.virtual import build_engine, replay_closed, run_virtual, simulate


def _drain(engine: Engine, max_steps: int = 100_000) -> list:
    steps = []
    for _ in range(max_steps):
        res = engine.step()
        if res is None:
            return steps
        steps.append(res)
    raise AssertionError("engine did not drain")


def test_fp4_on_h100_is_clear_error() -> None:
    with pytest.raises(ValueError, match=r"H100-SXM.*FP4.*bf16, fp8"):
        Deployment.build("h100", "llama-3.3-70b", "fp4")


def test_model_too_big_is_clear_error() -> None:
    dep = Deployment.build("h100", "llama-3.3-70b", "bf16")
    with pytest.raises(ValueError, match="does not fit"):
        Engine(dep)


def test_chunked_prefill_respects_token_budget() -> None:
    e = build_engine("b200", "llama-3.1-8b", "fp8", max_num_batched_tokens=512, max_num_seqs=8)
    for i in range(20):
        e.add_request(i, 1500, 20)
    steps = _drain(e)
    assert all(s.n_decode + s.n_prefill <= 512 for s in steps)
    assert all(s.n_decode <= 8 for s in steps)
    assert max(s.n_prefill for s in steps) == 512  # prompts were split into chunks
    assert e.prompt_tokens_total == 20 * 1500
    assert e.generation_tokens_total == 20 * 20
    assert e.free_blocks == e.total_blocks  # every block came back


def test_max_num_seqs_bounds_running() -> None:
    e = build_engine("b200", "llama-3.1-8b", "fp8", max_num_seqs=4)
    for i in range(10):
        e.add_request(i, 100, 50)
    for _ in range(5):
        e.step()
        assert e.num_running <= 4
    assert e.num_waiting == 6


def test_preemption_when_kv_full() -> None:
    # 70B FP8 on one H100 (81,559 MiB as the device reports it) leaves vLLM ~10.6k tokens of
    # KV after weights (72.65 GB), activations and non-torch memory: 20 long requests cannot
    # all fit
    e = build_engine("h100", "llama-3.3-70b", "fp8")
    assert 10_000 < e.capacity_tokens < 11_000
    for i in range(20):
        e.add_request(i, 600, 1500)
    steps = _drain(e)
    assert e.num_preemptions > 0
    assert any(s.preempted for s in steps)
    preempted = {q.id for s in steps for q in s.preempted}
    assert 0 not in preempted  # the oldest request is never the victim while others run
    assert e.generation_tokens_total == 20 * 1500
    assert e.free_blocks == e.total_blocks
    assert min(s_.n_decode for s_ in steps if s_.n_decode) >= 1


def test_preempted_request_keeps_its_tokens() -> None:
    reqs = [(0.0, 600, 1500)] * 20
    recs = simulate(reqs, "h100", "llama-3.3-70b")
    for r in recs:
        assert r.output_tokens == 1500
        assert np.all(np.diff(r.chunk_times_ns) > 0)
    # a preempted request shows a long gap (its recompute) somewhere in its ITLs
    assert max(r.itl_ns().max() for r in recs) > 5 * np.median(recs[0].itl_ns())


def test_sliding_window_layers_hold_their_window_per_sequence() -> None:
    # gpt-oss-120b: 18 of 36 layers attend a 128-token window with the same KV heads as the
    # full layers, so a running sequence holds min(128, its tokens) tokens more than its context
    dep = Deployment.build("b200", "gpt-oss-120b", "mxfp4-a8")
    assert dep.window_kv_tokens(2000) == 128 and dep.window_kv_tokens(50) == 50
    assert Deployment.build("b200", "llama-3.1-8b", "fp8").window_kv_tokens(2000) == 0
    e = Engine(dep, EngineConfig.default("vllm"))
    free = e.free_blocks
    e.add_request(0, 1000, 200)
    e.step()
    bs = e.cfg.block_size
    assert free - e.free_blocks == -(-1000 // bs) + -(-128 // bs)
    _drain(e)
    assert e.free_blocks == e.total_blocks  # context and window blocks both came back
    # the formula's batch counts the window too
    plain = dep.kv_capacity_tokens() / (1000 + 500)
    assert max_concurrency(dep, 1000, 1000) == pytest.approx(dep.kv_capacity_tokens() / 1628)
    assert max_concurrency(dep, 1000, 1000) < plain


def test_request_larger_than_cache_is_rejected() -> None:
    recs = simulate([(0.0, 30000, 2000)], "h100", "llama-3.3-70b")
    assert recs[0].state == "failed" and recs[0].http_status == 400


def test_decode_step_grows_with_batch_and_context() -> None:
    dep = Deployment.build("b200", "llama-3.3-70b", "fp8")
    t1 = dep.step_time(1, 1000, 0, 0)
    assert dep.step_time(64, 64 * 1000, 0, 0) > t1
    assert dep.step_time(1, 100_000, 0, 0) > t1
    # past the ridge point the step is compute-bound: doubling a big batch nearly doubles it
    big, bigger = dep.step_time(2048, 0, 0, 0), dep.step_time(4096, 0, 0, 0)
    assert bigger / big > 1.8


def test_moe_reads_only_touched_experts() -> None:
    dep = Deployment.build("b200", "gpt-oss-120b", "fp4")
    m = dep.model
    kept = m.kept_precision(dep.precision.name).bytes_per_param  # BF16 in the checkpoint
    row = m.hidden * kept  # one gathered embedding row
    table = m.head_params() * kept  # the embedding table (untied)
    one = dep.weight_bytes_read(1)
    full = dep.weight_bytes_read(10_000)
    assert full == pytest.approx(dep.weight_bytes - table + 10_000 * row)
    non_expert = dep.weight_bytes - m.experts * dep.expert_bytes - table
    assert one == pytest.approx(non_expert + m.experts_per_token * dep.expert_bytes + row)
    # random top-4 routing of 8 tokens touches 128 (1 - (1 - 4/128)^8) = 28.7 experts on
    # average, not 32: some tokens share experts
    assert dep.weight_bytes_read(8) == pytest.approx(
        non_expert + 28.71 * dep.expert_bytes + 8 * row, rel=1e-3
    )
    assert dep.experts_touched(32) < 128 * 0.7  # 32 x top-4 = 128 picks still miss ~1/3
    assert dep.experts_touched(1000) == pytest.approx(128)
    # batch-1 decode of a sparse model is far faster than its total size suggests
    assert dep.step_time(1, 1000, 0, 0) < 0.5 * dep.weight_bytes / (dep.gpu.hbm_bw_bytes_s * 0.8)


def test_tp_divides_and_adds_allreduce() -> None:
    one = Deployment.build("h100", "llama-3.3-70b", "fp8", tp=1)
    two = Deployment.build("h100", "llama-3.3-70b", "fp8", tp=2)
    t1, t2 = one.step_time(1, 1000, 0, 0), two.step_time(1, 1000, 0, 0)
    assert t2 < t1
    assert t2 > (t1 - one.eff.t_fix_s) / 2 + one.eff.t_fix_s  # all-reduce is not free


def test_deterministic() -> None:
    rng = np.random.default_rng(3)
    n = 200
    reqs = np.column_stack(
        [np.cumsum(rng.exponential(0.02, n)), rng.integers(50, 2000, n), rng.integers(1, 400, n)]
    )
    a = simulate(reqs, "h200", "llama-3.3-70b")
    b = simulate(reqs, "h200", "llama-3.3-70b")
    assert all(
        np.array_equal(x.chunk_times_ns, y.chunk_times_ns) for x, y in zip(a, b, strict=True)
    )


def test_an_engine_replays_a_second_trace_as_a_fresh_one_would() -> None:
    # it raised IndexError: the second trace's steps were numbered on from the first's
    lengths = np.tile([512, 64], (20, 1))
    engine = build_engine("H100-SXM", "llama-3.1-8b", "fp8")
    first = replay_closed(engine, lengths, 4)
    again = replay_closed(engine, lengths, 4)
    fresh = replay_closed(build_engine("H100-SXM", "llama-3.1-8b", "fp8"), lengths, 4)
    for x, y in zip(again, fresh, strict=True):
        assert x.ok and (x.sent_ns, x.first_token_ns, x.end_ns) == (
            y.sent_ns,
            y.first_token_ns,
            y.end_ns,
        )
        assert np.array_equal(x.chunk_times_ns, y.chunk_times_ns)
    assert [r.end_ns for r in first] == [r.end_ns for r in fresh]
    # one still holding an earlier trace's requests is refused, naming what to do
    busy = build_engine("H100-SXM", "llama-3.1-8b", "fp8")
    busy.add_request(0, 512, 64)
    with pytest.raises(ValueError, match="fresh engine"):
        replay_closed(busy, lengths, 4)


def test_virtual_records_shape() -> None:
    recs = simulate([(0.0, 100, 5), (0.25, 200, 1)], "b200", "llama-3.1-8b", "bf16")
    r0, r1 = recs
    assert r0.output_tokens == 5 and len(r0.chunk_times_ns) == 5
    assert r0.chunk_times_ns.dtype == np.int64
    assert r0.token_count_source == "tokenizer" and r0.tpot_ns is not None
    assert r1.sent_ns == 250_000_000 and r1.first_token_ns > r1.sent_ns and r1.tpot_ns is None


@pytest.mark.slow
def test_virtual_hour_speed() -> None:
    # an hour of 50 req/s (1k in / 256 out) is the target; here 10 minutes must take < 10 s
    import time

    rng = np.random.default_rng(0)
    n = 30_000
    off = np.cumsum(rng.exponential(1 / 50, n))
    reqs = np.column_stack([off, np.full(n, 1000), np.full(n, 256)])
    eng = build_engine("h100", "llama-3.3-70b", "fp8", tp=8)
    t0 = time.perf_counter()
    recs = run_virtual(eng, reqs)
    assert time.perf_counter() - t0 < 10
    assert len(recs) == n and all(r.output_tokens == 256 for r in recs)


GPUS = ("b200", "mi300x", "h100", "h200", "l40s")


def test_engine_config_defaults_from_profiles() -> None:
    """vLLM picks its batch limits by device, as `vllm serve` does: 1,024 sequences and 8,192
    tokens a step on a GPU reporting 70 GiB or more, except an A100 (vllm-project/vllm#17885);
    128 and 2,048 on a CPU; 256 and 2,048 elsewhere. SGLang sizes its chunked prefill by the
    device's memory (16,384 tokens from 160 GiB, 8,192 from 60, 4,096 from 35, else 2,048);
    TensorRT-LLM's do not depend on the device."""
    limits = {
        name: EngineConfig.default("vllm", get_gpu(name)) for name in ("h100", "b200", "mi300x")
    }
    for name, cfg in limits.items():
        limit = (cfg.max_num_seqs, cfg.max_num_batched_tokens, cfg.block_size)
        assert limit == (1024, 8192, 16), name
    for name in ("a100", "l40s"):  # an 80 GB A100 by name, a 48 GB L40S by its memory
        cfg = EngineConfig.default("vllm", get_gpu(name))
        assert (cfg.max_num_seqs, cfg.max_num_batched_tokens) == (256, 2048), name
    assert (EngineConfig.default().max_num_seqs, EngineConfig.default().max_num_batched_tokens) == (
        256,
        2048,
    )  # no device: the base values
    # vLLM's CPU platform: 128 sequences and 2,048 tokens (its world size 1), whatever the RAM
    host = get_gpu("h100").model_copy(update={"name": "host", "vendor": "cpu"})
    cfg = EngineConfig.default("vllm", host)
    assert (cfg.max_num_seqs, cfg.max_num_batched_tokens) == (128, 2048)
    chunks = {g: EngineConfig.default("sglang", get_gpu(g)).max_num_batched_tokens for g in GPUS}
    assert chunks == {"b200": 16384, "mi300x": 16384, "h100": 8192, "h200": 8192, "l40s": 4096}
    assert {EngineConfig.default("sglang", get_gpu(g)).max_num_seqs for g in GPUS} == {256}
    small = get_gpu("l40s").model_copy(update={"memory_mib": 22_700.0})  # an L4-sized card
    assert EngineConfig.default("sglang", small).max_num_batched_tokens == 2048
    on_h100, on_l40s = (EngineConfig.default("trtllm", get_gpu(g)) for g in ("h100", "l40s"))
    assert on_h100 == on_l40s
    # the engines built for a deployment take them, and a flag still wins
    assert build_engine("h100", "llama-3.1-8b", "bf16").cfg.max_num_seqs == 1024
    assert build_engine("a100", "llama-3.1-8b", "bf16").cfg.max_num_batched_tokens == 2048
    assert build_engine("h100", "llama-3.1-8b", "bf16", max_num_seqs=64).cfg.max_num_seqs == 64


def test_thousand_requests_run_in_virtual_time() -> None:
    # issue 19's 1,000-request run: every request served, far more simulated time than the
    # run could take in real time. How much faster than real time it runs is a wall-clock
    # figure: `python benchmarks/simulator.py` prints it (no timing asserts in tests).
    rng = np.random.default_rng(1)
    off = np.cumsum(rng.exponential(1 / 8, 1000))
    reqs = np.column_stack([off, np.full(1000, 1024), np.full(1000, 256)])
    eng = build_engine("b200", "llama-3.3-70b", "fp8")
    recs = run_virtual(eng, reqs)
    simulated = max(r.end_ns for r in recs) / 1e9
    assert len(recs) == 1000 and all(r.ok and r.output_tokens == 256 for r in recs)
    assert simulated > 100


def test_embedding_is_gathered_and_the_head_runs_on_logit_rows_only() -> None:
    """Engines gather embedding rows (no GEMM) and run the LM head only on the tokens that
    produce logits: decode tokens and the last token of each prompt completing its prefill."""
    dep = Deployment.build("h100", "llama-3.1-8b", "bf16")
    m, peak = dep.model, dep.peak_flops
    # a compute-bound prefill of 8,192 tokens of one prompt: the head's 2 x vocab x hidden
    # FLOPs count once (its last token), the embedding table's never
    one = dep.step_time(0, 0, 8192, 0, prefill_seqs=1)
    many = dep.step_time(0, 0, 8192, 0, prefill_seqs=64)  # 64 prompts of 128 tokens
    # a GEMM of n rows runs at mfu n / (n + gemm_half_rows x min(1, n / GEMM_TILE_ROWS)):
    # from a tile up n rows cost (n + half) / mfu, below it n (1 + half / tile) / mfu
    e = dep.eff
    half, tile = e.gemm_half_rows, GEMM_TILE_ROWS
    assert half > 0 and tile == 64
    head_flops = 2 * m.head_params() * ((64 + half) - (1 + half / tile)) / (peak * e.mfu)
    assert many - one == pytest.approx(head_flops, rel=1e-6)
    body = m.params_b * 1e9 - m.embedding_params()
    gemms = 2 * (body * (8192 + half) + m.head_params() * (1 + half / tile)) / (peak * e.mfu)
    overhead = e.t_fix_s + m.layers * e.t_layer_s + 8192 * e.t_tok_s
    assert one == pytest.approx(gemms + overhead)  # no attention: prefill_ctx is 0
    # a chunk that completes no prompt computes no logits: the head's weights are not read
    bw = dep.gpu.hbm_bw_bytes_s * dep.eff.mbu
    small = dep.step_time(0, 0, 1, 0, prefill_seqs=0)
    with_head = dep.step_time(0, 0, 1, 0, prefill_seqs=1)
    assert with_head - small == pytest.approx(m.head_params() * 2 / bw, rel=1e-3)


def test_tied_embeddings_are_one_matrix() -> None:
    """A tied model stores and reads one vocab x hidden matrix (config.json
    tie_word_embeddings); the step still runs the head on its logit rows."""
    untied = Deployment.build("h100", "llama-3.1-8b", "bf16")
    params = untied.model.params_b - untied.model.head_params() / 1e9
    fields = {"tie_word_embeddings": True, "params_b": params, "active_params_b": params}
    tied = replace(untied, model=untied.model.model_copy(update=fields))
    assert tied.model.embedding_params() == untied.model.head_params()
    # same body, same head: same step, with one matrix less in memory
    assert tied.step_time(8, 8000, 0, 0) == pytest.approx(untied.step_time(8, 8000, 0, 0))
    assert untied.weight_bytes - tied.weight_bytes == pytest.approx(
        untied.model.head_params() * 2, rel=1e-3
    )


def test_a_gemms_efficiency_rises_with_its_token_rows() -> None:
    """One GEMM over every token of a step at mfu x n / (n + gemm_half_rows): half the ceiling
    at gemm_half_rows rows, nearly all of it at a prefill chunk's thousands; so a compute-bound
    step of twice the tokens takes less than twice as long."""
    dep = Deployment.build("h100", "llama-3.1-8b", "bf16")
    e = dep.eff
    assert e.gemm_half_rows > 0
    assert dep._gemm_mfu(e.gemm_half_rows) == pytest.approx(e.mfu / 2)
    assert dep._gemm_mfu(8192) == pytest.approx(e.mfu * 8192 / (8192 + e.gemm_half_rows))
    assert dep._gemm_mfu(8192) > 0.95 * e.mfu  # a prefill chunk's rows reach the ceiling
    # prefill of 4,096 and of 8,192 tokens (compute-bound, no attention): per token, the larger
    # GEMM is the cheaper
    small = dep.step_time(0, 0, 4096, 0, prefill_seqs=0)
    large = dep.step_time(0, 0, 8192, 0, prefill_seqs=0)
    assert large < 2 * small
    # routed experts: a MoE step's experts run at the rows routed to each, far fewer than the
    # step's tokens, so their GEMMs sit lower on the ramp than the dense ones of the same step
    moe = Deployment.build("b200", "deepseek-r1", "fp8", 8, engine="sglang", mtp=False)
    n = 64
    rows = n * moe.model.experts_per_token / moe.experts_touched(n)
    assert rows < n / 4 and moe._expert_mfu(rows) < moe._gemm_mfu(n) / 2


def test_a_gemm_of_fewer_rows_than_a_tile_is_bound_by_its_weight_reads() -> None:
    """Below one tile of rows a dense GEMM keeps one full tile's efficiency, so its compute
    shrinks with its rows. The ramp alone charged a one-row GEMM ~200 rows of compute: on an
    A100 (312 TFLOPS against 2 TB/s) batch-1 decode of an 8B came out compute-bound, 14.5 ms
    a token where its 16 GB of weight reads take 9 ms."""
    dep = Deployment.build("a100", "llama-3.1-8b", "bf16")
    e, m = dep.eff, dep.model
    assert dep._gemm_mfu(1) == pytest.approx(dep._gemm_mfu(GEMM_TILE_ROWS))
    assert dep._gemm_mfu(GEMM_TILE_ROWS) == pytest.approx(
        e.mfu * GEMM_TILE_ROWS / (GEMM_TILE_ROWS + e.gemm_half_rows)
    )
    bw = dep.gpu.hbm_bw_bytes_s * e.mbu
    reads = dep.weight_bytes_read(1) / bw
    kv = 1000 * dep.kv_bytes_per_token / (bw * e.kv_bw_ratio)
    overhead = e.t_fix_s + m.layers * e.t_layer_s + e.t_tok_s
    assert dep.step_time(1, 1000, 0, 0) == pytest.approx(reads + kv + overhead, rel=1e-6)
    # without the floor the same step's GEMMs would have been compute-bound
    ramp_only = 2 * m.active_params_b * 1e9 * (1 + e.gemm_half_rows) / (dep.peak_flops * e.mfu)
    assert ramp_only > 1.2 * reads


def test_a_prompt_the_scheduler_could_never_admit_is_refused_not_waited_on() -> None:
    """Admission keeps the watermark free even for a request alone: a prompt whose first chunk
    fits the KV cache but not beside the watermark used to wait for ever, and a saturated `sim
    tune` run spun 50 million empty steps (about five minutes) before failing. It is refused
    now, as vLLM refuses it, and the requests after it run."""
    from bench.sim.engine import engine_for

    dep = Deployment.build("H100", "llama-3.3-70b", "fp8")
    eng = engine_for(dep, max_num_seqs=256, max_num_batched_tokens=16384)  # 4,000 tokens of KV
    bs = eng.cfg.block_size
    assert eng.watermark_blocks >= 1
    prompt = eng.total_blocks * bs - 20  # fits the cache whole, not beside the watermark
    eng.check(prompt - eng.watermark_blocks * bs, 10)  # one that leaves the watermark is fine
    recs = run_virtual(eng, [(0.0, prompt, 10), (1.0, 100, 10)], max_steps=100_000)
    assert recs[0].state == "failed" and "cannot be admitted" in recs[0].error_message
    assert "--max-num-batched-tokens" in recs[0].error_message
    assert recs[1].state == "ok" and recs[1].output_tokens == 10


def test_a_run_whose_engine_runs_nothing_is_called_stuck_at_once() -> None:
    """Steps that run nothing cannot move the clock: a virtual run says so after IDLE_STEPS of
    them instead of spinning to its step limit."""
    from types import SimpleNamespace

    from bench.sim import virtual
    from bench.sim.engine import StepResult

    class Stuck:  # holds the request it was given and never runs it
        dep = Deployment.build("H100", "llama-3.1-8b", "bf16")
        step_index, held = 0, None

        def has_work(self) -> bool:
            return self.held is not None

        def add_request(self, rid, prompt_len, max_tokens, tag=None, **kwargs):
            self.held = SimpleNamespace(tag=tag)
            return self.held

        def step(self) -> StepResult:
            self.step_index += 1
            return StepResult(index=self.step_index, duration_s=0.0, n_decode=0, n_prefill=0)

    eng = Stuck()
    with pytest.raises(RuntimeError, match="ran nothing for 10,000 steps"):
        virtual.run_virtual(eng, [(0.0, 100, 10)], max_steps=10_000_000)
    assert eng.step_index == virtual.IDLE_STEPS + 1


def test_the_memory_an_engine_describes_is_the_one_its_kv_cache_was_sized_by() -> None:
    """`sim serve` prints the engine's memory plan: with a user's limits (SGLang's chunked
    prefill sizes its reserve, vLLM's sequences its sampler's logits) it must be the plan the
    KV cache came from, per data-parallel rank, not the defaults'."""
    for engine, kwargs in (
        ("sglang", {"max_num_batched_tokens": 32768}),
        ("vllm", {"max_num_seqs": 2048}),
        ("sglang", {"parallel": "dep8", "max_num_batched_tokens": 24576}),  # per instance
    ):
        model = "deepseek-r1" if "parallel" in kwargs else "llama-3.3-70b"
        eng = build_engine("b200", model, "fp8", engine=engine, **kwargs)
        default = build_engine("b200", model, "fp8", engine=engine, parallel=kwargs.get("parallel"))
        plan = eng.memory_plan()
        assert plan.kv < default.memory_plan().kv, (engine, kwargs)  # a larger limit costs memory
        dep = eng.dep
        tokens = int(dep.dp * plan.kv * dep.kv_shards // dep.kv_pool_bytes_per_token)
        assert eng.capacity_tokens == tokens, (engine, kwargs)
