// The swarm-status dashboard: fetches /api/board every few seconds and redraws the tables and
// charts. Every figure goes into the page as text (textContent), never as markup: job names,
// endpoint URLs and error messages come from servers and operators.
"use strict";

const REFRESH_MS = 2000;
const SVG = "http://www.w3.org/2000/svg";

function el(tag, text, cls) {
  const node = document.createElement(tag);
  if (text !== undefined && text !== null) node.textContent = String(text);
  if (cls) node.className = cls;
  return node;
}

function cell(row, key, text, cls) {
  const td = el("td", text, cls);
  td.dataset.k = key;
  row.appendChild(td);
  return td;
}

const int = (n) => (n === null || n === undefined ? "?" : n.toLocaleString("en-US"));
const rate = (r) => (r === null || r === undefined ? "-" : r.toFixed(1));

function duration(s) {
  if (s === null || s === undefined || !isFinite(s)) return "-";
  for (const [unit, size] of [["d", 86400], ["h", 3600], ["m", 60]]) {
    if (s >= size) return (s / size).toFixed(1) + " " + unit;
  }
  return Math.round(s) + " s";
}

function progressBar(job) {
  const wrap = el("span", null, "bar");
  const total = job.total || job.enqueued || 0;
  if (total > 0) {
    const ok = el("span");
    ok.style.width = (100 * job.done / total) + "%";
    const bad = el("span", null, "failed");
    bad.style.left = ok.style.width;
    bad.style.width = (100 * job.failed / total) + "%";
    wrap.append(ok, bad);
  }
  return wrap;
}

function label(svg, x, y, anchor, text) {
  const node = document.createElementNS(SVG, "text");
  node.setAttribute("x", String(x));
  node.setAttribute("y", String(y));
  node.setAttribute("text-anchor", anchor);
  node.setAttribute("class", "axis");
  node.textContent = text;
  svg.appendChild(node);
}

// A line of ``values`` (oldest first) in a width x height box; ``span`` (s): the time it
// covers, labelled with the peak when given.
function chart(svg, values, width, height, span) {
  while (svg.firstChild) svg.removeChild(svg.firstChild);
  if (values.length < 2) return;
  const top = Math.max(1, ...values);
  const room = span === undefined ? height - 4 : height - 34;
  const base = span === undefined ? height - 2 : height - 16;
  const points = values.map((v, i) =>
    (i * width / (values.length - 1)).toFixed(1) + "," + (base - v * room / top).toFixed(1));
  const line = document.createElementNS(SVG, "polyline");
  line.setAttribute("points", points.join(" "));
  line.setAttribute("vector-effect", "non-scaling-stroke");
  svg.appendChild(line);
  if (span !== undefined) {
    label(svg, 6, 12, "start", "peak " + top.toFixed(1) + "/s");
    label(svg, 6, height - 3, "start", duration(span) + " ago");
    label(svg, width - 6, height - 3, "end", "now");
  }
}

function drawJobs(jobs) {
  const body = document.querySelector("#jobs tbody");
  body.replaceChildren();
  if (jobs.length === 0) {
    const row = el("tr");
    const td = cell(row, "none", "no jobs in this Redis", "text");
    td.colSpan = 16;
    body.appendChild(row);
  }
  for (const job of jobs) {
    const row = el("tr");
    row.dataset.job = job.job;
    cell(row, "job", job.job);
    cell(row, "state", job.state, "text state state-" + job.state);
    cell(row, "model", job.model || "any", "text");
    cell(row, "progress", null).appendChild(progressBar(job));
    cell(row, "done", int(job.done));
    cell(row, "failed", int(job.failed));
    cell(row, "cached", int(job.cache_hits));
    cell(row, "total", job.total === null ? int(job.enqueued) + "+" : int(job.total));
    cell(row, "in_flight", int(job.in_flight));
    cell(row, "pending", int(job.pending));
    cell(row, "rate", rate(job.rate_per_s));
    cell(row, "recent_rate", rate(job.recent_rate_per_s));
    cell(row, "eta", duration(job.eta_s));
    const kinds = Object.entries(job.failed_by_kind).map(([k, n]) => k + " " + n).join(", ");
    cell(row, "failed_by_kind", kinds || (job.error || job.waiting || ""), "wrap");
    cell(row, "reduce", job.reduce ? job.reduce + ": " + job.reduce_level : "", "wrap");
    cell(row, "agents", job.agents ? agentStates(job.agents) : stepStates(job.steps), "wrap");
    body.appendChild(row);
  }
}

// A pipeline's later steps: each its answered of its total so far, and its failures.
function stepStates(steps) {
  if (!steps) return "";
  return steps.map(([done, failed, total], k) =>
    "step " + (k + 1) + ": " + int(done) + "/" + (total === null ? "?" : int(total)) +
    (failed ? " (" + int(failed) + " failed)" : "")).join("; ");
}

function agentStates(a) {
  return a.thinking + " thinking, " + a.waiting + " waiting for a tool, " + a.done + " done";
}

function drawTools(calls) {
  const line = document.getElementById("tools");
  const any = Object.keys(calls || {}).length > 0;
  line.textContent = any
    ? "tool calls (all jobs): " + int(calls.runs || 0) + " run, " + int(calls.shared || 0) +
      " answered by a run already made or under way"
    : "";
  line.style.display = any ? "block" : "none";
}

function drawEndpoints(endpoints) {
  const body = document.querySelector("#endpoints tbody");
  body.replaceChildren();
  for (const ep of endpoints) {
    const row = el("tr");
    row.dataset.endpoint = ep.endpoint;
    row.dataset.worker = ep.worker;
    cell(row, "endpoint", ep.endpoint);
    cell(row, "worker", ep.worker, "text");
    cell(row, "circuit", ep.circuit, "text state state-" + ep.circuit);
    const spark = document.createElementNS(SVG, "svg");
    spark.setAttribute("class", "spark");
    spark.setAttribute("viewBox", "0 0 160 26");
    spark.setAttribute("preserveAspectRatio", "none");
    cell(row, "throughput", null, "text").appendChild(spark);
    chart(spark, ep.throughput, 160, 26);
    cell(row, "rate", rate(ep.rate_per_s));
    cell(row, "done", int(ep.done));
    cell(row, "failed", int(ep.failed));
    cell(row, "errors", int(ep.errors));
    cell(row, "window", int(ep.window));
    cell(row, "in_flight", int(ep.in_flight));
    cell(row, "seen", ep.seen_s === null ? "-" : duration(ep.seen_s) + " ago");
    cell(row, "last_error", ep.last_error, "wrap");
    body.appendChild(row);
  }
}

function drawTotal(board) {
  const n = board.times.length;
  const total = new Array(n).fill(0);
  for (const ep of board.endpoints) ep.throughput.forEach((v, i) => { total[i] += v; });
  const svg = document.getElementById("total");
  const width = Math.max(200, Math.round(svg.getBoundingClientRect().width) || 1000);
  svg.setAttribute("viewBox", "0 0 " + width + " 140");  // drawn at the size shown: text unstretched
  chart(svg, total, width, 140, n ? board.times[0] : 0);
  document.getElementById("span").textContent =
    n ? "(last " + duration(board.times[0]) + ")" : "(from the next refresh on)";
}

async function refresh() {
  try {
    const response = await fetch("/api/board", { cache: "no-store" });
    const board = await response.json();
    document.getElementById("where").textContent = board.redis + "  prefix " + board.prefix;
    document.getElementById("when").textContent =
      "as of " + new Date(board.generated_s * 1000).toLocaleTimeString();
    const banner = document.getElementById("error");
    banner.textContent = board.error ? "Redis could not be read: " + board.error : "";
    banner.style.display = board.error ? "block" : "none";
    const notes = document.getElementById("notes");
    notes.textContent = (board.notes || []).join("\n");
    notes.style.display = notes.textContent ? "block" : "none";
    drawJobs(board.jobs);
    drawTools(board.tool_calls);
    drawEndpoints(board.endpoints);
    drawTotal(board);
    document.body.dataset.updated = String(board.generated_s);
  } catch (err) {
    const banner = document.getElementById("error");
    banner.textContent = "The dashboard server did not answer: " + err;
    banner.style.display = "block";
  }
}

refresh();
setInterval(refresh, REFRESH_MS);
