// Live dashboard: polls /api/dashboard and draws SVG charts (no external libraries).
"use strict";
const COLORS = ["#2f6fde", "#e0662e", "#2ea86b", "#9b51e0", "#c9a227", "#d6457a"];
const NS = "http://www.w3.org/2000/svg";

function el(tag, attrs, parent, text) {
  const node = document.createElementNS(NS, tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
  if (text !== undefined) node.textContent = text;
  if (parent) parent.appendChild(node);
  return node;
}

function frame(svg, xs, ys, fmtX, fmtY) {
  // Axes and ticks; returns scale functions into the plot area.
  svg.replaceChildren();
  const box = svg.viewBox.baseVal;
  const left = 46, right = box.width - 10, top = 10, bottom = box.height - 24;
  const [x0, x1] = xs, [y0, y1] = ys;
  const sx = (x) => left + ((x - x0) / (x1 - x0 || 1)) * (right - left);
  const sy = (y) => bottom - ((y - y0) / (y1 - y0 || 1)) * (bottom - top);
  for (const y of niceTicks(y0, y1)) {
    el("line", { x1: left, x2: right, y1: sy(y), y2: sy(y), class: "grid" }, svg);
    el("text", { x: left - 6, y: sy(y) + 4, "text-anchor": "end", class: "tick" }, svg, fmtY(y));
  }
  for (let i = 0; i <= 4; i++) {
    const x = x0 + ((x1 - x0) * i) / 4;
    el("text", { x: sx(x), y: bottom + 16, "text-anchor": "middle", class: "tick" }, svg, fmtX(x));
  }
  el("line", { x1: left, x2: right, y1: bottom, y2: bottom, class: "axis" }, svg);
  el("line", { x1: left, x2: left, y1: top, y2: bottom, class: "axis" }, svg);
  return { sx, sy };
}

function niceTicks(lo, hi) {
  // about five ticks at round values (1, 2 or 5 times a power of ten) inside [lo, hi]
  const span = hi - lo;
  if (!(span > 0) || !isFinite(span)) return [lo];
  const raw = span / 5, power = 10 ** Math.floor(Math.log10(raw));
  const step = [1, 2, 5, 10].map((m) => m * power).find((s) => s >= raw);
  const ticks = [];
  for (let t = Math.ceil(lo / step) * step; t <= hi + step * 1e-9; t += step) ticks.push(Math.abs(t) < step * 1e-9 ? 0 : t);
  return ticks;
}

function decimals(lo, hi) {
  // enough decimals to tell round ticks apart
  const span = hi - lo;
  return span > 0 && isFinite(span) ? Math.max(0, Math.min(6, 1 - Math.floor(Math.log10(span / 5)))) : 2;
}

function path(points, sx, sy) {
  return points.map(([x, y], i) => `${i ? "L" : "M"}${sx(x).toFixed(1)},${sy(y).toFixed(1)}`).join("");
}

function range(values, pad, floor) {
  let lo = Math.min(...values), hi = Math.max(...values);
  if (!isFinite(lo)) return [0, 1];
  if (hi - lo < 1e-9) { lo -= 0.05; hi += 0.05; }
  const margin = (hi - lo) * pad;
  lo = floor === undefined ? lo - margin : Math.max(floor, lo - margin);
  return [lo, hi + margin];
}

const clock = (t) => new Date(t * 1000).toLocaleTimeString([], { hour: "2-digit", minute: "2-digit", second: "2-digit" });
const fixed = (n) => (v) => v.toFixed(n);

function drawNdcg(snaps, variants) {
  const svg = document.getElementById("ndcg-chart");
  const values = [], times = snaps.map((s) => s.t);
  const early = (s, v) => ((s.regression || {})[v] || {}).provisional;
  for (const s of snaps) for (const v of variants) {
    const m = s.ndcg[v]; if (m) { if (m.raw !== undefined) values.push(m.raw); if (m.adjusted !== undefined) values.push(m.adjusted); }
    if (early(s, v) !== undefined) values.push(early(s, v));
  }
  const { sx, sy } = frame(svg, [Math.min(...times), Math.max(...times)], range(values, 0.1, 0), clock, fixed(2));
  const legend = document.getElementById("ndcg-legend");
  legend.replaceChildren();
  variants.forEach((v, i) => {
    const color = COLORS[i % COLORS.length];
    for (const kind of ["raw", "adjusted"]) {
      const pts = snaps.filter((s) => s.ndcg[v] && s.ndcg[v][kind] !== undefined).map((s) => [s.t, s.ndcg[v][kind]]);
      if (!pts.length) continue;
      el("path", { d: path(pts, sx, sy), fill: "none", stroke: color, "stroke-width": 2,
                   "stroke-dasharray": kind === "raw" ? "" : "6 4", class: `series ${kind}`, "data-variant": v }, svg);
    }
    // provisional: the newest requests' estimated final nDCG (dotted, with its band)
    const young = snaps.filter((s) => early(s, v) !== undefined).map((s) => [s.t, s.regression[v]]);
    if (young.length) {
      const upper = young.map(([t, r]) => [t, r.provisional + r.band]), lower = young.map(([t, r]) => [t, r.provisional - r.band]).reverse();
      el("path", { d: path(upper.concat(lower), sx, sy) + "Z", fill: color, opacity: 0.1, class: "band provisional" }, svg);
      el("path", { d: path(young.map(([t, r]) => [t, r.provisional]), sx, sy), fill: "none", stroke: color, "stroke-width": 1.5,
                   "stroke-dasharray": "1 3", class: "series provisional", "data-variant": v }, svg);
    }
    const last = snaps[snaps.length - 1].ndcg[v] || {};
    const state = (snaps[snaps.length - 1].regression || {})[v] || {};
    const span = document.createElement("span");
    const t = (((window.__truth || {}).ndcg || {})[v] || {})[`@${document.querySelector(".k").textContent}`];
    const truth = t ? ` (simulator truth: raw ${t.raw.toFixed(3)}, debiased ${t.debiased.toFixed(3)})` : "";
    const guess = state.provisional === undefined ? "" : `, provisional <b>${state.provisional.toFixed(4)}</b> ± ${state.band.toFixed(4)}`;
    span.innerHTML = `<i class="swatch" style="background:${color}"></i>${v}: raw <b>${(last.raw ?? NaN).toFixed(4)}</b>, adjusted <b>${(last.adjusted ?? NaN).toFixed(4)}</b>${guess}${truth}`;
    if (state.flag) {  // built as text: the variant name comes from the events
      const warn = document.createElement("b");
      warn.className = "regression";
      warn.textContent = ` ⚠ in regression since ${new Date(state.since * 1000).toISOString().replace("T", " ").slice(0, 16)} (event time)`;
      span.appendChild(warn);
    }
    legend.appendChild(span);
  });
}

function drawAb(snaps, field = "ab", chart = "ab-chart", figures = "ab-text") {
  // a difference (or preference) since each experiment's start, with its always-valid band
  const svg = document.getElementById(chart);
  const keys = [...new Set(snaps.flatMap((s) => Object.keys(s[field] || {})))];
  const text = document.getElementById(figures);
  if (!keys.length) { svg.replaceChildren(); text.textContent = field === "ab" ? "no comparison yet" : "no interleaved lists"; return; }
  snaps = snaps.map((s) => ({ t: s.t, ab: s[field] || {} }));
  // the y-axis follows the recent band (the newer half of the history), not the
  // first wide intervals of a young experiment
  const values = [0];
  for (const s of snaps.slice(Math.floor(snaps.length / 2))) for (const k of keys) { const a = s.ab[k]; if (a) values.push(a.diff, a.lower ?? a.diff, a.upper ?? a.diff, a.cuped_lower ?? a.diff, a.cuped_upper ?? a.diff); }
  const times = snaps.map((s) => s.t);
  const yr = range(values.filter(isFinite), 0.1);
  const { sx, sy } = frame(svg, [Math.min(...times), Math.max(...times)], yr, clock, fixed(decimals(...yr)));
  el("line", { x1: sx(times[0]), x2: sx(times[times.length - 1]), y1: sy(0), y2: sy(0), stroke: "#888", "stroke-dasharray": "3 3" }, svg);
  const lines = [];
  keys.forEach((k, i) => {
    const color = COLORS[(i + 1) % COLORS.length];
    const pts = snaps.filter((s) => s.ab[k]).map((s) => [s.t, s.ab[k]]);
    const band = pts.filter(([, a]) => a.lower !== undefined && a.upper !== undefined);
    if (band.length) {
      const upper = band.map(([t, a]) => [t, a.upper]), lower = band.map(([t, a]) => [t, a.lower]).reverse();
      el("path", { d: path(upper.concat(lower), sx, sy) + "Z", fill: color, opacity: 0.15, class: "band" }, svg);
    }
    // the CUPED-adjusted band: outlined, inside the unadjusted one when the covariate helps
    const cuped = pts.filter(([, a]) => a.cuped_lower !== undefined && a.cuped_upper !== undefined);
    if (cuped.length) {
      const upper = cuped.map(([t, a]) => [t, a.cuped_upper]), lower = cuped.map(([t, a]) => [t, a.cuped_lower]).reverse();
      el("path", { d: path(upper.concat(lower), sx, sy) + "Z", fill: color, opacity: 0.3, stroke: color, "stroke-dasharray": "4 2", class: "band cuped" }, svg);
    }
    el("path", { d: path(pts.map(([t, a]) => [t, a.diff]), sx, sy), fill: "none", stroke: color, "stroke-width": 2, class: "series diff" }, svg);
    const a = pts[pts.length - 1][1];
    const lo = a.lower === undefined ? "…" : a.lower.toFixed(4), hi = a.upper === undefined ? "…" : a.upper.toFixed(4);
    const verdict = a.lower === undefined ? "too early to tell" : a.lower > 0 ? "better" : a.upper < 0 ? "worse" : "not yet decided";
    const p = a.p === undefined ? "" : `, sequential p ${a.p < 0.001 ? a.p.toExponential(1) : a.p.toFixed(3)}`;
    const share = a.share === undefined ? "" : `, wins ${Math.round(100 * a.share)}% of decided lists`;
    const adjusted = a.cuped_lower === undefined ? share :
      `; CUPED ${a.cuped_diff.toFixed(4)} [${a.cuped_lower.toFixed(4)}, ${a.cuped_upper.toFixed(4)}]` +
      (a.cuped_reduction === undefined ? "" : `, ${Math.round(100 * a.cuped_reduction)}% less variance`);
    lines.push(`${k}: ${a.diff.toFixed(4)} [${lo}, ${hi}]${p}${adjusted} — ${verdict}`);
  });
  text.textContent = lines.join("  ·  ");
}

function drawUsers(snaps) {
  // exposed users per arm since each experiment's start, and the sample-ratio test
  const svg = document.getElementById("users-chart");
  const text = document.getElementById("users-text");
  const keys = [...new Set(snaps.flatMap((s) => Object.entries(s.users || {}).flatMap(([e, u]) => Object.keys(u).map((v) => `${e}/${v}`))))];
  if (!keys.length) { svg.replaceChildren(); text.textContent = "no exposures yet"; return; }
  const get = (s, key) => { const [e, v] = key.split("/"); return ((s.users || {})[e] || {})[v]; };
  const times = snaps.map((s) => s.t);
  const values = snaps.flatMap((s) => keys.map((k) => get(s, k))).filter((v) => v !== undefined);
  const yr = [0, Math.max(1, ...values) * 1.1];
  const { sx, sy } = frame(svg, [Math.min(...times), Math.max(...times)], yr, clock, (v) => Math.round(v).toLocaleString());
  keys.forEach((k, i) => {
    const pts = snaps.filter((s) => get(s, k) !== undefined).map((s) => [s.t, get(s, k)]);
    el("path", { d: path(pts, sx, sy), fill: "none", stroke: COLORS[i % COLORS.length], "stroke-width": 2, class: "series users", "data-arm": k }, svg);
  });
  const last = snaps[snaps.length - 1];
  const lines = [];
  for (const [exp, users] of Object.entries(last.users || {})) {
    const arms = Object.entries(users).map(([v, n]) => `${v} ${Math.round(n).toLocaleString()}`).join(" / ");
    const srm = (last.srm || {})[exp];
    const warn = srm !== undefined && srm < 0.001 ? " ⚠ sample-ratio mismatch: the split is not as configured; do not trust the comparison" : "";
    lines.push(`${exp}: ${arms}${srm === undefined ? "" : ` · SRM p ${srm.toFixed(4)}`}${warn}`);
  }
  text.textContent = lines.join("  ·  ");
  text.classList.toggle("warn", lines.some((l) => l.includes("⚠")));
}

function eventTimeNote(snaps) {
  // the demo's simulated traffic runs event time faster than the wall clock
  const marked = snaps.filter((s) => s.watermark !== undefined);
  const note = document.getElementById("time-note");
  if (marked.length < 2) { note.textContent = ""; return; }
  const a = marked[0], b = marked[marked.length - 1];
  const speed = (b.watermark - a.watermark) / Math.max(1e-9, b.t - a.t);
  note.textContent = speed > 1.5 ? `event time runs ${speed.toFixed(0)}× faster than the wall clock (simulated traffic): windows and attribution are in event time` : "";
}

function drawRequests(snap, variants) {
  const svg = document.getElementById("requests-chart");
  const values = variants.map((v) => snap.requests[v] || 0);
  const { sx, sy } = frame(svg, [0, variants.length], [0, Math.max(1, ...values) * 1.1], () => "", (v) => Math.round(v).toString());
  variants.forEach((v, i) => {
    const x = sx(i + 0.2), w = sx(i + 0.8) - x;
    el("rect", { x, y: sy(values[i]), width: w, height: sy(0) - sy(values[i]), fill: COLORS[i % COLORS.length], class: "bar" }, svg);
    el("text", { x: x + w / 2, y: sy(0) + 16, "text-anchor": "middle", class: "tick" }, svg, `${v} (${values[i]})`);
  });
}

function drawPropensity(snap) {
  const svg = document.getElementById("propensity-chart");
  const text = document.getElementById("propensity-text");
  const curves = Object.entries(snap.propensity);
  if (!curves.length) { svg.replaceChildren(); text.textContent = "estimation off (set propensity.estimator)"; return; }
  const width = Math.max(...curves.map(([, c]) => c.length));
  const { sx, sy } = frame(svg, [1, width], [0, 1.05], (x) => Math.round(x).toString(), fixed(2));
  curves.forEach(([name, curve], i) => {
    const pts = curve.map((v, k) => [k + 1, v]);
    el("path", { d: path(pts, sx, sy), fill: "none", stroke: COLORS[(i + 2) % COLORS.length], "stroke-width": 2, class: "series propensity", "data-estimator": name }, svg);
    for (const [x, y] of pts) el("circle", { cx: sx(x), cy: sy(y), r: 2.5, fill: COLORS[(i + 2) % COLORS.length] }, svg);
  });
  text.replaceChildren();
  curves.forEach(([name], i) => {
    const span = document.createElement("span");
    span.innerHTML = `<i class="swatch" style="background:${COLORS[(i + 2) % COLORS.length]}"></i>${name}: fitted η = <b>${(snap.eta[name] ?? NaN).toFixed(3)}</b> `;
    text.appendChild(span);
  });
  const truth = (window.__truth || {}).propensity;
  if (truth) {
    el("path", { d: path(truth.map((v, k) => [k + 1, v]), sx, sy), fill: "none", stroke: "#888", "stroke-dasharray": "4 3", class: "truth" }, svg);
    const span = document.createElement("span");
    span.innerHTML = `<i class="swatch" style="background:#888"></i>simulator truth (η = ${window.__truth.eta})`;
    text.appendChild(span);
  }
}

function drawMetrics(snap, metrics, variants) {
  // every exported ranking metric of the registry: the columns come from the server;
  // built as DOM nodes, since variant names come from the events
  const table = document.getElementById("metrics-table");
  const shown = metrics.filter((m) => variants.some((v) => (snap.metrics[v] || {})[m.name] !== undefined));
  const row = (cells, tag, variant) => {
    const tr = document.createElement("tr");
    if (variant !== undefined) tr.dataset.variant = variant;
    for (const c of cells) { const td = document.createElement(tag); td.textContent = c; tr.appendChild(td); }
    return tr;
  };
  table.replaceChildren(row(["variant", ...shown.map((m) => m.label)], "th"));
  for (const v of variants) {
    const values = shown.map((m) => { const x = (snap.metrics[v] || {})[m.name]; return x === undefined ? "…" : x.toFixed(4); });
    table.appendChild(row([v, ...values], "td", v));
  }
}

function drawHealth(snap) {
  const items = Object.entries(snap.health).map(([k, v]) => `<div>${k.replaceAll("_", " ")}: <b>${Number.isInteger(v) ? v : v.toFixed(2)}</b></div>`);
  document.getElementById("health").innerHTML = items.join("");
}

async function refresh() {
  const status = document.getElementById("status");
  try {
    const reply = await fetch("/api/dashboard", { cache: "no-store" });
    const data = await reply.json();
    window.__truth = data.truth;
    const snaps = data.snapshots.filter((s) => Object.keys(s.ndcg).length);
    document.querySelectorAll(".k").forEach((n) => (n.textContent = data.k));
    document.querySelectorAll(".window").forEach((n) => (n.textContent = data.window));
    const latest = data.snapshots[data.snapshots.length - 1];
    if (latest) drawHealth(latest);
    if (!snaps.length) { status.textContent = "waiting for the first finalised requests…"; return; }
    const last = snaps[snaps.length - 1];
    const variants = Object.keys(last.ndcg).sort();
    drawNdcg(snaps, variants);
    drawMetrics(last, data.metrics || [], variants);
    drawAb(snaps);
    drawAb(snaps, "interleaving", "il-chart", "il-text");
    drawUsers(snaps);
    eventTimeNote(data.snapshots);
    drawRequests(last, variants);
    drawPropensity(last);
    status.textContent = `live · updated ${clock(last.t)}`;
    status.className = "status ok";
    document.body.dataset.ready = "true";
  } catch (err) {
    status.textContent = `cannot reach the evaluator: ${err}`;
    status.className = "status";
  }
}

refresh();
setInterval(refresh, 2000);
