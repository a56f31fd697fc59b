"""Real-time OpenAI-compatible HTTP server around the simulated engine.

A raw asyncio protocol (uvloop when available) rather than an ASGI framework: each token is
one pre-encoded HTTP chunk written straight to its socket at the end of the engine step that
produced it, which is what keeps emission within a millisecond of schedule at hundreds of
concurrent streams on a small machine. The engine loop sleeps until shortly before each step's
end on the wall clock, then spins the last stretch, then writes every token of that step.

Endpoints: POST /v1/completions, POST /v1/chat/completions (streaming SSE in OpenAI's format,
ending with `data: [DONE]`, or one JSON body), GET /v1/models, GET /metrics (Prometheus text
with vLLM's metric names plus tokenbench_sim_* lateness gauges), GET /health, and POST
/v1/tokenbench/saturation (the request rate the deployment saturates at for given mean
lengths, which a run measured through it keeps to flag its points near saturation).

Token counts: there is no tokenizer. A prompt's length is the number of whitespace-separated
words in its text (for chat: in all message contents, no template tokens), or the length of a
token-id list. The prefix cache (bench.sim.prefix_cache) matches prompts by those tokens, so
any client's repeated prefixes are found; responses report what it served in
usage.prompt_tokens_details.cached_tokens and /metrics counts it in vLLM's names. The model has no EOS: every request generates exactly max_tokens (or
max_completion_tokens) tokens, as with ignore_eos; min_tokens is therefore always met. Chat
requests without a limit get `default_max_tokens`. Every response says it is simulated.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import signal
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from bench.backends.openai import ENDPOINTS, METRICS_PATHS, MODELS_PATH
from bench.sim.detect import SATURATION_PATH
from bench.sim.engine import Engine, Seq
from bench.sim.virtual import build_engine

log = logging.getLogger("bench.sim.server")

LATE_S = 0.001  # emission later than this is counted as late
SPIN_S = 0.002  # sleep until this close to a deadline, then spin
TOKEN_TEXT = " tok"
MAX_BODY = 16 * 1024 * 1024
MAX_HEADER = 64 * 1024


class BadRequest(Exception):
    """A request body the server refuses, with the message sent back to the client."""


@dataclass
class Job:
    """One request's stream state."""

    proto: HTTPProtocol
    rid: str
    created: int
    chat: bool
    stream: bool
    include_usage: bool
    prompt_tokens: int
    max_tokens: int
    model: str
    keys: list[int] | None = None  # the prompt's block keys for the prefix cache
    chunk: bytes = b""  # pre-encoded per-token HTTP chunk
    emitted: int = 0
    seq: Seq | None = None
    done: bool = False


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def _sse(obj: dict) -> bytes:
    return _chunk(b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n")


def prompt_tokens(body: dict, chat: bool) -> list:
    """The prompt's tokens as the simulator counts them: the words of its text (for chat: of
    every message's content, in order), or its token ids. The prefix cache matches these."""
    if chat:
        msgs = body.get("messages")
        if not isinstance(msgs, list) or not msgs:
            raise BadRequest("'messages' must be a non-empty list")
        words: list[str] = []
        for m in msgs:
            content = m.get("content") if isinstance(m, dict) else None
            if isinstance(content, str):
                words += content.split()
            elif isinstance(content, list):
                for part in content:
                    if isinstance(part, dict) and isinstance(part.get("text"), str):
                        words += part["text"].split()
        return words
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return prompt.split()
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
        return prompt
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        return prompt[0].split()
    raise BadRequest("'prompt' must be a string, a one-string list or a list of token ids")


def count_prompt_tokens(body: dict, chat: bool) -> int:
    """Words of the prompt text, or the length of a token-id list (see the module docstring)."""
    return max(len(prompt_tokens(body, chat)), 1)


class SimServer:
    """The engine driven on the wall clock, plus the state /metrics reports."""

    def __init__(
        self,
        engine: Engine,
        model_name: str,
        default_max_tokens: int = 256,
        calibration: dict | None = None,
    ) -> None:
        self.engine = engine
        # a calibration profile's record (bench.sim.error_bars.calibration_record): announced,
        # so a run against this endpoint states the profile's errors, not the category's
        self.calibration = calibration
        self.model_name = model_name
        self.default_max_tokens = default_max_tokens
        self.wake = asyncio.Event()
        self.aborts: list[Seq] = []
        self.next_id = 0
        self.last_lateness_s = 0.0
        self.max_lateness_s = 0.0
        self.late_emissions = 0
        self.emissions = 0
        self.steps = 0
        self.write_cost_s = 5e-6  # running estimate of one token write
        self.start_late_max_s = 0.0  # worst lateness before the first write of a step
        self.write_max_s = 0.0  # worst time spent writing one step's tokens
        self._last_warn = 0.0
        self._task: asyncio.Task | None = None
        self.step_due: float | None = None  # perf_counter time the step under way ends
        self.created = int(time.time())
        self.connections: set[asyncio.BaseTransport] = set()
        # Speculative decoding (--mtp) as vLLM counts it: the engine emits a decoding
        # sequence's tokens at the mean rate of 1 + a + ... + a^d per verify step, so each
        # decode token stands for 1/that of a draft; accepted at position i is a^(i+1) per
        # draft. Expected values (floats), so the counters say exactly what the model assumed.
        self.spec_drafts = 0.0

    def hardware(self) -> dict:
        """What this endpoint simulates, announced in /v1/models so a client that benchmarks
        it stores the run as simulated, on the simulated GPUs (bench.sim.detect)."""
        dep = self.engine.dep
        return {
            "gpu": dep.gpu.name,
            "gpu_count": self.engine.gpus,  # disaggregated: prefill + decode GPUs
            "model": dep.model.name,
            "precision": dep.precision.name,
            "parallel": dep.parallel,
            "engine": dep.engine,
            **self.engine.knobs(),
            **({"calibration": self.calibration} if self.calibration else {}),
        }

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        for transport in list(self.connections):  # close clients too, so none outlives the loop
            transport.abort()
        if self._task:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    def submit(self, job: Job) -> None:
        """Queue a job; ValueError (before anything is written) when the engine could never
        run it. A calibrated front end (t_req_s) hands it to the scheduler that much later, as
        the virtual-time loop does."""
        front = self.engine.dep.eff.t_req_s
        if front <= 0:
            self._enqueue(job)
            return
        self.engine.check(job.prompt_tokens, job.max_tokens)  # refuse now, not after the wait
        asyncio.get_running_loop().call_later(front, self._enqueue, job)

    def _enqueue(self, job: Job) -> None:
        if job.done:  # the client left while the front end held it
            return
        due = self.step_due  # a request that came during a step came before the step's end
        ago = max(due - time.perf_counter(), 0.0) if due is not None else 0.0
        job.seq = self.engine.add_request(
            self.next_id, job.prompt_tokens, job.max_tokens, job, keys=job.keys, ago_s=ago
        )
        self.next_id += 1
        self.wake.set()

    def abort(self, job: Job) -> None:
        if job.done:
            return
        job.done = True
        if job.seq is not None:  # None: still in the front end, never handed over
            self.aborts.append(job.seq)

    async def _run(self) -> None:
        eng = self.engine
        clock = time.perf_counter
        deadline = clock()
        while True:
            for seq in self.aborts:
                eng.abort(seq)
            self.aborts.clear()
            if not eng.has_work():
                self.step_due = None
                self.wake.clear()
                await self.wake.wait()
                deadline = clock()
                continue
            res = eng.step(list_decoding=True)
            if res is None:
                continue
            deadline = max(deadline, clock() - 0.05) + res.duration_s
            self.step_due = deadline
            n_out = len(res.decoding or ()) + len(res.first_tokens)
            if eng.dep.eff.mtp_tokens and res.decoding:
                self.spec_drafts += len(res.decoding) / eng.dep.mtp_gain
            # all of a step's tokens are due at one instant but writing them takes time, so
            # start early by half the expected write time: errors are centred on the schedule
            lead = 0.5 * n_out * self.write_cost_s
            start = deadline - lead
            wait = start - clock() - SPIN_S
            if wait > 0:
                await asyncio.sleep(wait)
            while clock() < start:
                pass
            t_first = clock()
            finished = {id(s) for s in res.finished}
            for seq in res.decoding:
                if id(seq) not in finished:
                    self._emit(seq.tag, False)
            for seq in res.first_tokens:
                if id(seq) not in finished:
                    self._emit(seq.tag, False)
            for seq in res.finished:
                self._emit(seq.tag, True)
            t_last = clock()
            if n_out:
                per = (t_last - t_first) / n_out
                self.write_cost_s += 0.2 * (per - self.write_cost_s)
            # the worst token of this step: the first written (early) or the last (late)
            late = max(t_last - deadline, deadline - t_first)
            self.start_late_max_s = max(self.start_late_max_s, t_first - start)
            self.write_max_s = max(self.write_max_s, t_last - t_first)
            self.steps += 1
            self.last_lateness_s = late
            self.max_lateness_s = max(self.max_lateness_s, late)
            if late > LATE_S:
                self.late_emissions += 1
                now = clock()
                if now - self._last_warn > 5:
                    self._last_warn = now
                    log.warning(
                        "simulated server is behind schedule: a token left %.1f ms off its "
                        "simulated time (%d tokens in the step)",
                        late * 1e3,
                        n_out,
                    )
            await asyncio.sleep(0)  # let the loop read new requests between steps

    def _emit(self, job: Job, last: bool) -> None:
        if job is None or job.done:
            return
        job.emitted += 1
        self.emissions += 1
        if job.stream:
            if last:
                job.proto.write(self._final_chunks(job))
                job.done = True
                job.proto.finish_response()
            else:
                job.proto.write(job.chunk)
        elif last:
            job.done = True
            job.proto.send_json(200, self._full_body(job))
            job.proto.finish_response()

    # -- bodies -------------------------------------------------------------------------------

    def _base(self, job: Job) -> dict:
        return {
            "id": job.rid,
            "object": "chat.completion.chunk" if job.chat else "text_completion",
            "created": job.created,
            "model": job.model,
            "system_fingerprint": "tokenbench-simulated",
        }

    def _choice(self, job: Job, text: str, finish: str | None) -> dict:
        if job.chat:
            return {
                "index": 0,
                "delta": {"content": text},
                "logprobs": None,
                "finish_reason": finish,
            }
        return {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}

    def _usage(self, job: Job) -> dict:
        usage = {
            "prompt_tokens": job.prompt_tokens,
            "completion_tokens": job.emitted,
            "total_tokens": job.prompt_tokens + job.emitted,
        }
        if job.seq is not None and job.seq.cached_tokens >= 0:  # the prefix cache is on
            usage["prompt_tokens_details"] = {"cached_tokens": job.seq.cached_tokens}
        return usage

    def token_chunk(self, job: Job) -> bytes:
        return _sse({**self._base(job), "choices": [self._choice(job, TOKEN_TEXT, None)]})

    def role_chunk(self, job: Job) -> bytes:
        choice = {
            "index": 0,
            "delta": {"role": "assistant", "content": ""},
            "logprobs": None,
            "finish_reason": None,
        }
        return _sse({**self._base(job), "choices": [choice]})

    def _final_chunks(self, job: Job) -> bytes:
        out = _sse({**self._base(job), "choices": [self._choice(job, TOKEN_TEXT, "length")]})
        if job.include_usage:
            out += _sse({**self._base(job), "choices": [], "usage": self._usage(job)})
        return out + _chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n"

    def _full_body(self, job: Job) -> dict:
        text = TOKEN_TEXT * job.emitted
        if job.chat:
            choice = {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "logprobs": None,
                "finish_reason": "length",
            }
            obj = "chat.completion"
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": "length"}
            obj = "text_completion"
        return {**self._base(job), "object": obj, "choices": [choice], "usage": self._usage(job)}

    def metrics_text(self) -> str:
        e = self.engine
        name = self.model_name
        lab = f'{{model_name="{name}"}}'
        lines = [
            "# HELP vllm:num_requests_running Number of requests in model execution batches (simulated).",
            "# TYPE vllm:num_requests_running gauge",
            f"vllm:num_requests_running{lab} {e.num_running}",
            "# HELP vllm:num_requests_waiting Number of requests waiting to be processed (simulated).",
            "# TYPE vllm:num_requests_waiting gauge",
            f"vllm:num_requests_waiting{lab} {e.num_waiting}",
            "# HELP vllm:gpu_cache_usage_perc KV-cache usage. 1 means 100 percent usage (simulated).",
            "# TYPE vllm:gpu_cache_usage_perc gauge",
            f"vllm:gpu_cache_usage_perc{lab} {e.kv_usage:.6f}",
            "# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage (simulated).",
            "# TYPE vllm:kv_cache_usage_perc gauge",
            f"vllm:kv_cache_usage_perc{lab} {e.kv_usage:.6f}",
            "# HELP vllm:prompt_tokens_total Number of prefill tokens processed (simulated).",
            "# TYPE vllm:prompt_tokens_total counter",
            f"vllm:prompt_tokens_total{lab} {e.prompt_tokens_total}",
            "# HELP vllm:generation_tokens_total Number of generation tokens processed (simulated).",
            "# TYPE vllm:generation_tokens_total counter",
            f"vllm:generation_tokens_total{lab} {e.generation_tokens_total}",
            "# HELP vllm:num_preemptions_total Cumulative number of preemptions (simulated).",
            "# TYPE vllm:num_preemptions_total counter",
            f"vllm:num_preemptions_total{lab} {e.num_preemptions}",
            "# HELP vllm:prefix_cache_queries_total Prompt tokens looked up in the prefix cache (simulated).",
            "# TYPE vllm:prefix_cache_queries_total counter",
            f"vllm:prefix_cache_queries_total{lab} {e.cache_queries}",
            "# HELP vllm:prefix_cache_hits_total Prompt tokens served from the prefix cache (simulated).",
            "# TYPE vllm:prefix_cache_hits_total counter",
            f"vllm:prefix_cache_hits_total{lab} {e.cache_hits}",
            "# HELP tokenbench_sim_emission_lateness_seconds Worst |emission - simulated time| in the last step.",
            "# TYPE tokenbench_sim_emission_lateness_seconds gauge",
            f"tokenbench_sim_emission_lateness_seconds{lab} {self.last_lateness_s:.6f}",
            "# HELP tokenbench_sim_emission_lateness_max_seconds Worst |emission - simulated time| so far.",
            "# TYPE tokenbench_sim_emission_lateness_max_seconds gauge",
            f"tokenbench_sim_emission_lateness_max_seconds{lab} {self.max_lateness_s:.6f}",
            "# HELP tokenbench_sim_late_steps_total Steps with a token more than 1 ms off schedule.",
            "# TYPE tokenbench_sim_late_steps_total counter",
            f"tokenbench_sim_late_steps_total{lab} {self.late_emissions}",
            "# HELP tokenbench_sim_behind_schedule 1 when the last step was more than 1 ms late.",
            "# TYPE tokenbench_sim_behind_schedule gauge",
            f"tokenbench_sim_behind_schedule{lab} {int(self.last_lateness_s > LATE_S)}",
            "# HELP tokenbench_sim_wakeup_lateness_max_seconds Worst lateness of a step's first write against its planned start.",
            "# TYPE tokenbench_sim_wakeup_lateness_max_seconds gauge",
            f"tokenbench_sim_wakeup_lateness_max_seconds{lab} {self.start_late_max_s:.6f}",
            "# HELP tokenbench_sim_write_max_seconds Worst time spent writing one step's tokens.",
            "# TYPE tokenbench_sim_write_max_seconds gauge",
            f"tokenbench_sim_write_max_seconds{lab} {self.write_max_s:.6f}",
            "# HELP tokenbench_sim_steps_total Engine iterations run.",
            "# TYPE tokenbench_sim_steps_total counter",
            f"tokenbench_sim_steps_total{lab} {self.steps}",
        ]
        return "\n".join(lines + self._spec_decode_lines(lab)) + "\n"

    def _spec_decode_lines(self, lab: str) -> list[str]:
        """vLLM's spec-decode counters, when MTP is on (vLLM has none without a draft)."""
        dep = self.engine.dep
        d = int(dep.eff.mtp_tokens)
        if not d:
            return []
        drafts = self.spec_drafts
        per_pos = [drafts * p for p in dep.mtp_positions]
        return [
            "# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts (simulated).",
            "# TYPE vllm:spec_decode_num_drafts_total counter",
            f"vllm:spec_decode_num_drafts_total{lab} {drafts:.6f}",
            "# HELP vllm:spec_decode_num_draft_tokens_total Number of draft tokens (simulated).",
            "# TYPE vllm:spec_decode_num_draft_tokens_total counter",
            f"vllm:spec_decode_num_draft_tokens_total{lab} {drafts * d:.6f}",
            "# HELP vllm:spec_decode_num_accepted_tokens_total Number of accepted tokens (simulated).",
            "# TYPE vllm:spec_decode_num_accepted_tokens_total counter",
            f"vllm:spec_decode_num_accepted_tokens_total{lab} {sum(per_pos):.6f}",
            "# HELP vllm:spec_decode_num_accepted_tokens_per_pos_total Accepted tokens per draft position (simulated).",
            "# TYPE vllm:spec_decode_num_accepted_tokens_per_pos_total counter",
            *(
                f'vllm:spec_decode_num_accepted_tokens_per_pos_total{lab[:-1]},position="{i}"}} {n:.6f}'
                for i, n in enumerate(per_pos)
            ),
        ]


class HTTPProtocol(asyncio.Protocol):
    """Minimal HTTP/1.1 with keep-alive: one request at a time per connection."""

    def __init__(self, sim: SimServer) -> None:
        self.sim = sim
        self.buf = bytearray()
        self.transport: asyncio.Transport | None = None
        self.job: Job | None = None
        self.keep_alive = True
        self.busy = False  # a response being computed off the loop (the saturation rate)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.sim.connections.add(transport)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.transport is not None:
            self.sim.connections.discard(self.transport)
        if self.job is not None:
            self.sim.abort(self.job)
        self.transport = None

    def data_received(self, data: bytes) -> None:
        self.buf += data
        if self.job is None and not self.busy:
            self._try_parse()

    def write(self, data: bytes) -> None:
        if self.transport is not None:
            self.transport.write(data)

    def finish_response(self) -> None:
        self.job = None
        if not self.keep_alive and self.transport is not None:
            self.transport.close()
        elif self.buf:
            self._try_parse()

    def send_json(self, status: int, obj: dict, reason: str = "OK") -> None:
        body = json.dumps(obj, separators=(",", ":")).encode()
        self._send(status, reason, b"application/json", body)

    def _send(self, status: int, reason: str, ctype: bytes, body: bytes) -> None:
        head = b"HTTP/1.1 %d %s\r\ncontent-type: %s\r\ncontent-length: %d\r\n%s\r\n" % (
            status,
            reason.encode(),
            ctype,
            len(body),
            b"" if self.keep_alive else b"connection: close\r\n",
        )
        self.write(head + body)

    def _error(self, status: int, msg: str) -> None:
        reason = {
            400: "Bad Request",
            404: "Not Found",
            405: "Method Not Allowed",
            413: "Payload Too Large",
        }
        err = {"object": "error", "message": msg, "type": "BadRequestError", "code": status}
        self.send_json(status, err, reason.get(status, "Error"))
        self.finish_response()

    def _try_parse(self) -> None:
        end = self.buf.find(b"\r\n\r\n")
        if end < 0:
            if len(self.buf) > MAX_HEADER:
                self.keep_alive = False
                self._error(413, "request headers too large")
            return
        head = bytes(self.buf[:end]).decode("latin-1").split("\r\n")
        try:
            method, target, version = head[0].split(" ", 2)
        except ValueError:
            self.keep_alive = False
            self._error(400, "malformed request line")
            return
        headers = {}
        for line in head[1:]:
            k, _, v = line.partition(":")
            headers[k.strip().lower()] = v.strip()
        length = int(headers.get("content-length", "0") or 0)
        if length > MAX_BODY:
            self.keep_alive = False
            self._error(413, "request body too large")
            return
        if len(self.buf) < end + 4 + length:
            return
        body = bytes(self.buf[end + 4 : end + 4 + length])
        del self.buf[: end + 4 + length]
        self.keep_alive = headers.get("connection", "").lower() != "close" and version == "HTTP/1.1"
        self._dispatch(method, target.split("?", 1)[0], body)

    def _dispatch(self, method: str, path: str, body: bytes) -> None:
        sim = self.sim
        if method == "GET" and path == MODELS_PATH:
            model = {
                "id": sim.model_name,
                "object": "model",
                "created": sim.created,
                "owned_by": "tokenbench-simulated",
                "tokenbench_simulated": sim.hardware(),
            }
            self.send_json(200, {"object": "list", "data": [model]})
            return self.finish_response()
        if method == "GET" and path == METRICS_PATHS[0]:
            self._send(200, "OK", b"text/plain; version=0.0.4", sim.metrics_text().encode())
            return self.finish_response()
        if method == "POST" and path == SATURATION_PATH:
            return self._saturation(body)
        if method == "GET" and path in ("/health", "/"):
            self._send(200, "OK", b"text/plain", b"ok (simulated)\n")
            return self.finish_response()
        if path in ENDPOINTS:
            if method != "POST":
                return self._error(405, f"{path} takes POST")
            try:
                self._start_job(path.endswith("chat/completions"), body)
            except BadRequest as exc:
                self._error(400, str(exc))
            except ValueError as exc:  # engine refused: too long for the context or the cache
                self._error(400, str(exc))
            return None
        return self._error(404, f"no route {method} {path}")

    def _saturation(self, raw: bytes) -> None:
        """The request rate this endpoint's deployment saturates at for a workload's mean
        lengths ({"input_len", "output_len"}), so a run measured through it can flag the points
        near saturation as `sim run` does. Computed in a thread on a fresh engine of the same
        deployment (a closed loop in virtual time): the live engine and the loop's token
        schedule are not touched. A disaggregated deployment answers null."""
        from bench.sim.error_bars import saturation_rate

        try:
            body = json.loads(raw or b"{}")
            isl, osl = float(body["input_len"]), float(body["output_len"])
            if not (isl >= 1 and osl >= 1):
                raise ValueError
        except (ValueError, KeyError, TypeError):
            return self._error(400, 'saturation takes {"input_len": >= 1, "output_len": >= 1}')
        eng = self.sim.engine
        if not isinstance(eng, Engine):  # a disaggregated pair has no one slot limit
            self.send_json(200, {"saturation_requests_per_s": None})
            return self.finish_response()
        self.busy = True
        work = asyncio.get_running_loop().run_in_executor(
            None, saturation_rate, Engine(eng.dep, eng.cfg), isl, osl
        )
        work.add_done_callback(self._saturation_done)
        return None

    def _saturation_done(self, work: asyncio.Future) -> None:
        self.busy = False
        if work.exception() is not None:
            return self._error(500, f"saturation failed: {work.exception()}")
        self.send_json(200, {"saturation_requests_per_s": work.result()})
        return self.finish_response()

    def _start_job(self, chat: bool, raw: bytes) -> None:
        sim = self.sim
        try:
            body = json.loads(raw or b"{}")
        except json.JSONDecodeError as exc:
            raise BadRequest(f"body is not valid JSON: {exc}") from exc
        if not isinstance(body, dict):
            raise BadRequest("body must be a JSON object")
        if body.get("n", 1) != 1:
            raise BadRequest("only n=1 is supported by the simulator")
        tokens = prompt_tokens(body, chat)
        prompt = max(len(tokens), 1)
        limit = body.get("max_completion_tokens", body.get("max_tokens"))
        if limit is None:
            limit = sim.default_max_tokens if chat else 16
        if not isinstance(limit, int) or limit < 1:
            raise BadRequest("max_tokens must be a positive integer")
        min_tokens = body.get("min_tokens", 0) or 0
        if not isinstance(min_tokens, int) or min_tokens > limit:
            raise BadRequest("min_tokens must be an integer no larger than max_tokens")
        opts = body.get("stream_options") or {}
        job = Job(
            proto=self,
            rid=("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24],
            created=int(time.time()),
            chat=chat,
            stream=bool(body.get("stream", False)),
            include_usage=bool(opts.get("include_usage", False)),
            prompt_tokens=prompt,
            max_tokens=limit,
            model=str(body.get("model") or sim.model_name),
            keys=sim.engine.cache.keys(tokens) if sim.engine.cache is not None else None,
        )
        sim.submit(job)  # may raise ValueError before anything is written
        self.job = job
        if job.stream:
            job.chunk = sim.token_chunk(job)
            head = (
                b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream; charset=utf-8\r\ncache-control: no-cache\r\ntransfer-encoding: chunked\r\n%s\r\n"
                % (b"" if self.keep_alive else b"connection: close\r\n")
            )
            self.write(head + (sim.role_chunk(job) if chat else b""))


def _new_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop

        return uvloop.new_event_loop()
    except ImportError:  # pragma: no cover - uvloop is a dependency off Windows
        return asyncio.new_event_loop()


async def serve(
    engine: Engine,
    model_name: str,
    host: str = "127.0.0.1",
    port: int = 8100,
    default_max_tokens: int = 256,
    ready: Callable[[int], None] | None = None,
    stop: asyncio.Event | None = None,
    calibration: dict | None = None,
) -> None:
    """Serve until `stop` is set (or forever). `ready(port)` is called once listening.

    Binds before anything else starts, so a busy port raises OSError with nothing to undo.
    """
    sim = SimServer(engine, model_name, default_max_tokens, calibration)
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: HTTPProtocol(sim), host, port, backlog=1024)
    sim.start()
    bound = server.sockets[0].getsockname()[1]
    log.info("simulated %s listening on http://%s:%d", engine.label, host, bound)
    if ready:
        ready(bound)
    try:
        if stop is None:
            await asyncio.Event().wait()
        else:
            await stop.wait()
    finally:
        server.close()
        await sim.stop()
        await server.wait_closed()


def run_server(
    engine: Engine,
    model_name: str,
    host: str,
    port: int,
    default_max_tokens: int = 256,
    ready: Callable[[int], None] | None = None,
    calibration: dict | None = None,
) -> None:
    """Blocking entry point for `tokenbench sim serve`. Ctrl-C or SIGTERM stop it cleanly:
    the listener and every connection are closed and every task is finished before the loop
    closes. Raises OSError when the address cannot be bound (a busy port)."""
    loop = _new_loop()
    asyncio.set_event_loop(loop)

    async def main() -> None:
        stop = asyncio.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                loop.add_signal_handler(sig, stop.set)
        await serve(engine, model_name, host, port, default_max_tokens, ready, stop, calibration)

    try:
        loop.run_until_complete(main())
    finally:
        pending = [t for t in asyncio.all_tasks(loop) if not t.done()]
        for task in pending:
            task.cancel()
        if pending:
            loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
        loop.run_until_complete(loop.shutdown_asyncgens())
        asyncio.set_event_loop(None)
        loop.close()


def start_sim_server_in_thread(
    gpu: str,
    model: str,
    precision: str = "fp8",
    tp: int = 1,
    port: int = 0,
    max_num_seqs: int | None = None,
    max_num_batched_tokens: int | None = None,
    default_max_tokens: int = 256,
    engine: Engine | None = None,
) -> tuple[str, Callable[[], None]]:
    """Start a simulated endpoint on 127.0.0.1 in a background thread (serving `engine` when
    given, e.g. a disaggregated one, else one built from the other arguments).

    Returns (base URL such as "http://127.0.0.1:PORT", stop function). For the demo and tests.
    """
    if engine is None:
        engine = build_engine(gpu, model, precision, tp, max_num_seqs, max_num_batched_tokens)
    model_name = engine.dep.model.name
    loop = _new_loop()
    started = threading.Event()
    box: dict[str, object] = {}

    def ready(bound: int) -> None:
        box["port"] = bound
        started.set()

    async def main() -> None:
        stop = asyncio.Event()
        box["stop"] = stop
        await serve(engine, model_name, "127.0.0.1", port, default_max_tokens, ready, stop)

    def runner() -> None:
        asyncio.set_event_loop(loop)
        try:
            loop.run_until_complete(main())
        except BaseException as exc:  # surface start-up failures to the caller
            box["error"] = exc
            started.set()
        finally:
            loop.close()

    thread = threading.Thread(target=runner, name=f"sim-{gpu}-{model}", daemon=True)
    thread.start()
    if not started.wait(10) or "error" in box:
        raise RuntimeError(f"simulated server did not start: {box.get('error')}")

    def stop_fn() -> None:
        stop_event = box["stop"]
        if loop.is_running():
            loop.call_soon_threadsafe(stop_event.set)  # type: ignore[attr-defined]
        thread.join(10)

    return f"http://127.0.0.1:{box['port']}", stop_fn
