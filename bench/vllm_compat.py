"""`vllm bench serve` habits on our command line: what click alone does not do.

- Several values after one flag (argparse's nargs="+"): `--goodput ttft:500 tpot:50` and
  `--metadata version=0.3.3 tp=1` become one flag per value before click parses them.
- A vLLM flag we do not have gets a message naming our equivalent, instead of click's
  "did you mean" pick among our flags by spelling.
"""

from __future__ import annotations

from typer.core import TyperCommand

try:  # typer >= 0.20 vendors click as typer._click; older typer uses click itself
    from typer._click import exceptions as click_errors
except ImportError:  # pragma: no cover - depends on the installed typer
    import click.exceptions as click_errors

# Flags that take every following word up to the next flag, as vLLM's do.
MULTI_VALUE_FLAGS = ("--goodput", "--metadata", "--header")

# vLLM flags that tokenbench spells differently or does not have, and what to use instead.
VLLM_EQUIVALENTS: dict[str, str] = {
    "--served-model-name": "--model is the name sent in each request (as the server serves it)",
    "--endpoint-type": "--backend (vllm, sglang, trtllm, openai) with --endpoint",
    "--dataset": "--dataset-name with --dataset-path",
    "--append-result": "each run writes its own --result-filename and is stored "
    "(`tokenbench runs`); append files with your own script",
    "--profile": "not supported: use the server's own profiler",
    "--use-beam-search": "not supported: tokenbench measures streamed sampling",
    "--logprobs": "not supported: tokenbench does not request logprobs",
    "--trust-remote-code": "not needed: --tokenizer loads a Hugging Face tokenizer without "
    "running remote code",
    "--tokenizer-mode": "not needed: --tokenizer loads a Hugging Face tokenizer",
    "--request-id-prefix": "not supported: requests are numbered in the stored run",
    "--sharegpt-output-len": "--random-output-len sets every request's output length",
    "--sonnet-input-len": "--random-input-len (or --dataset-name jsonl with --dataset-path)",
    "--sonnet-output-len": "--random-output-len",
    "--hf-output-len": "--random-output-len",
    "--hf-subset": "--dataset-name jsonl with --dataset-path (a local file)",
    "--hf-split": "--dataset-name jsonl with --dataset-path (a local file)",
    "--random-prefix-len": "a --scenario file's workload.prefix_ratio and workload.num_prefixes",
    "--ready-check-timeout-sec": "not needed: tokenbench checks the endpoint answers before "
    "sending load",
    "--lora-modules": "--model names the adapter to request",
    "--request-rate": "`tokenbench sweep --request-rates 1,2,4,inf` (one point per rate)",
    "--max-concurrency": "`tokenbench sweep --concurrency 1,4,16` (closed loop per point) or "
    "`tokenbench run --max-concurrency N`",
}


def spread_multi_values(args: list[str]) -> list[str]:
    """['--goodput', 'ttft:500', 'tpot:50'] -> ['--goodput', 'ttft:500', '--goodput', 'tpot:50'].

    Only for commands without positional arguments (run, sweep): every word after such a
    flag, up to the next word starting with '-', is one of its values.
    """
    out: list[str] = []
    flag, taken = None, 0
    for arg in args:
        if arg == "--":
            flag = None
        elif arg in MULTI_VALUE_FLAGS:
            flag, taken = arg, 0
        elif flag is not None and not arg.startswith("-"):
            if taken:
                out.append(flag)
            taken += 1
        else:
            flag = None
        out.append(arg)
    return out


class VllmCommand(TyperCommand):
    """A typer command that reads vLLM's multi-value flags and explains vLLM-only flags."""

    def parse_args(self, ctx, args: list[str]) -> list[str]:
        try:
            return super().parse_args(ctx, spread_multi_values(list(args)))
        except click_errors.NoSuchOption as exc:
            name = exc.option_name.split("=", 1)[0]
            hint = VLLM_EQUIVALENTS.get(name)
            if hint is None or self._has_option(name):
                raise
            raise click_errors.UsageError(
                f"{name} is a `vllm bench serve` flag; in tokenbench: {hint}", ctx=ctx
            ) from None

    def _has_option(self, name: str) -> bool:
        return any(name in p.opts or name in p.secondary_opts for p in self.params)
