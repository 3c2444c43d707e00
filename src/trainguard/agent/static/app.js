// trainguard dashboard: polls the agent's API (same origin, the browser's credentials) and draws
// one SVG line chart per reading with a line per GPU. No library, no CDN.
"use strict";
const COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#17becf",
                "#bcbd22", "#7f7f7f", "#393b79", "#637939", "#8c6d31", "#843c39", "#7b4173", "#3182bd"];
// [field, title, fixed y range or null for one that follows the data]
const CHARTS = [["temperature_c", "Temperature (°C)", null], ["power_w", "Power (W)", null], ["sm_clock_mhz", "SM clock (MHz)", null],
                ["mem_used_pct", "Memory used (%)", [0, 100]], ["util_gpu_pct", "Utilization (%)", [0, 100]],
                ["ecc_errors", "ECC errors (volatile)", null]];
const TIMELINE_MAX_S = 3600, TIMELINE_MIN_S = 120;  // the timeline spans the last hour's incidents
const WINDOW_S = 300;
const series = {};  // gpu -> array of points [time, ...fields]
let fields = null, lastTime = 0, nowTime = 0;
const $ = (id) => document.getElementById(id);
const svgNS = "http://www.w3.org/2000/svg";

function el(tag, attrs, text) {
  const e = tag.startsWith("svg:") ? document.createElementNS(svgNS, tag.slice(4)) : document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  if (text !== undefined) e.textContent = text;
  return e;
}

async function get(path) {
  // location.origin, not a relative URL: the page may have been opened as http://user:token@host/
  const r = await fetch(location.origin + path, {credentials: "same-origin", cache: "no-store"});
  if (!r.ok) throw new Error(`${path}: HTTP ${r.status}`);
  return r.json();
}

function badge(node, health) {
  node.className = "badge " + health;
  node.textContent = health;
  node.dataset.health = health;
}

function fmt(v, digits = 0) { return v === null || v === undefined ? "–" : Number(v).toFixed(digits); }

function drawNode(n) {
  $("host").textContent = n.hostname;
  badge($("verdict"), n.health);
  $("action").textContent = n.action === "none" ? "" : "action: " + n.action;
  $("agent").textContent = `agent ${n.agent.health}` + (n.agent.problems.length ? ": " + n.agent.problems.join("; ") : "") +
    ` · every ${n.agent.interval_s}s` + (n.agent.scenario ? ` · scenario ${n.agent.scenario}` : "");
  const ul = $("reasons");
  ul.replaceChildren(...(n.reasons.length ? n.reasons.map((r) => el("li", {}, r)) : [el("li", {class: "muted"}, "nothing wrong")]));
}

function drawGpus(gpus) {
  const rows = gpus.map((g) => {
    const r = g.reading, tr = el("tr", {"data-gpu": g.index, "data-health": g.health});
    const mem = r.mem_used_mib !== null && r.mem_total_mib ? 100 * r.mem_used_mib / r.mem_total_mib : null;
    const ecc = r.ecc_dbe_volatile === null ? null : `${r.ecc_sbe_volatile ?? 0}/${r.ecc_dbe_volatile}`;
    const name = el("td", {}, `${g.index}`);
    name.style.borderLeft = `4px solid ${COLORS[g.index % COLORS.length]}`;
    const h = el("td"); h.append(el("span", {class: "badge " + g.health}, g.health));
    tr.append(name, h, el("td", {class: "num"}, r.lost ? "lost" : fmt(r.temperature_c)), el("td", {class: "num"}, fmt(r.power_w)),
      el("td", {class: "num"}, fmt(r.sm_clock_mhz)), el("td", {class: "num"}, fmt(mem)), el("td", {class: "num"}, ecc ?? "–"),
      el("td", {}, g.reasons.join("; ")));
    return tr;
  });
  $("gpus").tBodies[0].replaceChildren(...rows);
}

function addHistory(h) {
  fields = h.fields;
  nowTime = h.now;
  for (const [gpu, pts] of Object.entries(h.gpus)) {
    const s = series[gpu] || (series[gpu] = []);
    for (const p of pts) if (p[0] > lastTime) s.push(p);
    while (s.length && s[0][0] < nowTime - WINDOW_S) s.shift();
  }
  for (const pts of Object.values(h.gpus)) for (const p of pts) lastTime = Math.max(lastTime, p[0]);
}

function drawCharts() {
  if (!fields) return;
  const box = $("charts");
  if (!box.children.length) {
    for (const [key, title, range] of CHARTS) {
      const div = el("div", {class: "chart", "data-field": key, "data-range": range ? range.join(",") : ""});
      div.append(el("h3", {}, title), el("svg:svg", {viewBox: "0 0 400 130", preserveAspectRatio: "none"}));
      box.append(div);
    }
    $("legend").replaceChildren(...Object.keys(series).map((g) => {
      const s = el("span", {}, `GPU ${g}`); const i = el("i"); i.style.background = COLORS[g % COLORS.length]; s.prepend(i); return s;
    }));
  }
  // The x axis spans the data we have (at least 10 s), up to WINDOW_S.
  let first = nowTime;
  for (const pts of Object.values(series)) if (pts.length) first = Math.min(first, pts[0][0]);
  const t1 = nowTime, t0 = Math.min(t1 - 10, Math.max(first, t1 - WINDOW_S));
  for (const div of box.children) {
    const k = fields.indexOf(div.dataset.field), svg = div.querySelector("svg");
    let lo = Infinity, hi = -Infinity;
    for (const pts of Object.values(series)) for (const p of pts) if (p[k] !== null) { lo = Math.min(lo, p[k]); hi = Math.max(hi, p[k]); }
    if (lo === Infinity) { lo = 0; hi = 1; }
    if (hi - lo < 1e-9) { hi += 1; lo = Math.max(0, lo - 1); }
    const pad = (hi - lo) * 0.08; lo -= pad; hi += pad;
    if (div.dataset.range) [lo, hi] = div.dataset.range.split(",").map(Number);
    const x = (t) => 30 + (t - t0) / (t1 - t0) * 365, y = (v) => 122 - (v - lo) / (hi - lo) * 114;
    const kids = [el("svg:text", {x: 2, y: 12, class: "axis"}, fmt(hi, hi < 10 ? 1 : 0)), el("svg:text", {x: 2, y: 126, class: "axis"}, fmt(lo, hi < 10 ? 1 : 0))];
    let drawn = 0;
    for (const [gpu, pts] of Object.entries(series)) {
      let d = "", pen = "M";
      for (const p of pts) {
        if (p[k] === null) { pen = "M"; continue; }
        d += `${pen}${x(p[0]).toFixed(1)},${y(p[k]).toFixed(1)}`; pen = "L"; drawn++;
      }
      if (d) kids.push(el("svg:path", {d, fill: "none", stroke: COLORS[gpu % COLORS.length], "stroke-width": 1.5, "data-gpu": gpu}));
    }
    svg.replaceChildren(...kids);
    div.dataset.points = drawn;
  }
}

function drawIncidents(page) {
  const items = page.items;
  $("incidents").tBodies[0].replaceChildren(...items.slice(0, 10).map((i) => {
    const tr = el("tr", {"data-gpu": i.gpu ?? ""});
    tr.append(el("td", {}, new Date(i.time * 1000).toLocaleTimeString()), el("td", {}, i.gpu ?? "node"),
      el("td", {}, i.root_cause), el("td", {}, i.action), el("td", {}, i.summary));
    return tr;
  }));
  const svg = $("timeline"), t1 = Date.now() / 1000;
  let t0 = t1 - TIMELINE_MIN_S;
  for (const i of items) if (i.time >= t1 - TIMELINE_MAX_S) t0 = Math.min(t0, i.time - 10);
  const span = t1 - t0;
  $("timeline-span").textContent = `(timeline: last ${span < 120 ? Math.round(span) + " s" : Math.round(span / 60) + " min"})`;
  const kids = [el("svg:line", {x1: 0, x2: 1000, y1: 30, y2: 30, stroke: "#ccc"})];
  for (const i of items) {
    if (i.time < t0) continue;
    const c = el("svg:circle", {cx: 10 + (i.time - t0) / span * 980, cy: 30, r: 6, fill: i.action === "reboot_node" || i.action === "reset_gpu" ? "#c62828" : "#e6a700"});
    c.append(el("svg:title", {}, `${new Date(i.time * 1000).toLocaleTimeString()} GPU ${i.gpu ?? "-"}: ${i.summary}`));
    kids.push(c);
  }
  svg.replaceChildren(...kids);
}

function emptyRow(cols, text) {
  const tr = el("tr"), td = el("td", {colspan: cols, class: "muted"}, text);
  tr.append(td);
  return tr;
}

function drawJobs(jobs) {
  $("jobs").tBodies[0].replaceChildren(...(jobs.length ? jobs.map((j) => {
    const tr = el("tr");
    tr.append(el("td", {}, j.name || j.job), el("td", {}, j.status ?? ""), el("td", {class: "num"}, `${fmt(j.goodput.wall_s)} s`),
      el("td", {class: "num"}, `${fmt(100 * j.goodput.ettr, 1)} %`), el("td", {class: "num"}, j.goodput.interruptions));
    return tr;
  }) : [emptyRow(5, "no jobs in this store yet (trainguard run records them)")]));
}

async function fast() {
  try {
    const [n, g, h] = await Promise.all([get("/api/v1/node"), get("/api/v1/gpus"), get(`/api/v1/history?since=${lastTime}`)]);
    drawNode(n); drawGpus(g); addHistory(h); drawCharts();
  } catch (e) { $("agent").textContent = "agent unreachable: " + e.message; }
}

async function slow() {
  try {
    const [inc, jobs] = await Promise.all([get("/api/v1/incidents?limit=200"), get("/api/v1/jobs")]);
    drawIncidents(inc); drawJobs(jobs);
  } catch (e) { /* the store may be busy; the next round retries */ }
}

async function remediation() {
  try {
    const r = await get("/api/v1/remediation"), b = r.breaker || {}, box = $("remediation");
    box.textContent = `remediation: ${r.enforcing ? "enforcing" : "dry run"} · breaker ${b.open ? "OPEN: " + b.why : "closed"}` +
      (b.held ? ` · ${b.held} held` : "");
    box.className = b.open ? "badge failed" : "muted";
    box.dataset.breaker = b.open ? "open" : "closed";
  } catch (e) { /* an agent without remediation: nothing to show */ }
}

fast(); slow(); remediation();
setInterval(fast, 1000);
setInterval(slow, 3000);
setInterval(remediation, 3000);
