// A deterministic OpenAI-compatible streaming server for benchmarks/loadgen.py.
//
// Why this shape: the client must be what the benchmark measures, so the server must cost
// less CPU per token than the client. Node's http module was measured at ~13 us of CPU per
// streamed token on this machine, as much as tokenbench spends receiving it, so this server
// speaks HTTP/1.1 itself on Node's built-in `net` sockets: one prebuilt chunked frame per
// request, one socket write per token, and one 1 ms timer for all streams (~3 us/token).
//
// Every response streams one token per SSE chunk, the first at arrival + TTFT and token i at
// arrival + TTFT + i * ITL (an absolute schedule, no drift). The server records when it
// really wrote each chunk (process.hrtime, CLOCK_MONOTONIC): that record is the truth that
// clients are compared against, and its lateness against the schedule shows when the server
// itself fell behind.
//
//   node benchmarks/stream_server.js --port 0 --ttft-ms 100 --itl-ms 10
//   prints "PORT <n>" once listening; exits when its stdin closes or on SIGTERM.
//   POST /v1/completions, /v1/chat/completions   stream (max_tokens / max_completion_tokens)
//   GET  /v1/models, /health, /v1/health         what clients probe before a run
//   POST /_truth/reset                           forget what was recorded
//   GET  /_truth                                 JSON of the streams completed since the reset:
//        ttft_ms[], itl_ms[] (all gaps), late_ms[] (per chunk, actual - scheduled),
//        tokens, streams, first_arrival_ns, last_send_ns, hist (tokens per 100 ms bucket),
//        t0_ns and first_tokens[] = [md5 of the prompt, arrival, first send] (ns since t0):
//        hrtime is CLOCK_MONOTONIC, as a Python client's perf_counter_ns on the same host,
//        so a client's own records can be matched to these, request by request.

"use strict";
const net = require("net");
const crypto = require("crypto");

function arg(name, fallback) {
  const i = process.argv.indexOf(name);
  return i >= 0 ? process.argv[i + 1] : fallback;
}
const PORT = Number(arg("--port", "0"));
const TTFT_NS = Math.round(Number(arg("--ttft-ms", "100")) * 1e6);
const ITL_NS = Math.round(Number(arg("--itl-ms", "10")) * 1e6);
const MODEL = arg("--model", "bench-model");
const BUCKET_NS = 100_000_000;
const T0 = process.hrtime.bigint(); // times are kept as Number ns since T0 (exact below 2^53)
const now = () => Number(process.hrtime.bigint() - T0);

// ---------------------------------------------------------------- truth

let truth = newTruth();
function newTruth() {
  return {
    ttft: [], itl: [], late: [], firsts: [], tokens: 0, first: null, last: 0, hist: new Map(),
  };
}

function record(s) {
  const t = truth;
  if (t.first === null || s.arrival < t.first) t.first = s.arrival;
  t.ttft.push((s.sends[0] - s.arrival) / 1e6);
  t.firsts.push([s.key, s.arrival, s.sends[0]]);
  for (let i = 0; i < s.n; i++) {
    if (i) t.itl.push((s.sends[i] - s.sends[i - 1]) / 1e6);
    t.late.push((s.sends[i] - (s.arrival + TTFT_NS + i * ITL_NS)) / 1e6);
    const b = Math.floor(s.sends[i] / BUCKET_NS);
    t.hist.set(b, (t.hist.get(b) || 0) + 1);
  }
  t.tokens += s.n;
  if (s.sends[s.n - 1] > t.last) t.last = s.sends[s.n - 1];
}

function truthJson() {
  const t = truth;
  const hist = [...t.hist.entries()].sort((a, b) => a[0] - b[0]);
  const base = hist.length ? hist[0][0] : 0;
  return JSON.stringify({
    ttft_ms: t.ttft,
    itl_ms: t.itl,
    late_ms: t.late,
    tokens: t.tokens,
    streams: t.ttft.length,
    first_arrival_ns: t.first === null ? null : (T0 + BigInt(t.first)).toString(),
    last_send_ns: (T0 + BigInt(t.last)).toString(),
    bucket_ns: BUCKET_NS,
    hist: hist.map((e) => [e[0] - base, e[1]]),
    t0_ns: T0.toString(),
    first_tokens: t.firsts,
  });
}

// ---------------------------------------------------------------- streams and the timer

const due = new Map(); // ms slot -> streams whose next chunk is due then
let clockMs = Math.floor(now() / 1e6);

function schedule(s, atNs) {
  const slot = Math.ceil(atNs / 1e6);
  let list = due.get(slot);
  if (list === undefined) due.set(slot, (list = []));
  list.push(s);
}

function tick() {
  const t = now();
  const nowMs = Math.floor(t / 1e6);
  for (; clockMs <= nowMs; clockMs++) {
    const list = due.get(clockMs);
    if (list === undefined) continue;
    due.delete(clockMs);
    for (const s of list) step(s);
  }
}
setInterval(tick, 1);

function sse(obj) {
  return "data: " + JSON.stringify(obj) + "\n\n";
}
function frame(text) {
  return Buffer.byteLength(text).toString(16) + "\r\n" + text + "\r\n";
}

function startStream(sock, conn, path, body, arrival) {
  let params = {};
  try {
    params = JSON.parse(body || "{}");
  } catch (e) {
    reply(sock, conn, 400, { error: { message: "body is not JSON" } });
    return;
  }
  const chat = path.startsWith("/v1/chat/");
  const n = Math.max(1, Number(params.max_tokens || params.max_completion_tokens || 16));
  const usage = !!(params.stream_options && params.stream_options.include_usage);
  const prompt = typeof params.prompt === "string" ? params.prompt : JSON.stringify(params.messages || "");
  const promptTokens = Math.max(1, prompt.split(" ").length);
  const id = "cmpl-" + conn.server.nextId++;
  const object = chat ? "chat.completion.chunk" : "text_completion";
  const choice = chat
    ? { index: 0, delta: { content: " tok" }, finish_reason: null }
    : { index: 0, text: " tok", logprobs: null, finish_reason: null };
  let tail = "";
  if (usage) {
    const u = { prompt_tokens: promptTokens, completion_tokens: n, total_tokens: promptTokens + n };
    tail += sse({ id, object, created: 0, model: MODEL, choices: [], usage: u });
  }
  tail += "data: [DONE]\n\n";
  const s = {
    sock,
    conn,
    n,
    i: 0,
    arrival,
    key: crypto.createHash("md5").update(prompt, "utf8").digest("hex"),
    sends: new Float64Array(n),
    token: Buffer.from(frame(sse({ id, object, created: 0, model: MODEL, choices: [choice] }))),
    tail: Buffer.from(frame(tail) + "0\r\n\r\n"),
    dead: false,
  };
  conn.stream = s;
  sock.write(
    "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n" +
      "Connection: keep-alive\r\nTransfer-Encoding: chunked\r\n\r\n"
  );
  schedule(s, arrival + TTFT_NS);
}

function step(s) {
  if (s.dead) return;
  s.sends[s.i] = now();
  s.sock.write(s.token);
  s.i++;
  if (s.i < s.n) {
    schedule(s, s.arrival + TTFT_NS + s.i * ITL_NS);
    return;
  }
  s.sock.write(s.tail);
  record(s);
  s.conn.stream = null;
  parse(s.conn); // a pipelined request may be waiting
}

// ---------------------------------------------------------------- HTTP/1.1, minimal

function reply(sock, conn, code, obj) {
  const text = JSON.stringify(obj);
  sock.write(
    `HTTP/1.1 ${code} ${code === 200 ? "OK" : "Error"}\r\nContent-Type: application/json\r\n` +
      `Content-Length: ${Buffer.byteLength(text)}\r\nConnection: keep-alive\r\n\r\n` +
      text
  );
}

function parse(conn) {
  while (conn.stream === null) {
    const buf = conn.buf;
    const end = buf.indexOf("\r\n\r\n");
    if (end < 0) return;
    const head = buf.subarray(0, end).toString("latin1").split("\r\n");
    let length = 0;
    for (let k = 1; k < head.length; k++) {
      const c = head[k].indexOf(":");
      if (c > 0 && head[k].slice(0, c).trim().toLowerCase() === "content-length") {
        length = Number(head[k].slice(c + 1).trim());
      }
    }
    if (buf.length < end + 4 + length) return;
    const body = buf.subarray(end + 4, end + 4 + length).toString();
    conn.buf = buf.subarray(end + 4 + length);
    const arrival = conn.dataAt;
    const [method, target] = head[0].split(" ");
    const path = (target || "").split("?")[0];
    const sock = conn.sock;
    if (method === "POST" && (path === "/v1/completions" || path === "/v1/chat/completions")) {
      startStream(sock, conn, path, body, arrival);
    } else if (path === "/v1/models") {
      reply(sock, conn, 200, { object: "list", data: [{ id: MODEL, object: "model", owned_by: "bench" }] });
    } else if (path === "/health" || path === "/v1/health" || path === "/") {
      reply(sock, conn, 200, { status: "ok" });
    } else if (path === "/_truth/reset") {
      truth = newTruth();
      reply(sock, conn, 200, { ok: true });
    } else if (path === "/_truth") {
      const text = truthJson();
      sock.write(
        `HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: ${Buffer.byteLength(text)}\r\n\r\n`
      );
      sock.write(text);
    } else {
      reply(sock, conn, 404, { error: { message: "not found: " + path } });
    }
  }
}

const server = net.createServer((sock) => {
  sock.setNoDelay(true);
  const conn = { sock, buf: Buffer.alloc(0), stream: null, server, dataAt: 0, queued: false };
  // A request's arrival is stamped when its bytes are read, and parsing is left to
  // setImmediate: when many requests land at once (a closed loop's wave), every one is
  // stamped before any is parsed, so the server's own parsing is not timed as the client's.
  sock.on("data", (d) => {
    conn.dataAt = now();
    conn.buf = conn.buf.length ? Buffer.concat([conn.buf, d]) : d;
    if (!conn.queued) {
      conn.queued = true;
      setImmediate(() => {
        conn.queued = false;
        parse(conn);
      });
    }
  });
  const drop = () => {
    if (conn.stream) conn.stream.dead = true; // a client that hung up: not a completed stream
    conn.stream = null;
  };
  sock.on("close", drop);
  sock.on("error", drop);
});
server.nextId = 0;
server.listen(PORT, "127.0.0.1", 4096, () => {
  process.stdout.write("PORT " + server.address().port + "\n");
});
for (const sig of ["SIGTERM", "SIGINT"]) process.on(sig, () => process.exit(0));
// Never outlive the benchmark: exit when the parent closes our stdin.
process.stdin.on("end", () => process.exit(0));
process.stdin.resume();
