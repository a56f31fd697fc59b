"""Request mixes: what each request asks for (prompt, output length, conversation turn).

Lengths are drawn up front (cheap numpy arrays); prompt text is rendered lazily, one request
at a time, from a generator seeded by (seed, request index), so the same seed always gives
the same prompts whatever the order requests are rendered in, and a million-request run does
not hold a million prompts in memory.

Without a tokenizer, synthetic prompts are made of common English words that are one token
each in Llama/Qwen/GPT tokenizers, so `input_len` words ≈ `input_len` tokens (approximate:
the server's usage field reports the true count). With `tokenizer` (bench/tokenizer.py,
`--tokenizer PATH`) the same words are cut to exactly `input_len` tokens. `prompt_format:
token_ids` sends exact token ids to servers that accept them on /v1/completions (vLLM,
SGLang).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from bench.blocks import BlockPrompts, ContentReuse
from bench.lengths import LENGTHS
from bench.tokenizer import PromptTokenizer, words_for

_WORDS = (  # noqa: SIM905 - one readable block of words
    "the of and to in is it you that he was for on are with as his they be at one have this "
    "from or had by hot but some what there we can out other were all your when up use word "
    "how said an each she which do their time if will way about many then them would write "
    "like so these her long make thing see him two has look more day could go come did my "
    "sound no most number who over know water than call first people may down side been now "
    "find any new work part take get place made live where after back little only round man "
    "year came show every good me give our under name very through just form much great "
    "think say help low line before turn cause same mean differ move right boy old too does "
    "tell sentence set three want air well also play small end put home read hand port large "
    "spell add even land here must big high such follow act why ask men change went light "
    "kind off need house picture try us again animal point mother world near build self "
    "earth father "
).split()
_WORD_ARRAY = np.array(_WORDS)
_TOKEN_ID_RANGE = (1000, 30000)  # ordinary word-piece ids in every modern vocabulary


@dataclass(frozen=True)
class LengthDist:
    """A token-length distribution: a kind of bench.lengths.LENGTHS (fixed, uniform with
    vLLM's range ratio, normal, lognormal, ...) and its parameters."""

    kind: str = "fixed"
    mean: int = 256
    range_ratio: float = 0.0
    std: float = 0.0
    sigma: float = 0.5
    min: int = 1
    max: int = 1_000_000

    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray:
        out = LENGTHS.get(self.kind)(self, n, rng)
        return np.clip(np.rint(out), max(1, self.min), self.max).astype(np.int64)


@dataclass(slots=True)
class RequestSpec:
    """One request to send: lengths, and where its text comes from."""

    index: int
    input_len: int
    output_len: int
    session: int = 0
    turn: int = 0
    text: str | None = None  # a dataset prompt; None means synthetic
    messages: list[dict] | None = None
    traffic_class: str | None = None  # its class in a mix (MixedWorkload); None: no mix


@dataclass
class Workload:
    """The request mix of a run: lengths per request plus how to render prompts."""

    seed: int = 0
    input: LengthDist = field(default_factory=LengthDist)
    output: LengthDist = field(default_factory=lambda: LengthDist(mean=128))
    prefix_ratio: float = 0.0  # fraction of each prompt shared across requests (prefix cache)
    num_prefixes: int = 1  # distinct shared prefixes (requests are spread over them)
    turns: int = 1  # multi-turn conversations: requests per session
    prompt_format: str = "text"  # or "token_ids" (completions only)
    dataset: list[tuple[str | list[dict], int | None]] | None = None  # (prompt, output_len)
    tokenizer: PromptTokenizer | None = None  # exact lengths; None: words ~ one token each
    # A block-hashed trace's prompts (bench.blocks): request i is line i's blocks.
    blocks: BlockPrompts | None = None

    @property
    def tokenizer_path(self) -> str | None:
        return None if self.tokenizer is None else self.tokenizer.path

    @property
    def repeats_prompt_blocks(self) -> bool:
        """Whether two prompts can share a block (a prefix cache has anything to find):
        datasets and traces can, shared prefixes and multi-turn sessions do; random prompts
        without them do not."""
        has_source = self.dataset is not None or self.blocks is not None
        return has_source or self.prefix_ratio > 0 or self.turns > 1

    def specs(self, n: int) -> list[RequestSpec]:
        """The first n requests, in send order (sessions' turns are consecutive)."""
        rng = np.random.default_rng([self.seed, 1])
        if self.dataset is not None:
            return self._dataset_specs(n, rng)
        ins = self.input.sample(n, rng)
        outs = self.output.sample(n, rng)
        turns = max(1, self.turns)
        return [
            RequestSpec(i, int(ins[i]), int(outs[i]), session=i // turns, turn=i % turns)
            for i in range(n)
        ]

    def _dataset_specs(self, n: int, rng: np.random.Generator) -> list[RequestSpec]:
        if not self.dataset:
            raise ValueError("the dataset has no usable prompts")
        order = rng.permutation(len(self.dataset))
        outs = self.output.sample(n, rng)
        specs = []
        for i in range(n):
            prompt, out_len = self.dataset[order[i % len(order)]]
            if isinstance(prompt, list):
                text = " ".join(str(m.get("content", "")) for m in prompt)
                messages = prompt
            else:
                text, messages = prompt, None
            specs.append(
                RequestSpec(
                    i,
                    input_len=self.tokenizer.count(text)
                    if self.tokenizer
                    else estimate_tokens(text),
                    output_len=int(out_len) if out_len else int(outs[i]),
                    text=text,
                    messages=messages,
                )
            )
        return specs

    def render(self, spec: RequestSpec) -> tuple[str | list[int], list[dict]]:
        """(completions prompt, chat messages) for one request."""
        if spec.text is not None:
            messages = spec.messages or [{"role": "user", "content": spec.text}]
            return spec.text, messages
        if self.blocks is not None:
            text = self.blocks.prompt(spec.index, spec.input_len)
            return text, [{"role": "user", "content": text}]
        rng = np.random.default_rng([self.seed, 2, spec.index])
        history: list[dict] = []
        for turn in range(spec.turn):
            # Earlier turns of this session, re-rendered identically from their own seeds.
            earlier = spec.index - spec.turn + turn
            history.append({"role": "user", "content": self._user_text(earlier, spec.input_len)})
            history.append({"role": "assistant", "content": self._text(rng, spec.output_len)})
        user = self._user_text(spec.index, spec.input_len, rng)
        messages = [*history, {"role": "user", "content": user}]
        if self.prompt_format == "token_ids":
            ids_rng = np.random.default_rng([self.seed, 3, spec.index])
            ids = ids_rng.integers(*_TOKEN_ID_RANGE, size=spec.input_len).tolist()
            return ids, messages
        prompt = "\n".join(m["content"] for m in messages)
        return prompt, messages

    def _user_text(self, index: int, length: int, rng: np.random.Generator | None = None) -> str:
        rng = rng or np.random.default_rng([self.seed, 2, index])
        shared = int(length * self.prefix_ratio)
        prefix = ""
        if shared:
            group = index % max(1, self.num_prefixes)
            prefix = self._text(np.random.default_rng([self.seed, 4, group]), shared)
        if self.tokenizer is not None:  # exact: the seam after the prefix is counted too
            return self.tokenizer.render(words_for(rng, _WORD_ARRAY, length), length, prefix)
        return " ".join(p for p in (prefix, _words(rng, length - shared)) if p)

    def _text(self, rng: np.random.Generator, n: int) -> str:
        """n tokens of words: exactly n with a tokenizer, about n without."""
        if self.tokenizer is None:
            return _words(rng, n)
        return self.tokenizer.render(words_for(rng, _WORD_ARRAY, n), n)


@dataclass
class TrafficClass:
    """One class of a mix: its name, its share of the sessions, and its own request mix."""

    name: str
    share: float
    workload: Workload


@dataclass
class MixedWorkload:
    """Several traffic classes in one run (a scenario's `classes:`, e.g. chat and agent).

    Each session is drawn from one class with the class's share as its probability (so each
    class's arrivals are a thinned copy of the run's: Poisson stays Poisson), and gets that
    class's lengths, prompts and turns; each request carries its class's name, which its
    record keeps. `specs(n)` gives n sessions (a class with turns sends several requests
    per session), as the load's rate and count mean sessions for multi-turn workloads.
    """

    classes: list[TrafficClass]
    seed: int = 0
    # What the executors read of a single Workload: one turn per "session" slot here (the
    # turns are inside specs), no dataset-wide settings of its own.
    turns: int = 1
    dataset: None = None
    blocks: None = None
    tokenizer: None = None
    prompt_format: str = "text"

    @property
    def tokenizer_path(self) -> None:
        return None

    @property
    def repeats_prompt_blocks(self) -> bool:
        """Whether any class's prompts can share a block (Workload.repeats_prompt_blocks)."""
        return any(c.workload.repeats_prompt_blocks for c in self.classes)

    def specs(self, n: int) -> list[RequestSpec]:
        """The requests of n sessions, in send order (a session's turns consecutive)."""
        rng = np.random.default_rng([self.seed, 5])
        shares = np.array([c.share for c in self.classes], dtype=np.float64)
        which = rng.choice(len(self.classes), size=n, p=shares / shares.sum())
        drawn = [
            c.workload.specs(int((which == k).sum()) * max(1, c.workload.turns))
            for k, c in enumerate(self.classes)
        ]
        used = [0] * len(self.classes)
        out: list[RequestSpec] = []
        for session, k in enumerate(which.tolist()):
            for _ in range(max(1, self.classes[k].workload.turns)):
                own = drawn[k][used[k]]
                used[k] += 1
                out.append(
                    RequestSpec(
                        len(out), own.input_len, own.output_len, session=session,
                        turn=own.turn, text=own.text, messages=own.messages,
                        traffic_class=self.classes[k].name,
                    )
                )  # fmt: skip
        return out

    def intended_reuse(self, specs: Sequence[RequestSpec], chat: bool) -> dict[str, dict]:
        """The prompt-cache hit rate these requests imply with a cache that keeps every
        block (bench.blocks.ContentReuse over their rendered prompts, in send order), for
        each class's own requests under its name and for the mix under "" (the classes'
        sums: one class's prompts never share another's blocks, each class drawing its own
        from its own seed). Rendered again here, one at a time, after the point: never on
        the send path."""
        counts = {c.name: ContentReuse() for c in self.classes}
        for spec in specs:
            counts[spec.traffic_class].add(prompt_words(self, spec, chat))
        out = {name: c.result() for name, c in counts.items() if c.offered}
        if not out:
            return {}
        mix = dict(next(iter(out.values())))
        for key in ("blocks", "blocks_seen_before", "cached_tokens", "prompt_tokens"):
            mix[key] = sum(part[key] for part in out.values())
        mix["share"] = mix["cached_tokens"] / mix["prompt_tokens"] if mix["prompt_tokens"] else None
        notes = [f"class {k}: {part['note']}" for k, part in out.items() if "note" in part]
        mix.pop("requests", None)
        mix.pop("note", None)
        if notes:
            mix["note"] = "; ".join(notes)
        return {"": mix, **out}

    def render(self, spec: RequestSpec) -> tuple[str | list[int], list[dict]]:
        """The prompt as the request's own class renders it (its seed, prefixes, turns)."""
        for c in self.classes:
            if c.name == spec.traffic_class:
                return c.workload.render(spec)
        raise ValueError(f"request {spec.index} has no traffic class of this mix")


def prompt_words(workload: Workload | MixedWorkload, spec: RequestSpec, chat: bool) -> list:
    """A request's prompt as the words (or token ids) it sends, at most its input length:
    what the simulator counts as tokens and matches its prefix cache on, and what the
    intended reuse is judged on. A chat request sends its messages' contents."""
    prompt, messages = workload.render(spec)
    if isinstance(prompt, str) and chat:
        prompt = " ".join(str(m.get("content", "")) for m in messages)
    tokens = prompt.split() if isinstance(prompt, str) else prompt
    return tokens[: spec.input_len]


def _words(rng: np.random.Generator, n: int) -> str:
    if n <= 0:
        return ""
    # a list of Python str joins ~10x faster than the numpy array's own elements
    return " ".join(_WORD_ARRAY[rng.integers(0, len(_WORD_ARRAY), size=n)].tolist())


def estimate_tokens(text: str) -> int:
    """Rough token count without a tokenizer: ~4 characters per token for English."""
    return max(1, math.ceil(len(text) / 4))


# ---------------------------------------------------------------- datasets


def load_sharegpt(path: str | Path) -> list[tuple[str, int | None]]:
    """ShareGPT JSON: [{"conversations": [{"from": "human", "value": ...}, {"from": "gpt", ...}]}].

    Like vLLM: the first human turn is the prompt and the reply's length is the output length.
    """
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise ValueError(f"--dataset-path {path}: file not found") from None
    except ValueError as exc:
        raise ValueError(f"--dataset-path {path}: not valid JSON ({exc})") from None
    if not isinstance(data, list):
        raise ValueError(f"--dataset-path {path}: expected a JSON list of conversations")
    out = []
    for item in data:
        conv = item.get("conversations") or item.get("conversation") or []
        if len(conv) < 2:
            continue
        prompt, reply = conv[0].get("value", ""), conv[1].get("value", "")
        if prompt and reply:
            out.append((prompt, estimate_tokens(reply)))
    if not out:
        raise ValueError(f"--dataset-path {path}: no conversation with a prompt and a reply")
    return out


def load_jsonl_prompts(path: str | Path) -> list[tuple[str | list[dict], int | None]]:
    """JSONL of prompts: {"prompt": "..."} or {"messages": [...]}, optional "output_len"."""
    path = Path(path)
    if not path.exists():
        raise ValueError(f"--dataset-path {path}: file not found")
    out = []
    for lineno, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError as exc:
            raise ValueError(f"{path} line {lineno}: not JSON ({exc})") from None
        prompt = row.get("messages") or row.get("prompt") or row.get("text")
        if not prompt:
            raise ValueError(f"{path} line {lineno}: needs a 'prompt', 'text' or 'messages' field")
        out_len = row.get("output_len") or row.get("max_tokens")
        out.append((prompt, int(out_len) if out_len else None))
    if not out:
        raise ValueError(f"--dataset-path {path}: no prompts")
    return out
