// tokenbench dashboard: draws the server-built plotly figures and runs the start-a-benchmark form.
"use strict";
window.tokenbench = (function () {
  const CONFIG = { displaylogo: false, responsive: true };

  // Draw every figure embedded in <script id="figures">; body[data-ready] marks the end
  // (browser tests and benchmarks/dashboard.py wait for it).
  async function renderFigures() {
    window.tokenbenchStartMs = performance.now();  // plotly.js parsed and run by now
    const node = document.getElementById("figures");
    const figures = node ? JSON.parse(node.textContent) : {};
    const drawn = [];
    const narrow = window.innerWidth < 640;
    for (const [name, fig] of Object.entries(figures)) {
      const div = document.getElementById("chart-" + name);
      if (!div) continue;
      // The box takes the figure's height and plotly fills the box's width, so a resize
      // redraws the chart inside its box instead of spilling over what follows it.
      const layout = Object.assign({}, fig.layout, { autosize: true });
      div.style.height = (layout.height || 420) + "px";
      delete layout.width;
      if (narrow) {  // a phone: smaller text so titles and axis titles fit the width
        layout.margin = Object.assign({}, layout.margin, { l: 56, r: 10 });
        layout.font = Object.assign({}, layout.font, { size: 10 });
        layout.title = Object.assign({}, layout.title, { font: { size: 13 } });
      }
      drawn.push(Plotly.newPlot(div, fig.data, layout, CONFIG));
    }
    await Promise.all(drawn);
    window.tokenbenchReadyMs = performance.now();  // since navigation start
    document.body.dataset.ready = "1";
  }

  function numberList(text) {
    return text.split(",").map((s) => s.trim()).filter(Boolean).map(Number);
  }

  function jobBody(form) {
    const f = new FormData(form);
    const value = (k) => (f.get(k) || "").toString().trim();
    const body = { kind: value("kind") };
    if (value("scenario")) body.scenario = value("scenario");
    else if (value("scenario_name")) body.scenario_name = value("scenario_name");
    if (value("num_prompts")) body.num_prompts = Number(value("num_prompts"));
    if (value("label")) body.label = value("label");
    if (value("gpu")) body.gpu = value("gpu");
    if (value("num_gpus")) body.num_gpus = Number(value("num_gpus"));
    if (f.get("simulate")) {
      body.simulate = {
        gpu: value("sim_gpu"), tp: Number(value("sim_tp") || 1),
        model: value("sim_model"), precision: value("sim_precision"),
      };
    } else {
      body.target = { base_url: value("base_url") };
    }
    if (body.kind === "sweep") {
      body.sweep = { request_rates: numberList(value("request_rates")) };
      if (value("point_duration_s")) body.sweep.point_duration_s = Number(value("point_duration_s"));
      if (value("slo")) body.sweep.slo = value("slo");
    }
    return body;
  }

  function explain(detail) {
    if (Array.isArray(detail)) {
      return detail.map((d) => (d.loc || []).join(".") + ": " + d.msg).join("\n");
    }
    return typeof detail === "string" ? detail : JSON.stringify(detail);
  }

  function tableRow(values) {
    const tr = document.createElement("tr");
    values.forEach((value, i) => {
      const td = document.createElement("td");
      if (i > 0) td.className = "n";
      td.textContent = String(value);
      tr.append(td);
    });
    return tr;
  }

  function showJob(job) {
    document.getElementById("job").hidden = false;
    const status = document.getElementById("job-status");
    status.textContent = job.status;
    status.className = "status " + job.status;
    const p = job.progress;
    const bar = document.getElementById("job-bar");
    const text = document.getElementById("job-text");
    if (p) {
      bar.max = Math.max(1, p.total);
      bar.value = p.completed + p.failed;
      const point = job.kind === "sweep" ? `point ${p.point + 1}${p.points_planned ? " of ~" + p.points_planned : ""}: ` : "";
      const p99 = p.p99_ttft_ms == null ? "—" : Math.round(p.p99_ttft_ms) + " ms";
      text.textContent = `${point}${p.completed + p.failed} of ${p.total} requests done, ${p.failed} failed, ${p.in_flight} in flight; live P99 TTFT ${p99}`;
    } else {
      text.textContent = job.status === "queued" ? "waiting for the running job to finish" : "";
    }
    // Built as elements with textContent, never as HTML: a point's title comes from a
    // scenario anyone with the token may submit.
    const rows = job.points.map((q) => tableRow([
      q.title,
      q.requests_per_s.toFixed(2),
      Math.round(q.output_tokens_per_s),
      q.p99_ttft_ms == null ? "—" : q.p99_ttft_ms.toFixed(1),
      q.p99_tpot_ms == null ? "—" : q.p99_tpot_ms.toFixed(2),
      q.failed,
    ]));
    document.querySelector("#job-points tbody").replaceChildren(...rows);
    if (job.run_id) {
      const link = document.createElement("a");
      link.href = "/runs/" + encodeURIComponent(job.run_id);
      link.textContent = job.run_id.slice(0, 8);
      document.getElementById("job-link").replaceChildren("Run ", link);
    }
    if (job.error) {
      const err = document.getElementById("job-error");
      err.hidden = false;
      err.textContent = job.error;
    }
  }

  // Server-sent events read with fetch (EventSource cannot send the Authorization header).
  async function follow(jobId, token) {
    const res = await fetch(`/api/jobs/${jobId}/events`, { headers: { Authorization: "Bearer " + token } });
    const reader = res.body.getReader();
    const decoder = new TextDecoder();
    let buffer = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      buffer += decoder.decode(value, { stream: true });
      let cut;
      while ((cut = buffer.indexOf("\n\n")) >= 0) {
        const block = buffer.slice(0, cut);
        buffer = buffer.slice(cut + 2);
        const data = block.split("\n").filter((l) => l.startsWith("data: ")).map((l) => l.slice(6)).join("\n");
        if (data) {
          const job = JSON.parse(data);
          showJob(job);
          if (block.startsWith("event: end")) return job;
        }
      }
    }
  }

  function jobForm() {
    const form = document.getElementById("job-form");
    const tokenInput = document.getElementById("token");
    tokenInput.value = sessionStorage.getItem("tokenbench-token") || "";
    const cancel = document.getElementById("cancel");
    let current = null;
    form.addEventListener("submit", async (event) => {
      event.preventDefault();
      const err = document.getElementById("job-error");
      err.hidden = true;
      const token = tokenInput.value.trim();
      sessionStorage.setItem("tokenbench-token", token);
      const res = await fetch("/api/jobs", {
        method: "POST",
        headers: { "Content-Type": "application/json", Authorization: "Bearer " + token },
        body: JSON.stringify(jobBody(form)),
      });
      const data = await res.json();
      if (!res.ok) {
        err.hidden = false;
        err.textContent = explain(data.detail);
        return;
      }
      current = data.id;
      cancel.disabled = false;
      showJob(data);
      await follow(current, token);
      cancel.disabled = true;
    });
    cancel.addEventListener("click", async () => {
      if (!current) return;
      await fetch(`/api/jobs/${current}/cancel`, {
        method: "POST", headers: { Authorization: "Bearer " + tokenInput.value.trim() },
      });
    });
  }

  // The runs table's Compare button sends runs in the order they were ticked, so the first
  // ticked is the reference run (the compare page can change it).
  function compareForm() {
    const form = document.getElementById("compare-form");
    if (!form) return;
    const order = [];
    form.addEventListener("change", (event) => {
      const box = event.target;
      if (box.name !== "run") return;
      const i = order.indexOf(box.value);
      if (i >= 0) order.splice(i, 1);
      if (box.checked) order.push(box.value);
    });
    form.addEventListener("submit", (event) => {
      const ticked = Array.from(form.querySelectorAll("input[name=run]:checked")).map((b) => b.value);
      const runs = order.filter((id) => ticked.includes(id)).concat(ticked.filter((id) => !order.includes(id)));
      event.preventDefault();
      window.location.href = "/compare?" + runs.map((id) => "run=" + encodeURIComponent(id)).join("&");
    });
  }

  return { renderFigures, jobForm, compareForm };
})();
