// trainguard fleet page: every node of the store as a tile coloured by its verdict, grouped by
// rack, filtered by node group; a click lists that node's incidents. Same origin, the browser's
// credentials (the agent's token), no library.
"use strict";
const $ = (id) => document.getElementById(id);
let selected = null;

function el(tag, attrs, text) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  if (text !== undefined) e.textContent = text;
  return e;
}

async function get(path) {
  const r = await fetch(location.origin + path, {credentials: "same-origin", cache: "no-store"});
  if (!r.ok) throw new Error(`${path}: HTTP ${r.status}`);
  return r.json();
}

function when(t) { return t ? new Date(t * 1000).toISOString().replace("T", " ").slice(0, 19) : "–"; }

function drawGroups(status) {
  const sel = $("group");
  const groups = [...new Set(status.groups.map((g) => g.group))].sort();
  const have = [...sel.options].map((o) => o.value);
  for (const g of groups) if (!have.includes(g)) sel.append(el("option", {value: g}, g));
}

function drawGrid(nodes) {
  const grid = $("grid");
  const tiles = [];
  let rack = null;
  for (const n of nodes) {
    if (n.rack !== rack) { rack = n.rack; tiles.push(el("div", {class: "rack"}, `${n.node_group || "(none)"} · rack ${rack || "(none)"}`)); }
    const t = el("button", {class: `node ${n.health}` + (n.stale ? " stale" : "") + (n.host === selected ? " selected" : ""),
      "data-host": n.host, "data-health": n.health, "data-group": n.node_group || "", title: `${n.host}: ${n.health}${n.reason ? " — " + n.reason : ""}`}, n.host);
    t.addEventListener("click", () => { selected = n.host; showNode(n.host); refresh(); });
    tiles.push(t);
  }
  grid.replaceChildren(...(tiles.length ? tiles : [el("p", {class: "muted"}, "no node has reported to this store")]));
}

async function showNode(host) {
  $("node-name").textContent = host;
  const rows = await get(`/api/v1/fleet/incidents?host=${encodeURIComponent(host)}&limit=100`);
  const body = $("node-incidents").tBodies[0];
  body.replaceChildren(...(rows.length ? rows.map((i) => {
    const tr = el("tr", {"data-id": String(i.id), "data-gpu": i.gpu === null ? "" : String(i.gpu)});
    for (const v of [when(i.time), i.gpu === null ? "–" : String(i.gpu), i.root_cause, i.action, i.summary]) tr.append(el("td", {}, v));
    return tr;
  }) : [el("tr", {}, "")]));
  if (!rows.length) body.rows[0].append(el("td", {colspan: "5", class: "muted"}, "no incidents"));
}

async function refresh() {
  const group = $("group").value;
  const q = group ? `?group=${encodeURIComponent(group)}` : "";
  try {
    const [status, nodes] = await Promise.all([get("/api/v1/fleet/status"), get("/api/v1/fleet/nodes" + q)]);
    drawGroups(status);
    const h = status.by_health;
    $("summary").textContent = `${status.nodes} nodes: ${h.ok} ok, ${h.degraded} degraded, ${h.failed} failed, ${h.unknown} unknown · ${status.stale} stale · ${status.incidents_24h} incidents in 24 h`;
    drawGrid(nodes);
  } catch (err) {
    $("summary").textContent = `store unreachable: ${err.message}`;
  }
}

$("group").addEventListener("change", refresh);
refresh();
setInterval(refresh, 5000);
