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

`--sends-log PATH` writes, at exit, the server's own send time of every token (ns since the
request's arrival) so benchmarks can compare a client's figures against the truth.
"""

from __future__ import annotations

import argparse
import asyncio
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
        self.sends: list[list[int]] = []

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
            self.handle(method, path, body, arrived)

    # ------------------------------------------------------------ routing
    def handle(self, method: str, path: str, body: bytes, arrived: int) -> None:
        if method == "GET" and path == "/stats":  # the tests' view of what the server did
            self.send_json(200, {"requests": self.cfg.count, "finished": self.cfg.finished})
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
        self.cfg.count += 1
        fault = self.cfg.fault_for(self.cfg.count)
        if fault in ("http_500", "http_429", "http_400"):
            self.send_json(int(fault[5:]), {"error": {"message": f"injected {fault}"}})
            return
        if fault == "reset_before":
            self.abort()
            return
        self.stream(req, path.endswith("chat/completions"), fault, arrived)

    def send_json(self, status: int, payload: dict) -> None:
        data = json.dumps(payload).encode()
        reason = {200: "OK", 400: "Bad Request", 404: "Not Found", 429: "Too Many Requests"}
        head = (
            f"HTTP/1.1 {status} {reason.get(status, 'Error')}\r\n"
            "Content-Type: application/json\r\n"
            f"Content-Length: {len(data)}\r\n\r\n"
        )
        self.transport.write(head.encode() + data)

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
        head = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
        head += "Transfer-Encoding: chunked\r\n\r\n" if cfg.chunked else "Connection: close\r\n\r\n"
        self.transport.write(head.encode())
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
        cut = {"reset_mid": 3, "malformed": 2, "stream_error": 2, "stall": 2}.get(fault, n_out)
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
        if self.cfg.chunked:
            self.transport.write(b"%x\r\n%s\r\n" % (len(data), data))
        else:
            self.transport.write(data)

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
        if fault == "reset_mid":
            self.abort()
            return
        if fault == "stall":
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
            usage = {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": n_out,
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
        if self.cfg.chunked:
            self.transport.write(b"0\r\n\r\n")
            self.busy = False
            self.timers.clear()
            if self.buf:
                self.data_received(b"")
        else:
            self.transport.close()


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
    p.add_argument("--tls-cert", help="serve HTTPS with this PEM certificate (and --tls-key)")
    p.add_argument("--tls-key")
    args = p.parse_args(argv)
    context = None
    if args.tls_cert:
        import ssl

        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(args.tls_cert, args.tls_key)
    cfg = Config(args)
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
