// The cheapest OpenAI-compatible streaming server we could write, for benchmarks/workers.py.
//
// Why: that benchmark asks how much load one vs two client processes sustain on a 2-core
// machine, with the server on the same machine. In a real run the server is a remote GPU
// box and costs the client's host nothing; here every microsecond the server spends per
// token is taken from the clients. So this server writes `--tokens-per-write` SSE events
// (one token each, as vLLM sends them) in one socket write, every `--itl-ms`, for all
// streams from one timer: its CPU per token is a fraction of the client's, and the client
// still parses one SSE event per token.
//
//   node benchmarks/workers_server.js --port 0 --ttft-ms 20 --itl-ms 10 --tokens-per-write 4
//   prints "PORT <n>" once listening; exits when its stdin closes or on SIGTERM.
//   POST /v1/completions, /v1/chat/completions  stream max_tokens tokens, then usage, [DONE]
//   anything else                                 404

"use strict";
const net = require("net");

function arg(name, fallback) {
  const i = process.argv.indexOf(name);
  return i >= 0 ? Number(process.argv[i + 1]) : fallback;
}
const PORT = arg("--port", 0);
const TTFT_MS = arg("--ttft-ms", 20);
const ITL_MS = arg("--itl-ms", 10);
const PER_WRITE = Math.max(1, arg("--tokens-per-write", 4));

function frame(text) {
  const body = Buffer.from(text);
  return Buffer.concat([Buffer.from(body.length.toString(16) + "\r\n"), body, Buffer.from("\r\n")]);
}
const TEXT_EVENT =
  'data: {"id":"cmpl-b","object":"text_completion","model":"bench-model",' +
  '"choices":[{"index":0,"text":"tok ","finish_reason":null}]}\n\n';
const CHAT_EVENT =
  'data: {"id":"chatcmpl-b","object":"chat.completion.chunk","model":"bench-model",' +
  '"choices":[{"index":0,"delta":{"content":"tok "},"finish_reason":null}]}\n\n';
const HEAD = Buffer.from(
  "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n" +
    "Transfer-Encoding: chunked\r\n\r\n"
);
const frames = new Map(); // (chat, k) -> one chunked frame holding k events
function eventsFrame(chat, k) {
  const key = (chat ? "c" : "t") + k;
  let f = frames.get(key);
  if (!f) {
    f = frame((chat ? CHAT_EVENT : TEXT_EVENT).repeat(k));
    frames.set(key, f);
  }
  return f;
}
function tail(chat, n) {
  const usage = { prompt_tokens: 16, completion_tokens: n, total_tokens: 16 + n };
  const obj = { id: "x", object: chat ? "chat.completion.chunk" : "text_completion", choices: [], usage };
  return Buffer.concat([frame("data: " + JSON.stringify(obj) + "\n\ndata: [DONE]\n\n"), Buffer.from("0\r\n\r\n")]);
}

const streams = new Set(); // {sock, chat, left, n}

function writeDue(s) {
  if (s.sock.destroyed) {
    streams.delete(s);
    return;
  }
  const k = Math.min(PER_WRITE, s.left);
  s.left -= k;
  if (s.left > 0) {
    s.sock.write(eventsFrame(s.chat, k));
  } else {
    s.sock.write(Buffer.concat([eventsFrame(s.chat, k), tail(s.chat, s.n)]));
    streams.delete(s);
    s.conn.busy = false;
    s.conn.parse();
  }
}
function tick() {
  for (const s of streams) writeDue(s);
}
setInterval(tick, ITL_MS);

class Conn {
  constructor(sock) {
    this.sock = sock;
    this.buf = Buffer.alloc(0);
    this.busy = false;
    sock.setNoDelay(true);
    sock.on("data", (d) => {
      this.buf = this.buf.length ? Buffer.concat([this.buf, d]) : d;
      this.parse();
    });
    sock.on("error", () => {});
  }
  parse() {
    while (!this.busy) {
      const end = this.buf.indexOf("\r\n\r\n");
      if (end < 0) return;
      const head = this.buf.subarray(0, end).toString("latin1");
      const m = /content-length:\s*(\d+)/i.exec(head);
      const len = m ? Number(m[1]) : 0;
      if (this.buf.length < end + 4 + len) return;
      const body = this.buf.subarray(end + 4, end + 4 + len).toString();
      this.buf = this.buf.subarray(end + 4 + len);
      const [method, path] = head.split(" ", 2);
      if (method !== "POST" || !/^\/v1\/(chat\/)?completions$/.test(path)) {
        const msg = '{"error":{"message":"not found"}}';
        this.sock.write(`HTTP/1.1 404 Not Found\r\nContent-Type: application/json\r\nContent-Length: ${msg.length}\r\n\r\n${msg}`);
        continue;
      }
      let req = {};
      try {
        req = JSON.parse(body);
      } catch (e) {}
      const n = Math.max(1, Number(req.max_tokens || req.max_completion_tokens || 16));
      const chat = path.includes("chat");
      this.busy = true;
      this.sock.write(HEAD);
      // The first write goes out at exactly TTFT; later ones on the shared ITL timer.
      setTimeout(() => {
        const s = { sock: this.sock, conn: this, chat, left: n, n };
        streams.add(s);
        writeDue(s);
      }, TTFT_MS);
    }
  }
}

const server = net.createServer((sock) => new Conn(sock));
server.listen(PORT, "127.0.0.1", () => {
  process.stdout.write(`PORT ${server.address().port}\n`);
});
process.stdin.on("end", () => process.exit(0));
process.stdin.resume();
process.on("SIGTERM", () => process.exit(0));
