"""A deterministic, fault-injecting OpenAI-compatible streaming server for tests.

Run it as `python tests/fake_openai_server.py --port 0 --ttft-ms 50 --itl-ms 10`; it prints
`PORT <n>` once listening. Every response streams one token per SSE event at exactly
t_request + ttft + i * itl on the server's clock (timers on an asyncio loop, raw protocol,
so it costs little CPU per token). Faults are injected by request number, counted in arrival
order from 1: `--fault 5:http_500` fails every 5th request, so the count of each error in a
run of N requests is exact. Fault kinds:

  http_500 http_429 http_400   an HTTP error with a JSON body
  reset_before                 close the connection without any response
  reset_mid                    stream 3 tokens, then reset the connection
  malformed                    stream 2 tokens, then an event that is not JSON, then finish
  stream_error                 stream 2 tokens, then an OpenAI error object, then [DONE]
  stall                        stream 2 tokens, then send nothing more (client must time out)
  no_done                      stream every token, then close without data: [DONE]
  noisy                        not a failure: comments, keep-alives, role-only and empty
                               deltas, CRLF line ends, usage in a separate final chunk
  usage_string usage_negative usage_huge
                               usage.completion_tokens "16", -5 or 1e30
  deep_json                    stream 2 tokens, then an event nested 200,000 deep
  bad_chunk_size               stream 2 tokens, then a chunk whose size is not hex
  bad_chunk_crlf               stream 2 tokens, then a chunk not followed by CRLF
  bad_length                   a 400 whose Content-Length is not a number
  redirect                     302 to another path
  gzip_reply                   200 with a gzip-compressed body
  json_reply                   200 with one plain JSON completion (stream ignored)
  huge_tiny                    not a failure: 1.7 MB of SSE comments in 1-byte chunks
                               (10 MB on the wire) before the first token
  close_reused                 a request that is not its connection's first: the
                               connection closes without a response (a stale keep-alive
                               the client could not see); the resend is served normally

Connection behaviour (`--connection`): `keep` (default); `eof`: close after every response
while promising keep-alive, as llama-server does; `close`: send `Connection: close` and then
ignore further requests on that connection; `http10`: answer HTTP/1.0 without keep-alive and
ignore further requests. `--tiny-chunks` sends every body byte as its own 1-byte chunk.
GET /stats answers {"requests": N, "finished": M}: completion requests received, and
streams whose last token was sent.

`--sends-log PATH` writes, at exit, the server's own send time of every token (ns since the
request's arrival) so benchmarks can compare a client's figures against the truth.
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import json
import signal
import sys
import time

PROMPT_TOKENS_FALLBACK = 1


class Config:
    def __init__(self, args: argparse.Namespace) -> None:
        self.ttft_s = args.ttft_ms / 1000
        self.itl_s = args.itl_ms / 1000
        self.faults: list[tuple[int, str]] = []
        for item in args.fault or []:
            every, _, kind = item.partition(":")
            self.faults.append((int(every), kind))
        self.chunked = not args.no_chunked
        self.sends_log = args.sends_log
        self.usage = not args.no_usage
        self.count = 0
        self.finished = 0  # streams whose last token was sent
        self.reset_body: bytes | None = None
        self.connection = args.connection
        self.tiny_chunks = args.tiny_chunks
        self.sends: list[list[int]] = []
        # --spec-decode K:A,B,..: a vLLM-style draft of K tokens per verify step, of which
        # A, then B, ... (cycling) are accepted; counted per finished stream, served on
        # /metrics under vLLM's names, so a test knows the counters' truth.
        self.spec: tuple[int, list[int]] | None = None
        if args.spec_decode:
            k, _, pattern = args.spec_decode.partition(":")
            self.spec = (int(k), [int(x) for x in pattern.split(",")])
        self.spec_step = 0
        self.spec_counts = {"drafts": 0, "draft_tokens": 0, "accepted": 0}
        self.spec_per_pos = [0] * (self.spec[0] if self.spec else 0)

    def count_spec(self, n_out: int) -> None:
        """The verify steps that produced n_out tokens (the first token is the prefill's)."""
        if self.spec is None:
            return
        k, pattern = self.spec
        left = n_out - 1
        while left > 0:
            acc = pattern[self.spec_step % len(pattern)]
            self.spec_step += 1
            self.spec_counts["drafts"] += 1
            self.spec_counts["draft_tokens"] += k
            self.spec_counts["accepted"] += acc
            for i in range(acc):
                self.spec_per_pos[i] += 1
            left -= acc + 1

    def metrics_text(self) -> str:
        c, lab = self.spec_counts, '{model_name="fake-model",engine="0"}'
        lines = [
            f"vllm:spec_decode_num_drafts_total{lab} {c['drafts']}",
            f"vllm:spec_decode_num_draft_tokens_total{lab} {c['draft_tokens']}",
            f"vllm:spec_decode_num_accepted_tokens_total{lab} {c['accepted']}",
        ]
        lines += [
            f'vllm:spec_decode_num_accepted_tokens_per_pos_total{lab[:-1]},position="{i}"}} {n}'
            for i, n in enumerate(self.spec_per_pos)
        ]
        return "\n".join(lines) + "\n"

    def fault_for(self, n: int) -> str | None:
        for every, kind in self.faults:
            if n % every == 0:
                return kind
        return None


class Handler(asyncio.Protocol):
    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        self.buf = b""
        self.transport: asyncio.Transport | None = None
        self.timers: list[asyncio.TimerHandle] = []
        self.busy = False
        self.served = 0  # responses begun on this connection
        self.held: list[str] | None = None  # HTTP/1.0: the head and events, sent at the end

    def connection_made(self, transport) -> None:
        self.transport = transport

    def connection_lost(self, exc) -> None:
        for t in self.timers:
            t.cancel()
        self.timers.clear()

    def data_received(self, data: bytes) -> None:
        arrived = time.perf_counter_ns()
        self.buf += data
        while not self.busy:
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                return
            head = self.buf[:end].decode("latin-1").split("\r\n")
            length = 0
            for line in head[1:]:
                name, _, value = line.partition(":")
                if name.strip().lower() == "content-length":
                    length = int(value.strip())
            if len(self.buf) < end + 4 + length:
                return
            body = self.buf[end + 4 : end + 4 + length]
            self.buf = self.buf[end + 4 + length :]
            method, path, _ = head[0].split(" ", 2)
            if self.served and self.cfg.connection in ("close", "http10"):
                continue  # it said it would close: a client that reuses it waits forever
            self.served += 1
            self.handle(method, path, body, arrived)

    # ------------------------------------------------------------ routing
    def handle(self, method: str, path: str, body: bytes, arrived: int) -> None:
        if method == "GET" and path == "/stats":  # the tests' view of what the server did
            self.send_json(200, {"requests": self.cfg.count, "finished": self.cfg.finished})
            return
        if method == "GET" and path == "/metrics" and self.cfg.spec is not None:
            body = self.cfg.metrics_text().encode()
            head = f"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: {len(body)}\r\n\r\n"
            self.transport.write(head.encode() + body)
            return
        if method == "GET" and path in ("/v1/models", "/health"):
            payload = {"object": "list", "data": [{"id": "fake-model", "object": "model"}]}
            self.send_json(200, payload)
            return
        if method != "POST" or path not in ("/v1/completions", "/v1/chat/completions"):
            self.send_json(404, {"error": {"message": f"no route {method} {path}"}})
            return
        try:
            req = json.loads(body)
        except ValueError:
            self.send_json(400, {"error": {"message": "body is not JSON"}})
            return
        if body == self.cfg.reset_body:
            # The client's one resend of a request reset on a reused connection (it cannot
            # tell that from a stale keep-alive): reset it again, not counted twice.
            self.cfg.reset_body = None
            self.abort()
            return
        if self.served > 1 and any(kind == "close_reused" for _, kind in self.cfg.faults):
            self.abort()  # never counted: as if the connection had closed before it came
            return
        self.cfg.count += 1
        fault = self.cfg.fault_for(self.cfg.count)
        if fault in ("http_500", "http_429", "http_400"):
            self.send_json(int(fault[5:]), {"error": {"message": f"injected {fault}"}})
            return
        if fault in WHOLE_REPLIES:
            self.transport.write(WHOLE_REPLIES[fault])
            return
        if fault == "reset_before":
            self.cfg.reset_body = body
            self.abort()
            return
        self.stream(req, path.endswith("chat/completions"), fault, arrived)

    def send_json(self, status: int, payload: dict) -> None:
        data = json.dumps(payload).encode()
        reason = {200: "OK", 400: "Bad Request", 404: "Not Found", 429: "Too Many Requests"}
        head = (
            f"{self.version()} {status} {reason.get(status, 'Error')}\r\n"
            f"{self.connection_header()}"
            "Content-Type: application/json\r\n"
            f"Content-Length: {len(data)}\r\n\r\n"
        )
        self.transport.write(head.encode() + data)
        if self.cfg.connection == "eof":
            self.transport.close()

    def version(self) -> str:
        return "HTTP/1.0" if self.cfg.connection == "http10" else "HTTP/1.1"

    def connection_header(self) -> str:
        return {
            "close": "Connection: close\r\n",
            "eof": "Keep-Alive: timeout=5, max=100\r\n",  # and closes all the same
        }.get(self.cfg.connection, "")

    def abort(self) -> None:
        self.transport.abort()

    # ------------------------------------------------------------ streaming
    def stream(self, req: dict, chat: bool, fault: str | None, arrived: int) -> None:
        cfg = self.cfg
        n_out = int(req.get("max_tokens") or req.get("max_completion_tokens") or 16)
        prompt = req.get("prompt") if not chat else req.get("messages")
        prompt_tokens = _count_prompt(prompt)
        include_usage = cfg.usage and bool((req.get("stream_options") or {}).get("include_usage"))
        self.busy = True
        head = f"{self.version()} 200 OK\r\nContent-Type: text/event-stream\r\n"
        head += f"Cache-Control: no-cache\r\n{self.connection_header()}"
        if cfg.connection == "http10":
            # HTTP/1.0 has no chunks: the body is held and sent whole with its length, and
            # the connection stays open (a client that reuses it is never answered).
            self.held = [head]
        else:
            head += (
                "Transfer-Encoding: chunked\r\n\r\n" if cfg.chunked else "Connection: close\r\n\r\n"
            )
            self.transport.write(head.encode())
        if fault == "huge_tiny":
            self.transport.write(_huge_tiny())
        loop = asyncio.get_running_loop()
        t_arrive = loop.time() - (time.perf_counter_ns() - arrived) / 1e9
        sends: list[int] = []
        cfg.sends.append(sends)
        eol = "\r\n" if fault == "noisy" else "\n"
        if fault == "noisy":
            self.write_event(": keep-alive comment\r\n\r\n")
            if chat:
                self.write_event(_chat_chunk({"role": "assistant", "content": ""}) + eol)
        elif chat:
            self.write_event(_chat_chunk({"role": "assistant"}))
        cut = {"reset_mid": 3, "malformed": 2, "stream_error": 2, "stall": 2, "deep_json": 2,
               "bad_chunk_size": 2, "bad_chunk_crlf": 2}.get(fault, n_out)  # fmt: skip
        emitted = min(cut, n_out)
        end = (fault, include_usage, prompt_tokens, n_out, chat, eol)
        for i in range(emitted):
            at = t_arrive + cfg.ttft_s + i * cfg.itl_s
            # The stream's end is written by the last token's own callback, right after it:
            # a separate timer for the end could run first.
            then = end if i == emitted - 1 else None
            self.timers.append(
                loop.call_at(
                    at, self.emit_token, i, i == n_out - 1, chat, eol, sends, arrived, then
                )
            )

    def write_event(self, text: str) -> None:
        data = text.encode()
        if self.held is not None:
            self.held.append(text)
        elif not self.cfg.chunked:
            self.transport.write(data)
        elif self.cfg.tiny_chunks:  # one write, one 1-byte chunk per byte
            self.transport.write(b"".join(b"1\r\n%c\r\n" % byte for byte in data))
        else:
            self.transport.write(b"%x\r\n%s\r\n" % (len(data), data))

    def emit_token(
        self, i: int, last: bool, chat: bool, eol: str, sends: list, arrived: int, then=None
    ) -> None:
        if self.transport is None or self.transport.is_closing():
            return
        finish = "length" if last else None
        if chat:
            event = _chat_chunk({"content": f"tok{i} "}, finish)
        else:
            event = _text_chunk(f"tok{i} ", finish)
        if eol == "\r\n":
            event = event.replace("\n\n", "\r\n\r\n")
        self.write_event(event)
        sends.append(time.perf_counter_ns() - arrived)
        if then is not None:
            self.finish(*then)

    def finish(self, fault, include_usage, prompt_tokens, n_out, chat, eol) -> None:
        if self.transport is None or self.transport.is_closing():
            return
        self.cfg.finished += 1
        self.cfg.count_spec(n_out)
        if fault == "reset_mid":
            self.abort()
            return
        if fault == "stall":
            return
        if fault == "deep_json":
            self.write_event("data: " + "[" * 200_000 + "]" * 200_000 + "\n\n")
        if fault == "bad_chunk_size":
            self.transport.write(b"zz\r\ndata: [DONE]\n\n\r\n0\r\n\r\n")
            return
        if fault == "bad_chunk_crlf":
            self.transport.write(b"5\r\nhelloXX0\r\n\r\n")
            return
        if fault == "malformed":
            self.write_event("data: {not json\n\n")
        if fault == "stream_error":
            self.write_event(
                'data: {"error": {"message": "injected stream error", "code": 500}}\n\n'
            )
        if fault == "noisy" and chat:
            self.write_event(_chat_chunk({}, None) + eol)  # an empty delta
        if include_usage:
            completion = {"usage_string": str(n_out), "usage_negative": -5, "usage_huge": 1e30}
            usage = {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion.get(fault, n_out),
                "total_tokens": prompt_tokens + n_out,
            }
            obj = {
                "id": "x",
                "object": "chat.completion.chunk" if chat else "text_completion",
                "choices": [],
                "usage": usage,
            }
            event = f"data: {json.dumps(obj)}\n\n"
            if fault == "noisy":
                event = event.replace("\n\n", "\r\n\r\n")
            self.write_event(event)
        if fault != "no_done":
            self.write_event("data: [DONE]\n\n")
        if self.held is not None:
            head, body = self.held[0], "".join(self.held[1:]).encode()
            self.held = None
            self.transport.write(f"{head}Content-Length: {len(body)}\r\n\r\n".encode() + body)
        elif self.cfg.chunked:
            self.transport.write(b"0\r\n\r\n")
            if self.cfg.connection == "eof":
                self.transport.close()
                return
            self.busy = False
            self.timers.clear()
            if self.buf:
                self.data_received(b"")
        else:
            self.transport.close()


_HUGE_TINY: list[bytes] = []


def _huge_tiny() -> bytes:
    """1.7 MB of SSE comments, every byte its own chunk; built once (it costs ~1 s)."""
    if not _HUGE_TINY:
        data = b": " + b"p" * 60 + b"\n\n"
        data *= 1_700_000 // len(data)
        _HUGE_TINY.append(b"".join(b"1\r\n%c\r\n" % byte for byte in data))
    return _HUGE_TINY[0]


def _whole(status: str, headers: str, body: bytes) -> bytes:
    return f"HTTP/1.1 {status}\r\n{headers}Content-Length: {len(body)}\r\n\r\n".encode() + body


_COMPLETION = json.dumps(
    {"id": "cmpl-x", "object": "text_completion", "model": "fake-model",
     "choices": [{"index": 0, "text": "tok0 tok1", "finish_reason": "length"}],
     "usage": {"prompt_tokens": 4, "completion_tokens": 2, "total_tokens": 6}}
).encode()  # fmt: skip
# Whole responses written at once, for the faults that are one bad reply.
WHOLE_REPLIES = {
    "redirect": _whole("302 Found", "Location: /elsewhere/v1/completions\r\n", b""),
    "gzip_reply": _whole(
        "200 OK", "Content-Type: text/event-stream\r\nContent-Encoding: gzip\r\n",
        gzip.compress(b'data: {"choices": [{"text": "x"}]}\n\ndata: [DONE]\n\n'),
    ),
    "json_reply": _whole("200 OK", "Content-Type: application/json\r\n", _COMPLETION),
    "bad_length": b"HTTP/1.1 400 Bad Request\r\nContent-Length: ten\r\n\r\n{}",
}  # fmt: skip


def _text_chunk(text: str, finish: str | None) -> str:
    obj = {
        "id": "cmpl-x",
        "object": "text_completion",
        "model": "fake-model",
        "choices": [{"index": 0, "text": text, "finish_reason": finish}],
    }
    return f"data: {json.dumps(obj)}\n\n"


def _chat_chunk(delta: dict, finish: str | None = None) -> str:
    obj = {
        "id": "chatcmpl-x",
        "object": "chat.completion.chunk",
        "model": "fake-model",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }
    return f"data: {json.dumps(obj)}\n\n"


def _count_prompt(prompt) -> int:
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], int):
        return len(prompt)
    if isinstance(prompt, list):
        return sum(len(str(m.get("content", "")).split()) for m in prompt) or PROMPT_TOKENS_FALLBACK
    return len(str(prompt or "").split()) or PROMPT_TOKENS_FALLBACK


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--ttft-ms", type=float, default=50.0)
    p.add_argument("--itl-ms", type=float, default=10.0)
    p.add_argument("--fault", action="append", help="EVERY:KIND, e.g. 5:http_500")
    p.add_argument("--no-chunked", action="store_true", help="close-delimited bodies")
    p.add_argument("--no-usage", action="store_true", help="never send a usage chunk")
    p.add_argument("--sends-log", help="write per-token send times (JSON) here at exit")
    p.add_argument("--connection", choices=("keep", "eof", "close", "http10"), default="keep")
    p.add_argument("--tiny-chunks", action="store_true", help="1-byte HTTP chunks")
    p.add_argument("--tls-cert", help="serve HTTPS with this PEM certificate (and --tls-key)")
    p.add_argument("--tls-key")
    p.add_argument("--spec-decode", help="K:A,B,..: vLLM spec-decode counters on /metrics")
    args = p.parse_args(argv)
    context = None
    if args.tls_cert:
        import ssl

        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(args.tls_cert, args.tls_key)
    cfg = Config(args)
    if any(kind == "huge_tiny" for _, kind in cfg.faults):
        _huge_tiny()  # built before listening, not on the loop while it times others
    try:
        import uvloop

        loop = uvloop.new_event_loop()
    except ImportError:
        loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    server = loop.run_until_complete(
        loop.create_server(lambda: Handler(cfg), args.host, args.port, backlog=4096, ssl=context)
    )
    port = server.sockets[0].getsockname()[1]
    print(f"PORT {port}", flush=True)
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    loop.run_until_complete(stop.wait())
    server.close()
    if cfg.sends_log:
        with open(cfg.sends_log, "w") as f:
            json.dump(cfg.sends, f)
    sys.exit(0)


if __name__ == "__main__":
    main()
