"""Block-exact replay of Mooncake-format traces (issue 29 items 1 and 2).

Prompts are checked with a real tokenizer trained here (tests/test_tokenizer.py's: a small
byte-level BPE whose words are several tokens each, so exactness is not free).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from bench.executor import plan_from_scenario
from bench.scenario import ScenarioError, parse_scenario
from bench.tokenizer import PromptTokenizer
from tests.test_tokenizer import tokenizer_dir  # noqa: F401 - the fixture

ROOT = Path(__file__).resolve().parent.parent
SAMPLE = ROOT / "scenarios" / "traces" / "agentic-mooncake-sample.jsonl"

# Four requests in blocks of 16: the second shares the first's two blocks, the third
# shares block 1 only at a later position, the fourth is all new.
ROWS = [
    {"timestamp": 0, "input_length": 40, "output_length": 4, "hash_ids": [1, 2, 3]},
    {"timestamp": 250, "input_length": 48, "output_length": 5, "hash_ids": [1, 2, 4]},
    {"timestamp": 1250.5, "input_length": 20, "output_length": 6, "hash_ids": [7, 1]},
    {"timestamp": 4000, "input_length": 16, "output_length": 7, "hash_ids": [9]},
]


def write(tmp_path: Path, rows: list, name: str = "t.jsonl") -> Path:
    path = tmp_path / name
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def plan_for(path: Path, tokenizer: Path | None = None, **workload):
    text = json.dumps(
        {
            "target": {"base_url": "http://127.0.0.1:9", "endpoint": "/v1/completions"},
            "workload": {
                "dataset": "mooncake",
                "dataset_path": str(path),
                "block_size": 16,
                "tokenizer": None if tokenizer is None else str(tokenizer),
                **workload,
            },
            "seed": 7,
        }
    )
    return plan_from_scenario(parse_scenario(text, source="t.yaml"))


def test_offsets_and_lengths_are_the_traces(tmp_path):
    plan = plan_for(write(tmp_path, ROWS))
    assert plan.offsets_s.tolist() == [0.0, 0.25, 1.2505, 4.0]
    assert [s.input_len for s in plan.specs] == [40, 48, 20, 16]
    assert [s.output_len for s in plan.specs] == [4, 5, 6, 7]


def test_equal_hash_ids_give_identical_tokens_and_lengths_are_exact(tmp_path, tokenizer_dir):  # noqa: F811
    tok = PromptTokenizer(tokenizer_dir)
    plan = plan_for(write(tmp_path, ROWS), tokenizer_dir)
    prompts = [plan.workload.render(s)[0] for s in plan.specs]
    ids = [tok._tok.encode(p, add_special_tokens=False).ids for p in prompts]
    assert [len(i) for i in ids] == [40, 48, 20, 16]
    # Requests 0 and 1 share blocks 1 and 2: their first 32 tokens are the same ids...
    assert ids[0][:32] == ids[1][:32]
    # ...and the third block (ids 3 vs 4) differs.
    assert ids[0][32:40] != ids[1][32:40]
    # Block 1 cut short (request 2 has it second, 4 tokens): its first whole words, then a
    # filler to the exact count, so here 3 of its 4 tokens are block 1's.
    assert ids[2][16:19] == ids[0][:3]
    assert ids[2][:16] != ids[0][:16]


def test_the_sample_trace_renders_exact_and_shares_its_system_prompt(tokenizer_dir):  # noqa: F811
    tok = PromptTokenizer(tokenizer_dir)
    sc = parse_scenario(
        (ROOT / "scenarios" / "agentic-replay.yaml").read_text(),
        source="agentic-replay.yaml",
        overrides={
            "target": {"base_url": "http://127.0.0.1:9"},
            "workload": {"tokenizer": str(tokenizer_dir)},
        },
    )
    plan = plan_from_scenario(sc, base_dir=ROOT / "scenarios")
    rows = [json.loads(line) for line in SAMPLE.read_text().splitlines()]
    assert plan.offsets_s.tolist() == [r["timestamp"] / 1000 for r in rows]
    prompts = [tok._tok.encode(plan.workload.render(s)[0], add_special_tokens=False).ids
               for s in plan.specs]  # fmt: skip
    assert [len(p) for p in prompts] == [r["input_length"] for r in rows]
    system = prompts[0][:128]  # hash ids 0 and 1 open every session
    assert all(p[:128] == system for p in prompts)


def test_without_a_tokenizer_blocks_are_words_and_equal_ids_equal_bytes(tmp_path):
    plan = plan_for(write(tmp_path, ROWS))
    prompts = [plan.workload.render(s)[0] for s in plan.specs]
    words = [p.split(" ")[1:] for p in prompts]  # every word has its leading space
    assert [len(w) for w in words] == [40, 48, 20, 16]  # about one token a word
    assert prompts[1].startswith(" ".join([""] + words[0][:32]))
    assert words[2][16:20] == words[0][:4]


def test_pooled_blocks_keep_identity_prefixes_and_word_counts():
    """Without a tokenizer a block is pooled chunks: equal (seed, id) equal text at any
    length (a short block a prefix of the full one), other ids or seeds other text, and
    exactly one word per token asked for, block sizes that are no multiple of 16 too."""
    from bench.blocks import chunk_pool
    from bench.workload import _WORDS

    pool = chunk_pool(tuple(_WORDS))
    assert chunk_pool(tuple(_WORDS)) is pool  # one per process and vocabulary
    full = pool.prompt(3, [7, 8, 9], 300, 100)
    assert len(full.split(" ")[1:]) == 300 and full.startswith(" ")
    for n in (1, 15, 16, 17, 99, 100, 101, 250):
        assert full.startswith(pool.prompt(3, [7, 8, 9], n, 100))
        assert len(pool.prompt(3, [7, 8, 9], n, 100).split(" ")[1:]) == n
    block_8 = pool.prompt(3, [8], 100, 100)
    assert full.split(" ")[101:201] == block_8.split(" ")[1:]  # an id's text wherever it is
    assert pool.prompt(3, [5, 8], 200, 100).endswith(block_8)
    assert pool.prompt(4, [7], 100, 100) != pool.prompt(3, [7], 100, 100)
    assert pool.prompt(3, [6], 100, 100) != pool.prompt(3, [7], 100, 100)
    words = [pool.prompt(1, [h], 512, 512) for h in range(200)]
    assert len(set(words)) == 200


def test_each_run_seed_gives_other_text_for_the_same_ids(tmp_path):
    path = write(tmp_path, ROWS)
    a = plan_for(path)
    b = plan_for(path, prefix_ratio=0.0)
    assert a.workload.render(a.specs[0])[0] == b.workload.render(b.specs[0])[0]  # same seed
    text = a.workload.blocks.prompt(0)
    a.workload.blocks.seed = 8
    a.workload.blocks._block.cache_clear()
    assert a.workload.blocks.prompt(0) != text


def test_intended_reuse_counts_blocks_seen_before(tmp_path):
    plan = plan_for(write(tmp_path, ROWS))
    got = plan.workload.blocks.intended_reuse(len(plan.specs))
    # hits: request 1 blocks 1,2 (32 tokens); request 2 block 1 cut to 4 tokens
    assert got["cached_tokens"] == 36
    assert got["prompt_tokens"] == 40 + 48 + 20 + 16
    assert (got["blocks"], got["blocks_seen_before"]) == (9, 3)
    assert got["share"] == pytest.approx(36 / 124)


def test_request_rate_scales_the_timestamps(tmp_path):
    path = write(tmp_path, ROWS)
    text = json.dumps(
        {
            "target": {"base_url": "http://127.0.0.1:9"},
            "load": {"request_rate": 3.0},
            "workload": {"dataset": "mooncake", "dataset_path": str(path), "block_size": 16},
        }
    )
    offsets = plan_from_scenario(parse_scenario(text, source="t.yaml")).offsets_s
    assert offsets[-1] == pytest.approx(1.0)  # 3 gaps at a mean of 3 req/s
    assert np.allclose(offsets, np.array([0, 250, 1250.5, 4000]) / 4000)


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("not json", "line 2: not JSON"),
        ('{"timestamp": 1, "input_length": 16, "output_length": 1}', "line 2: missing hash_ids"),
        ('{"timestamp": -1, "input_length": 16, "output_length": 1, "hash_ids": [1]}',
         "line 2: timestamp -1"),
        ('{"timestamp": 5, "input_length": 0, "output_length": 1, "hash_ids": [1]}',
         "line 2: input_length 0"),
        ('{"timestamp": 5, "input_length": 16, "output_length": 1, "hash_ids": ["a"]}',
         "line 2: hash_ids must be integers"),
        ('{"timestamp": 5, "input_length": 40, "output_length": 1, "hash_ids": [1, 2]}',
         "line 2: 2 hash_ids for input_length 40, but blocks of 16 tokens need 3"),
        ('{"timestamp": 0, "input_length": 16, "output_length": 1, "hash_ids": [1]}',
         "line 2: timestamp 0 is earlier than the line before (1)"),
    ],
)  # fmt: skip
def test_bad_lines_are_errors_naming_file_and_line(tmp_path, line, message):
    good = '{"timestamp": 1, "input_length": 16, "output_length": 1, "hash_ids": [5]}'
    path = write(tmp_path, [good, line, good.replace('"timestamp": 1', '"timestamp": 9')])
    with pytest.raises(ScenarioError) as err:
        plan_for(path)
    assert str(path) in str(err.value)
    assert message in str(err.value)


def test_other_load_shapes_are_refused(tmp_path):
    text = json.dumps(
        {
            "load": {"shape": "closed", "concurrency": 2},
            "workload": {"dataset": "mooncake", "dataset_path": str(write(tmp_path, ROWS))},
        }
    )
    with pytest.raises(ScenarioError, match="replays its own timestamps"):
        parse_scenario(text, source="t.yaml")


@pytest.mark.slow
def test_cli_run_reports_intended_beside_measured(fake_server, tmp_path):
    out = tmp_path / "s.json"
    proc = subprocess.run(
        [sys.executable, "-m", "bench", "run", "--base-url", fake_server.url,
         "--model", "m", "--scenario", str(ROOT / "scenarios" / "agentic-replay.yaml"),
         "--request-rate", "40", "--summary-json", str(out),
         "--db", f"sqlite:///{tmp_path / 'tb.db'}"],
        capture_output=True, text=True, timeout=300, cwd=ROOT / "scenarios",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(out.read_text())
    assert summary["completed"] == 40
    intended = summary["prompt_cache"]["intended"]
    assert (intended["cached_tokens"], intended["prompt_tokens"]) == (8192, 11157)
    assert "trace reuses (intended" in proc.stdout


def test_sim_run_without_rates_replays_the_traces_own_timestamps(tmp_path):
    """`sim run` on a trace scenario with no --request-rates sends at the trace's timestamps
    (it used to scale them to the simulator's default 4 req/s)."""
    from bench.store import list_runs, load_records

    sample = ROOT / "scenarios" / "traces" / "agentic-mooncake-sample.jsonl"
    want = [json.loads(line)["timestamp"] for line in sample.read_text().splitlines()]
    db = f"sqlite:///{tmp_path / 'tb.db'}"
    from typer.testing import CliRunner

    from bench.cli import app

    proc = CliRunner().invoke(app, [
        "sim", "run", "--gpu", "B200", "--model", "llama-3.3-70b",
        "--scenario", str(ROOT / "scenarios" / "agentic-replay.yaml"), "--db", db,
    ], env={"COLUMNS": "250"})  # fmt: skip
    assert proc.exit_code == 0, proc.output
    (run,) = list_runs(db)
    sent_ms = sorted(r.intended_ns / 1e6 for r in load_records(run.id, 0, db))
    assert sent_ms == pytest.approx([t - want[0] for t in want], abs=1e-3)
    rate = (len(want) - 1) / ((want[-1] - want[0]) / 1000)  # the trace's own mean rate
    assert f"rate {rate:g} req/s" in proc.output


def test_a_sweep_keeps_the_trace_at_each_rate_and_refuses_concurrency(tmp_path):
    from bench.sweep import PointSpec, scenario_at

    text = json.dumps(
        {
            "target": {"base_url": "http://127.0.0.1:9"},
            "workload": {
                "dataset": "mooncake",
                "dataset_path": str(write(tmp_path, ROWS)),
                "block_size": 16,
            },
        }
    )
    sc = parse_scenario(text, source="t.yaml")
    plan = plan_from_scenario(scenario_at(sc, PointSpec("rate", 0.75)))
    assert plan.offsets_s[-1] == pytest.approx(4.0)  # 3 gaps at 0.75 req/s: the trace's own
    assert [s.input_len for s in plan.specs] == [40, 48, 20, 16]
    point = scenario_at(sc, PointSpec("concurrency", 2))
    with pytest.raises(ScenarioError, match="sweep it over --request-rates"):
        point.workload_plan()


@pytest.mark.parametrize("style", ["metaspace-first", "metaspace-always", "bytelevel-prefix"])
def test_exact_with_sentencepiece_style_tokenizers_too(tmp_path, style):
    """Llama-2/Mistral tokenizers mark word starts with a metaspace; others add a prefix
    space: each block is still exact and equal ids still equal tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    from bench.workload import _WORDS

    tok = Tokenizer(models.BPE(unk_token="[UNK]"))
    if style.startswith("metaspace"):
        scheme = style.split("-")[1]
        tok.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme=scheme)
        tok.decoder = decoders.Metaspace(prepend_scheme=scheme)
    else:
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
        tok.decoder = decoders.ByteLevel()
    corpus = [" ".join(_WORDS[i : i + 12]) for i in range(0, len(_WORDS), 3)]
    tok.train_from_iterator(corpus * 4, trainers.BpeTrainer(vocab_size=400))
    tok.save(str(tmp_path / "tokenizer.json"))
    plan = plan_for(write(tmp_path, ROWS), tmp_path)
    enc = PromptTokenizer(tmp_path)._tok
    ids = [enc.encode(plan.workload.render(s)[0], add_special_tokens=False).ids
           for s in plan.specs]  # fmt: skip
    assert [len(i) for i in ids] == [40, 48, 20, 16]
    assert ids[0][:32] == ids[1][:32]
