"""--tokenizer: prompts of exactly N tokens, output counted when a server sends no usage.

The tokenizer is trained here, from nothing (no hub): a small byte-level BPE whose vocabulary
is too small for whole words, so most words are several tokens and a prompt of N words is not
N tokens. That is what makes exact rendering non-trivial.
"""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from bench.scenario import ScenarioError, parse_scenario
from bench.tokenizer import PromptTokenizer, TokenizerError
from bench.workload import _WORDS, LengthDist, Workload


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    tok = Tokenizer(models.BPE(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=["[UNK]", "<s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    corpus = [" ".join(_WORDS[i : i + 12]) for i in range(0, len(_WORDS), 3)]
    tok.train_from_iterator(corpus * 4, trainer)
    out = tmp_path_factory.mktemp("tok")
    tok.save(str(out / "tokenizer.json"))
    return out


def test_words_are_not_one_token_each_here(tokenizer_dir):
    tok = PromptTokenizer(tokenizer_dir)
    text = " ".join(_WORDS[:50])
    assert tok.count(text) > 60  # so word prompts would be off by more than 20%


@pytest.mark.parametrize("n", [1, 2, 7, 64, 333])
def test_synthetic_prompts_have_exactly_n_tokens(tokenizer_dir, n):
    tok = PromptTokenizer(tokenizer_dir)
    w = Workload(seed=3, input=LengthDist(mean=n), tokenizer=tok)
    for spec in w.specs(20):
        prompt, _ = w.render(spec)
        assert tok.count(prompt) == n


def test_shared_prefix_and_turns_keep_exact_lengths(tokenizer_dir):
    tok = PromptTokenizer(tokenizer_dir / "tokenizer.json")  # the file itself works too
    w = Workload(
        seed=1, input=LengthDist(mean=100), prefix_ratio=0.5, num_prefixes=2, tokenizer=tok
    )
    prompts = [w.render(spec)[0] for spec in w.specs(6)]
    assert all(tok.count(p) == 100 for p in prompts)
    # Two shared prefixes of 50 tokens, alternating, kept as they are in every prompt.
    first = w._text(np.random.default_rng([1, 4, 0]), 50)
    assert tok.count(first) == 50
    assert prompts[0].startswith(first) and prompts[2].startswith(first)
    assert not prompts[1].startswith(first)


def test_without_a_tokenizer_lengths_are_words(tokenizer_dir):
    w = Workload(seed=3, input=LengthDist(mean=64))
    prompt, _ = w.render(w.specs(1)[0])
    assert len(prompt.split()) == 64


def test_a_missing_or_wrong_path_says_what_to_give(tmp_path, tokenizer_dir):
    with pytest.raises(TokenizerError, match="not found.*never downloads"):
        PromptTokenizer(tmp_path / "meta-llama/Llama-3-8B")
    (tmp_path / "tokenizer.model").write_bytes(b"\0")
    with pytest.raises(TokenizerError, match="no tokenizer.json in this folder.*tokenizer.model"):
        PromptTokenizer(tmp_path)
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    with pytest.raises(TokenizerError, match="is not a tokenizer"):
        PromptTokenizer(bad)
    with pytest.raises(ScenarioError, match="--tokenizer"):
        parse_scenario(f"workload: {{tokenizer: {tmp_path / 'nope'}}}").workload_plan()
    sc = parse_scenario(f"workload: {{tokenizer: {tokenizer_dir}, input: {{mean: 40}}}}")
    w = sc.workload_plan()
    assert w.tokenizer_path and w.tokenizer.count(w.render(w.specs(1)[0])[0]) == 40


def test_a_tokenizer_that_cannot_spell_the_prompt_words_is_refused(tmp_path, tokenizer_dir):
    """A word-level tokenizer of other words (w0, w1, ...) maps every prompt word to [UNK],
    which decodes to nothing: every prompt would have been sent empty (a server answers 400
    to all of them). The scenario is refused when read, naming the tokenizer."""
    vocab = {w: i for i, w in enumerate(["[UNK]"] + [f"w{i}" for i in range(50)])}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens(["[UNK]"])
    tok.save(str(tmp_path / "tokenizer.json"))
    with pytest.raises(TokenizerError, match="decode to nothing.*own tokenizer"):
        PromptTokenizer(tmp_path).check_spells(list(_WORDS))
    with pytest.raises(ScenarioError, match=f"--tokenizer {tmp_path}"):
        parse_scenario(f"workload: {{tokenizer: {tmp_path}}}").workload_plan()
    PromptTokenizer(tokenizer_dir).check_spells(list(_WORDS))  # a BPE spells anything


@pytest.mark.slow
def test_output_tokens_counted_with_the_tokenizer_when_the_server_sends_no_usage(
    server_factory, tokenizer_dir, tmp_path
):
    server = server_factory("--ttft-ms", "5", "--itl-ms", "1", "--no-usage")
    out = tmp_path / "s.json"
    proc = subprocess.run(
        [sys.executable, "-m", "bench", "run", "--base-url", server.url, "--model", "m",
         "--num-prompts", "4", "--request-rate", "inf", "--random-input-len", "30",
         "--random-output-len", "24", "--tokenizer", str(tokenizer_dir),
         "--summary-json", str(out), "--no-store", "--no-scrape-metrics"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(out.read_text())
    tok = PromptTokenizer(tokenizer_dir)
    # The fake server streams "tok0 ", "tok1 ", ...: 24 chunks, more tokens than that here.
    per_request = tok.count("".join(f"tok{i} " for i in range(24)))
    assert per_request > 24
    assert summary["completed"] == 4
    rate = summary["throughput"]["output_tokens_per_s"]
    assert round(rate * summary["duration_s"]) == 4 * per_request
    # Prompt lengths are exact, so no "approximate" note; without --tokenizer there is one.
    assert not any("approximate" in n for n in summary["notes"])
    assert "prompt lengths are approximate" not in proc.stdout


def test_a_plan_with_a_tokenizer_travels_to_worker_processes(tokenizer_dir):
    # Distributed runs pickle the plan: the tokenizer goes as its path and is loaded there.
    import pickle

    w = Workload(seed=2, input=LengthDist(mean=50), tokenizer=PromptTokenizer(tokenizer_dir))
    copy = pickle.loads(pickle.dumps(w))
    spec = w.specs(1)[0]
    assert copy.render(spec)[0] == w.render(spec)[0]
    assert copy.tokenizer.count(copy.render(spec)[0]) == 50
