// hybridrate dashboard: polls api/snapshot every second (and api/fleet every two) and draws them.
// No dependencies.
"use strict";

const SPAN = Number(new URLSearchParams(location.search).get("span")) || 300;
const SVG = "http://www.w3.org/2000/svg";
const $ = (id) => document.getElementById(id);
const fmt = (n) => Number(n).toLocaleString("en-US");
const fmt1 = (n) => (Math.round(n * 10) / 10).toLocaleString("en-US", { minimumFractionDigits: 1, maximumFractionDigits: 1 });

function el(tag, attrs, text) {
  const e = tag === "svg" || ["path", "line", "text", "g", "title"].includes(tag)
    ? document.createElementNS(SVG, tag) : document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  if (text !== undefined) e.textContent = text;
  return e;
}

function rows(tbody, items, cells) {
  tbody.replaceChildren(...items.map((it) => {
    const tr = el("tr");
    for (const [text, cls] of cells(it)) {
      const td = el("td", cls ? { class: cls } : {});
      if (text instanceof Node) td.append(text); else td.textContent = text;
      tr.append(td);
    }
    return tr;
  }));
}

function chart(seconds) {
  const svg = $("chart");
  const W = 900, H = 220, L = 44, B = 20, T = 8;
  const n = seconds.length;
  const max = Math.max(1, ...seconds.map((s) => s.allowed + s.denied));
  const x = (i) => L + (n <= 1 ? 0 : (i * (W - L - 4)) / (n - 1));
  const y = (v) => T + (H - T - B) * (1 - v / max);
  const line = (f) => seconds.map((s, i) => `${i ? "L" : "M"}${x(i).toFixed(1)},${y(f(s)).toFixed(1)}`).join("");
  const parts = [];
  for (const f of [0, 0.5, 1]) {
    const v = Math.round(max * f);
    parts.push(el("line", { class: "grid", x1: L, x2: W, y1: y(v), y2: y(v) }));
    parts.push(el("text", { x: L - 6, y: y(v) + 4, "text-anchor": "end" }, fmt(v)));
  }
  const mins = Math.round(n / 60);
  parts.push(el("text", { x: L, y: H - 4 }, n >= 120 ? `-${mins} min` : `-${n} s`));
  parts.push(el("text", { x: W - 4, y: H - 4, "text-anchor": "end" }, "now"));
  if (n > 0) {
    parts.push(el("path", { class: "denied", d: `${line((s) => s.denied)}L${x(n - 1)},${y(0)}L${x(0)},${y(0)}Z` }));
    parts.push(el("path", { class: "allowed", d: line((s) => s.allowed + s.denied) }));
    parts.push(el("path", { class: "shadowed", d: line((s) => s.shadowDenied) }));
  }
  svg.replaceChildren(...parts);
}

// spark draws a series of counts per step as a small filled line, its peak in a tooltip.
function spark(series, step, shadow) {
  const W = 160, H = 24;
  const n = series.length;
  const max = Math.max(1, ...series);
  const x = (i) => (n <= 1 ? 0 : (i * W) / (n - 1));
  const y = (v) => H - 1 - ((H - 2) * v) / max;
  const line = series.map((v, i) => `${i ? "L" : "M"}${x(i).toFixed(1)},${y(v).toFixed(1)}`).join("");
  const svg = el("svg", { class: "spark", viewBox: `0 0 ${W} ${H}`, preserveAspectRatio: "none" });
  const p = el("path", { d: `${line}L${W},${H}L0,${H}Z` });
  if (shadow) p.setAttribute("class", "shadowed");
  svg.append(p, el("title", {}, `peak ${fmt1(max / step)} denied/s (step ${step} s)`));
  return svg;
}

// recent is the rate of the last whole step of a series of counts per step (the last step is
// still filling).
const recent = (series, step) => (series.length >= 2 ? series[series.length - 2] / step : 0);

function ruleRows(tbody, trend) {
  const step = trend.step || 1;
  rows(tbody, trend.rules || [], (r) => [[r.shadow ? `${r.rule} (shadow)` : r.rule], [fmt1(recent(r.series, step)), "num"],
    [fmt(r.n), "num"], [spark(r.series, step, r.shadow)]]);
}

function render(s) {
  const secs = s.seconds || [];
  const last = secs.slice(-11, -1); // the last ten whole seconds
  const per = (f) => last.reduce((a, c) => a + f(c), 0) / Math.max(last.length, 1);
  const sum = s.sum;
  const checks = sum.allowed + sum.denied;
  $("instance").textContent = s.instance;
  $("span").textContent = secs.length >= 120 ? `${Math.round(secs.length / 60)} min` : `${secs.length} s`;
  $("updated").textContent = new Date(s.now).toLocaleTimeString("en-GB");
  $("rate-checks").textContent = fmt1(per((c) => c.allowed + c.denied));
  $("rate-denied").textContent = fmt1(per((c) => c.denied));
  $("sum-checks").textContent = fmt(checks);
  $("sum-denied").textContent = fmt(sum.denied);
  $("deny-share").textContent = checks ? `${fmt1((100 * sum.denied) / checks)} %` : "–";
  $("sum-shadow").textContent = fmt(sum.shadowDenied);
  $("sum-errors").textContent = fmt(sum.errors);
  $("total-denied").textContent = fmt(s.totals.denied);
  chart(secs);

  const denied = s.denied || [];
  const top = Math.max(1, ...denied.map((d) => d.n));
  rows($("denied").tBodies[0], denied, (d) => {
    const bar = el("div", { style: `width:${((100 * d.n) / top).toFixed(1)}%` });
    if (d.shadow) bar.className = "shadowed";
    return [[d.route], [d.shadow ? `${d.rule} (shadow)` : d.rule], [d.tier], [fmt(d.n), "num"], [d.rate.toFixed(2), "num"], [bar, "bar"]];
  });
  rows($("keys").tBodies[0], s.topKeys || [], (k) => [[k.key, "key"], [k.shadow ? `${k.rule} (shadow)` : k.rule], [fmt(k.n), "num"],
    [k.subject || "", "subject"]]);
  if (s.trend) {
    $("rules-step").textContent = `${s.trend.step} s`;
    ruleRows($("rules").tBodies[0], s.trend);
  }
  const untracked = $("untracked");
  untracked.hidden = !s.untrackedKeys;
  untracked.textContent = s.untrackedKeys ? `and ${fmt(s.untrackedKeys)} denials of keys not tracked (over 128 keys denied in one second)` : "";
  rows($("sources").tBodies[0], s.sources || [], (c) => [[c.source], [c.outcome], [fmt(c.n), "num"]]);

  const h = s.health || {};
  const paths = (h.limiters || []).map((l) => ({ name: `hybrid (${l.failurePolicy})`, breaker: l.breaker,
    commands: l.redisCommands, errors: l.redisErrors, refused: l.redisRejected, pending: l.pending }));
  if (h.strict) {
    paths.push({ name: "strict", breaker: h.strict.Breaker, commands: h.strict.Calls, errors: h.strict.Errors,
      refused: h.strict.Rejected, pending: "" });
  }
  rows($("health").tBodies[0], paths, (p) => [[p.name], [p.breaker, `state-${p.breaker}`], [fmt(p.commands), "num"],
    [fmt(p.errors), "num"], [fmt(p.refused), "num"], [p.pending === "" ? "" : fmt(p.pending), "num"]]);
  const badge = $("redis");
  badge.textContent = h.ok ? "Redis OK · breakers closed" : "Redis trouble · a breaker is open";
  badge.className = `badge ${h.ok ? "ok" : "bad"}`;
  document.body.dataset.updated = s.now;
  document.body.dataset.totalDenied = s.totals.denied;
}

let fleetSel = new URLSearchParams(location.search).get("instance") || ""; // a report id; "": the whole fleet
let lastFleet = null;

function renderFleet(v) {
  lastFleet = v;
  $("fleet").hidden = false;
  const insts = v.instances || [];
  if (fleetSel && !insts.some((m) => m.id === fleetSel)) fleetSel = "";
  const sum = (a) => (a || []).reduce((x, y) => x + y, 0);
  const denied = insts.reduce((a, m) => a + m.totals.denied, 0);
  const st = v.sum.step || 1, len = st * (v.sum.checks || []).length;
  $("fleet-meta").textContent = `${insts.length} live instance${insts.length === 1 ? "" : "s"} · ${fmt(denied)} denied since their start` +
    ` · rates over the last whole step of ${st} s, trends over ${len >= 120 ? `${Math.round(len / 60)} min` : `${len} s`}`;
  const tbody = $("instances").tBodies[0];
  rows(tbody, insts, (m) => {
    const st = m.trend.step || 1;
    return [[m.self ? `${m.instance} (this one)` : m.instance], [`${fmt1(m.age)} s`, "num"],
      [fmt1(recent(m.trend.checks, st)), "num"], [fmt1(recent(m.trend.denied, st)), "num"], [fmt(sum(m.trend.denied)), "num"],
      [fmt(m.totals.denied), "num"], [m.ok ? "OK" : "breaker open", m.ok ? "state-closed" : "state-open"]];
  });
  [...tbody.rows].forEach((tr, i) => {
    const id = insts[i].id;
    tr.dataset.id = id;
    tr.title = id;
    if (id === fleetSel) tr.className = "selected";
    tr.onclick = () => { fleetSel = fleetSel === id ? "" : id; renderFleet(lastFleet); };
  });
  const sel = insts.find((m) => m.id === fleetSel);
  const scope = sel ? sel.instance : "all instances";
  $("fleet-scope").textContent = scope;
  $("fleet-scope-subjects").textContent = scope;
  ruleRows($("fleet-rules").tBodies[0], sel ? sel.trend : v.sum);
  const subjects = sel ? (sel.subjects || []).map((k) => ({ ...k, instances: [sel.instance] })) : (v.subjects || []);
  rows($("fleet-subjects").tBodies[0], subjects, (k) => [[k.key, "key"], [k.subject || "", "subject"],
    [k.shadow ? `${k.rule} (shadow)` : k.rule], [fmt(k.n), "num"], [(k.instances || []).join(", ")]]);
  document.body.dataset.fleetUpdated = v.now;
}

let ticks = 0;
async function fleetTick() {
  try {
    const r = await fetch("api/fleet", { cache: "no-store" });
    if (r.status === 404) { $("fleet").hidden = true; return; }
    if (!r.ok) throw new Error(`api/fleet: ${r.status} ${(await r.text()).trim()}`);
    renderFleet(await r.json());
    $("fleet-error").hidden = true;
  } catch (e) {
    $("fleet").hidden = false;
    $("fleet-error").textContent = `Cannot update the fleet view: ${e.message}`;
    $("fleet-error").hidden = false;
  }
}

async function tick() {
  if (ticks++ % 2 === 0) fleetTick();
  try {
    const r = await fetch(`api/snapshot?span=${SPAN}`, { cache: "no-store" });
    if (!r.ok) throw new Error(`api/snapshot: ${r.status}`);
    render(await r.json());
    $("error").hidden = true;
  } catch (e) {
    $("error").textContent = `Cannot update: ${e.message}`;
    $("error").hidden = false;
  }
  setTimeout(tick, 1000);
}
for (const a of document.querySelectorAll("#spans a")) {
  if (a.getAttribute("href") === `?span=${SPAN}`) a.className = "current";
}
tick();
