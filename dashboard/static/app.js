// hybridrate dashboard: polls api/snapshot every second and draws it. No dependencies.
"use strict";

const SPAN = Number(new URLSearchParams(location.search).get("span")) || 300;
const SVG = "http://www.w3.org/2000/svg";
const $ = (id) => document.getElementById(id);
const fmt = (n) => Number(n).toLocaleString("en-US");
const fmt1 = (n) => (Math.round(n * 10) / 10).toLocaleString("en-US", { minimumFractionDigits: 1, maximumFractionDigits: 1 });

function el(tag, attrs, text) {
  const e = tag === "svg" || ["path", "line", "text", "g"].includes(tag)
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
  rows($("keys").tBodies[0], s.topKeys || [], (k) => [[k.key, "key"], [k.shadow ? `${k.rule} (shadow)` : k.rule], [fmt(k.n), "num"]]);
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

async function tick() {
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
