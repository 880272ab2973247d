// Tidal's dashboard: one page, no build step. It reads the API with the session cookie (set by POST
// /ui/login), follows GET /v1/events/stream (server-sent events) and redraws the view on each event.
// Every request that changes anything carries X-Tidal-UI: 1, which the server demands of cookie-
// authenticated requests (a cross-site page cannot send it). Text from the server goes in as text, never as HTML.
"use strict";

const TIERS = ["premium", "standard", "basic"];
const LOG_TAIL = 64 * 1024;
const st = { me: null, view: null, arg: null, events: null, busy: false, again: null, timer: null, pending: null,
             job: null, log: { job: null, offset: 0, text: "" }, filters: { state: "", tier: "", user: "", q: "" } };

// -- small DOM helpers ----------------------------------------------------------------------------------
function el(tag, attrs, ...kids) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "text") e.textContent = v;
    else if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
    else e.setAttribute(k, v === true ? "" : v);
  }
  for (const kid of kids.flat()) if (kid !== null && kid !== undefined) e.append(kid);
  return e;
}
function svg(tag, attrs, ...kids) {
  const e = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  for (const kid of kids.flat()) if (kid) e.append(kid);
  return e;
}
const $ = (id) => document.getElementById(id);
const pct = (x) => (x === null || x === undefined ? "–" : (100 * x).toFixed(1) + " %");
const fmtS = (s) => (s === null || s === undefined ? "–" : s < 90 ? s.toFixed(1) + " s" : s < 5400
  ? (s / 60).toFixed(1) + " min" : (s / 3600).toFixed(1) + " h");
const fmtB = (b) => (b >= 2 ** 30 ? (b / 2 ** 30).toFixed(2) + " GiB" : b >= 2 ** 20 ? (b / 2 ** 20).toFixed(1) + " MiB"
  : b >= 1024 ? (b / 1024).toFixed(0) + " KiB" : b + " B");

// -- the API ------------------------------------------------------------------------------------------------
class ApiError extends Error {
  constructor(status, body) { super((body && body.message) || "HTTP " + status); this.status = status; this.body = body; }
}
async function api(path, opts = {}) {
  const init = { method: opts.method || "GET", credentials: "same-origin", headers: { "X-Tidal-UI": "1" } };
  if (opts.body !== undefined) { init.body = JSON.stringify(opts.body); init.headers["Content-Type"] = "application/json"; }
  const r = await fetch(path, init);
  if (opts.raw && r.ok) return r;
  let body = null;
  try { body = await r.json(); } catch (e) { body = null; }
  if (!r.ok) {
    if (r.status === 401 && !opts.login) loggedOut();
    throw new ApiError(r.status, body);
  }
  return body;
}
function showError(e) {
  $("error").textContent = e ? (e.message + (e.body && e.body.hint ? " — " + e.body.hint : "")) : "";
}

// -- log-in -------------------------------------------------------------------------------------------------
async function start() {
  $("login-form").addEventListener("submit", async (ev) => {
    ev.preventDefault();
    $("login-error").textContent = "";
    try {
      st.me = await api("/ui/login", { method: "POST", body: { token: $("token").value }, login: true });
      $("token").value = "";
      loggedIn();
    } catch (e) {
      $("login-error").textContent = "Log-in refused: " + e.message;
    }
  });
  $("logout").addEventListener("click", async () => {
    try { await api("/ui/logout", { method: "POST" }); } finally { loggedOut(); }
  });
  window.addEventListener("hashchange", route);
  try {
    st.me = await api("/v1/whoami", { login: true });
    loggedIn();
  } catch (e) {
    loggedOut();
  }
}
function loggedIn() {
  $("login").hidden = true;
  $("nav").hidden = false;
  $("logout").hidden = false;
  $("who").textContent = st.me.name + " (" + st.me.role + ")";
  follow();
  if (!st.timer) st.timer = setInterval(refresh, 3000); // figures that change without an event (steps/s)
  route();
}
function loggedOut() {
  st.me = null;
  if (st.events) { st.events.close(); st.events = null; }
  if (st.timer) { clearInterval(st.timer); st.timer = null; }
  $("live").classList.remove("on");
  for (const v of document.querySelectorAll(".view")) v.hidden = true;
  $("nav").hidden = true;
  $("logout").hidden = true;
  $("who").textContent = "";
  $("login").hidden = false;
}

// -- live updates: the event stream ----------------------------------------------------------------------
function follow() {
  if (st.events) return;
  const es = new EventSource("/v1/events/stream");
  es.onopen = () => $("live").classList.add("on");
  es.onerror = () => $("live").classList.remove("on"); // EventSource reconnects by itself (Last-Event-ID)
  es.onmessage = (m) => {
    let ev;
    try { ev = JSON.parse(m.data); } catch (e) { return; }
    if (st.view === "job" && st.job && ev.job === st.job.id) addEvent(ev);
    refreshSoon();
  };
  st.events = es;
}
function refreshSoon() {
  if (st.pending) return;
  st.pending = setTimeout(() => { st.pending = null; refresh(); }, 250);
}

// -- routing ------------------------------------------------------------------------------------------------
function route() {
  if (!st.me) return;
  const parts = (location.hash || "#/cluster").slice(2).split("/");
  st.view = ["cluster", "jobs", "job", "sla"].includes(parts[0]) ? parts[0] : "cluster";
  st.arg = parts[1] ? decodeURIComponent(parts[1]) : null;
  for (const v of document.querySelectorAll(".view")) v.hidden = v.id !== "view-" + st.view;
  for (const a of document.querySelectorAll("#nav a")) a.classList.toggle("active", a.dataset.view === st.view);
  st.job = null;
  // Nothing of what the view showed last time (another job, figures of then) until it is drawn anew.
  $("view-" + st.view).replaceChildren();
  delete $("view-" + st.view).dataset.job;
  showError(null);
  refresh(true);
}
// One redraw at a time (two would both append the same log bytes): one asked for meanwhile runs after.
async function refresh(fresh) {
  if (!st.me) return;
  if (st.busy) { st.again = st.again === "fresh" || fresh === true ? "fresh" : "again"; return; }
  st.busy = true;
  try {
    if (st.view === "cluster") drawCluster(await api("/v1/ui/cluster"));
    else if (st.view === "jobs") drawJobs(await api("/v1/ui/jobs"));
    else if (st.view === "sla") drawSla(await api("/v1/ui/cluster"));
    else if (st.view === "job") await drawJob(fresh === true);
  } catch (e) {
    if (!(e instanceof ApiError && e.status === 401)) showError(e);
  } finally {
    st.busy = false;
    if (st.again) {
      const again = st.again;
      st.again = null;
      refresh(again === "fresh");
    }
  }
}

// -- charts -------------------------------------------------------------------------------------------------
// A line chart of series [{name, cls, points: [[t, y]]}] with y in [0, 1] and dashed target lines.
function chart(title, series, targets = [], w = 520, h = 170) {
  const pad = { l: 36, r: 90, t: 18, b: 20 };
  const all = series.flatMap((s) => s.points.map((p) => p[0]));
  const t0 = all.length ? Math.min(...all) : 0, t1 = all.length ? Math.max(...all) : 1;
  const x = (t) => pad.l + (t1 > t0 ? (t - t0) / (t1 - t0) : 1) * (w - pad.l - pad.r);
  const y = (v) => pad.t + (1 - Math.max(0, Math.min(1.05, v)) / 1.05) * (h - pad.t - pad.b);
  const g = svg("svg", { class: "chart", width: w, height: h, viewBox: `0 0 ${w} ${h}`, role: "img", "aria-label": title });
  g.append(svg("text", { x: pad.l, y: 12 }, document.createTextNode(title)));
  for (const v of [0, 0.5, 1]) {
    g.append(svg("line", { x1: pad.l, x2: w - pad.r, y1: y(v), y2: y(v), stroke: "#e5e8e8" }));
    g.append(svg("text", { x: 4, y: y(v) + 3 }, document.createTextNode((v * 100).toFixed(0) + "%")));
  }
  for (const tg of targets) {
    g.append(svg("line", { x1: pad.l, x2: w - pad.r, y1: y(tg.y), y2: y(tg.y), stroke: tg.color, "stroke-dasharray": "4 3" }));
  }
  series.forEach((s, i) => {
    if (!s.points.length) return;
    const d = s.points.map((p, k) => (k ? "L" : "M") + x(p[0]).toFixed(1) + " " + y(p[1]).toFixed(1)).join(" ");
    g.append(svg("path", { d, fill: "none", stroke: s.color, "stroke-width": s.width || 2, "stroke-opacity": s.opacity || 1,
                           class: "series", "data-name": s.name }));
    g.append(svg("rect", { x: w - pad.r + 8, y: pad.t + i * 16, width: 10, height: 10, fill: s.color }));
    g.append(svg("text", { x: w - pad.r + 22, y: pad.t + i * 16 + 9 }, document.createTextNode(s.name)));
  });
  if (all.length) g.append(svg("text", { x: pad.l, y: h - 5 }, document.createTextNode(
    "the last " + fmtS(t1 - t0))));
  return g;
}
// The control plane's samples (oldest first), and the figures of this moment after them.
function withNow(c) {
  const last = c.trend[c.trend.length - 1];
  const now = { time: c.time, utilisation: c.utilisation, goodput: c.goodput,
                sla: Object.fromEntries(TIERS.map((t) => [t, c.sla[t].attainment])) };
  return last && last.time >= c.time ? c.trend : [...c.trend, now];
}
const COLORS = { premium: "#c0392b", standard: "#e67e22", basic: "#2e86c1", utilisation: "#566573", goodput: "#27ae60" };

// -- Cluster ------------------------------------------------------------------------------------------------
function drawCluster(c) {
  const v = $("view-cluster");
  const groups = new Map();
  for (const n of c.nodes) {
    const key = n.region + " / " + n.cluster;
    if (!groups.has(key)) groups.set(key, []);
    groups.get(key).push(n);
  }
  const lost = c.nodes.filter((n) => !n.up).length;
  const trend = withNow(c);
  v.replaceChildren(
    el("h1", { text: "Cluster" }),
    el("div", { class: "cards" },
      card("devices", c.devices), card("held", c.used), card("idle", c.devices - c.used),
      card("nodes lost", lost), card("utilisation", pct(c.utilisation)), card("goodput", pct(c.goodput))),
    el("div", { class: "legend" }, ...TIERS.map((t) => el("span", {}, el("span", { class: "sw " + t }), t)),
      el("span", {}, el("span", { class: "sw" }), "idle"), el("span", {}, el("span", { class: "sw lost" }), "lost node")),
    ...[...groups.entries()].map(([key, nodes]) => el("div", { class: "group" }, el("h3", { text: key }),
      el("div", { class: "nodes" }, ...nodes.map(drawNode)))),
    el("h2", { text: "Utilisation and goodput" }),
    el("p", { class: "muted", text: "Utilisation: devices held by jobs / devices of nodes that are up. Goodput: devices whose job is running (not checkpointing, restoring or moving) / devices. Sampled by the control plane every 10 s, the last hour; Prometheus keeps more." }),
    chart("utilisation, goodput", [
      { name: "utilisation", color: COLORS.utilisation, width: 6, opacity: 0.35, points: trend.map((p) => [p.time, p.utilisation]) },
      { name: "goodput", color: COLORS.goodput, points: trend.map((p) => [p.time, p.goodput]) }]),
  );
}
function card(label, value) { return el("div", { class: "card" }, el("b", { text: String(value) }), label); }
function drawNode(n) {
  const state = n.up ? (n.drained ? "drained" : "up") : "lost";
  return el("div", { class: "node" + (n.up ? "" : " lost") + (n.drained ? " drained" : ""), "data-node": n.name },
    el("span", { class: "name", text: n.name }),
    el("span", { class: "state", text: state, title: n.drained }),
    el("div", { class: "devs" }, ...n.devices.map((d) => {
      const cls = "dev" + (n.up ? "" : " lost") + (d.tier ? " " + d.tier : "") + (d.tier && !d.job ? " busy" : "");
      const title = `${n.name}:${d.index} — ` + (d.tier ? (d.job ? `${d.job} ${d.name} (${d.owner}), ${d.tier}, ${d.state}`
        : `another user's ${d.tier} job`) : n.up ? "idle" : "node lost");
      const attrs = { class: cls, title, "data-device": d.index, "data-tier": d.tier || "idle", "data-job": d.job || "" };
      return d.job ? el("a", { ...attrs, href: "#/job/" + encodeURIComponent(d.job) }) : el("span", attrs);
    })));
}

// -- Jobs ---------------------------------------------------------------------------------------------------
function drawJobs(rows) {
  const v = $("view-jobs");
  const f = st.filters;
  if (!v.querySelector(".filters")) {
    const input = (key, attrs) => el("input", { ...attrs, value: f[key], oninput: (e) => { f[key] = e.target.value; refreshSoon(); } });
    const select = (key, opts) => {
      const e = el("select", { name: key, onchange: (ev) => { f[key] = ev.target.value; refreshSoon(); } },
        el("option", { value: "", text: "any " + key }), ...opts.map((o) => el("option", { value: o, text: o })));
      e.value = f[key];
      return e;
    };
    v.replaceChildren(el("h1", { text: "Jobs" }),
      el("div", { class: "filters" },
        select("state", ["pending", "running", "checkpointing", "preempted", "migrating", "resizing", "restoring",
          "held", "succeeded", "failed", "cancelled"]),
        select("tier", TIERS),
        input("user", { name: "user", placeholder: "user", size: 10 }),
        input("q", { name: "q", placeholder: "id or name", size: 14 })),
      el("div", { class: "table" }));
  }
  const now = Date.now() / 1000;
  const shown = rows.filter((j) => (!f.state || j.state === f.state) && (!f.tier || j.tier === f.tier)
    && (!f.user || j.owner.includes(f.user)) && (!f.q || j.id.includes(f.q) || j.name.includes(f.q)));
  const head = ["job", "name", "state", "tier", "user", "ranks", "devices", "nodes", "steps", "steps/s", "age"];
  v.querySelector(".table").replaceChildren(el("table", { id: "jobs" },
    el("thead", {}, el("tr", {}, ...head.map((h) => el("th", { text: h })))),
    el("tbody", {}, ...shown.map((j) => el("tr", { "data-job": j.id },
      el("td", {}, el("a", { href: "#/job/" + encodeURIComponent(j.id), text: j.id })),
      el("td", { text: j.name }), el("td", { class: "state-" + j.state, text: j.state + (j.held ? " (held)" : "") }),
      el("td", { class: "tier " + j.tier, text: j.tier }), el("td", { text: j.owner }),
      el("td", { class: "num", text: String(j.ranks) }), el("td", { class: "num", text: String(j.devices) }),
      el("td", { text: j.nodes.join(", ") }),
      el("td", { class: "num", text: j.steps === null || j.steps === undefined ? "–" : String(j.steps) }),
      el("td", { class: "num", text: j.steps_per_s === null || j.steps_per_s === undefined ? "–" : j.steps_per_s.toFixed(2) }),
      el("td", { class: "num", text: fmtS(Math.max(0, now - j.submitted_at)) }))))),
    el("p", { class: "muted", text: `${shown.length} of ${rows.length} jobs` + (st.me.role === "admin" ? " (all users')" : " (yours)") }));
}

// -- A job --------------------------------------------------------------------------------------------------
const ACTIONS = ["preempt", "resume", "migrate", "resize", "cancel"];
async function drawJob(fresh) {
  const id = st.arg;
  const j = await api("/v1/jobs/" + encodeURIComponent(id));
  st.job = j;
  const v = $("view-job");
  if (fresh || v.dataset.job !== id) {
    v.dataset.job = id;
    st.log = { job: id, offset: null, text: "", decoder: new TextDecoder() };
    v.replaceChildren(
      el("h1", {}, "Job ", el("span", { id: "job-id", text: id }), " ", el("span", { class: "muted", id: "job-name" })),
      el("div", { class: "cards", id: "job-cards" }),
      el("div", { class: "actions", id: "job-actions" },
        el("button", { id: "act-preempt", onclick: () => act("preempt") }, "Preempt"),
        el("button", { id: "act-resume", onclick: () => act("resume") }, "Resume"),
        el("select", { id: "migrate-to", title: "where to (empty: the scheduler chooses)" }),
        el("button", { id: "act-migrate", onclick: () => act("migrate") }, "Migrate"),
        el("input", { id: "resize-to", type: "number", min: 1, title: "devices" }),
        el("button", { id: "act-resize", onclick: () => act("resize") }, "Resize"),
        el("button", { id: "act-cancel", onclick: () => act("cancel") }, "Cancel"),
        el("span", { id: "act-result", class: "muted" })),
      el("svg", { id: "strip" }),
      el("div", { class: "cols" },
        el("div", {}, el("h2", { text: "Timeline" }), el("ol", { class: "timeline", id: "timeline" })),
        el("div", {}, el("h2", { text: "Placement" }), el("table", { id: "placement" }),
          el("h2", { text: "Checkpoints" }), el("table", { id: "checkpoints" }))),
      el("h2", {}, "Log (rank 0) ", el("span", { class: "muted", id: "log-size" })),
      el("pre", { class: "log", id: "log" }));
    const nodes = (await api("/v1/ui/cluster")).nodes;
    $("migrate-to").replaceChildren(el("option", { value: "", text: "anywhere" }),
      ...nodes.filter((n) => n.up).map((n) => el("option", { value: n.name, text: n.name })));
    $("resize-to").value = String(j.devices || j.ranks);
  }
  $("job-name").textContent = `${j.name} — ${j.owner}`;
  const ages = j.finished_at ? j.finished_at - j.submitted_at : Date.now() / 1000 - j.submitted_at;
  $("job-cards").replaceChildren(
    card("state", j.state + (j.held ? " (held)" : "") + (j.busy ? " …" : "")), card("tier", j.tier),
    card("ranks / devices", `${j.ranks} / ${j.devices}`),
    card("steps", j.progress && j.progress.steps !== undefined ? j.progress.steps : "–"),
    card("steps/s", j.progress && j.progress.steps_per_s !== undefined ? j.progress.steps_per_s.toFixed(2) : "–"),
    card("age", fmtS(ages)), card("restarts", j.restarts));
  $("job-cards").firstChild.dataset.state = j.state;
  const ended = j.terminal;
  const can = { preempt: !ended && !j.busy && j.state === "running", resume: !ended && (j.state === "preempted" || j.held),
                migrate: !ended && !j.busy && j.state === "running", resize: !ended && !j.busy && j.state === "running",
                cancel: !ended };
  for (const a of ACTIONS) $("act-" + a).disabled = !can[a];
  $("placement").replaceChildren(el("tr", {}, el("th", { text: "rank" }), el("th", { text: "node" }), el("th", { text: "device" }), el("th", { text: "pid" })),
    ...j.placement.map((p) => el("tr", { "data-rank": p.rank },
      el("td", { class: "num", text: String(p.rank) }), el("td", { class: "node", text: p.node }),
      el("td", { class: "num", text: String(p.device) }), el("td", { class: "num", text: p.pid ? String(p.pid) : "–" }))));
  $("checkpoints").replaceChildren(el("tr", {}, el("th", { text: "checkpoint" }), el("th", { text: "size" }), el("th", { text: "new bytes stored" }), el("th", { text: "state" })),
    ...j.checkpoints.map((c) => el("tr", {}, el("td", { text: c.id }), el("td", { class: "num", text: fmtB(c.bytes) }),
      el("td", { class: "num", text: fmtB(c.stored_bytes) }), el("td", { text: c.state }))));
  drawTimeline(j.events);
  await tailLog(j);
}
function addEvent(ev) {
  if (!st.job || st.job.events.some((e) => e.seq === ev.seq)) return;
  st.job.events.push(ev);
  drawTimeline(st.job.events);
}
// Each event, with what follows from the ones before it: a checkpoint's pause (from `checkpointing` to what
// ended it), a move's from → to (the nodes it ran on before and after), a resize's devices.
function drawTimeline(events) {
  const t0 = events.length ? events[0].time : 0;
  let ranOn = null, ckAt = null, placed = null;
  const items = [];
  for (const e of events) {
    const extra = [];
    if (e.kind === "checkpointing") ckAt = e.time;
    else if (ckAt !== null && ["running", "preempted", "migrating", "resizing", "failed", "cancelled"].includes(e.kind)) {
      extra.push(el("span", { class: "pause", text: `pause ${fmtS(e.time - ckAt)}` }));
      ckAt = null;
    }
    placed = placedOn(e) || placed;
    if (e.kind === "running" && e.node) {
      const on = placed || e.node;
      if (ranOn !== null && on !== ranOn) extra.push(el("span", { class: "move", text: `${ranOn} → ${on}` }));
      ranOn = on;
    }
    // A resize is a move onto another number of devices: "…, to node-1 on 2 device(s) (was 4)".
    const d = /on (\d+) device\(s\) \(was (\d+)\)/.exec(e.detail || "");
    if (d) extra.push(el("span", { class: "move resize", text: `D ${d[2]} → ${d[1]}` }));
    items.push(el("li", { class: "ev ev-" + e.kind, "data-kind": e.kind, "data-node": e.node || "", "data-seq": e.seq },
      el("span", { class: "t", text: "+" + (e.time - t0).toFixed(1) + "s" }), " ",
      el("span", { class: "k", text: e.kind }), e.node ? " on " + e.node : "", " ",
      ...extra.flatMap((x) => [x, " "]), el("span", { class: "muted", text: e.detail || "" })));
  }
  $("timeline").replaceChildren(...items);
  drawStrip(events);
}
// "on node-1 devices [0, 1]; node-2 devices [0], launching" (a launch or a restore): the nodes it names.
function placedOn(e) {
  const m = /^on (.+), (?:launching|restoring)/.exec(e.detail || "");
  return m ? m[1].split("; ").map((p) => p.split(" ")[0]).join("+") : null;
}
// A strip of the job's life: one band per state, coloured, to the last event (or now).
function drawStrip(events) {
  const w = 860, h = 18;
  const s = $("strip");
  const colors = { running: "#27ae60", checkpointing: "#8e44ad", restoring: "#a569bd", migrating: "#e67e22",
                   resizing: "#f5b041", preempted: "#c0392b", pending: "#d5d8dc", submitted: "#d5d8dc" };
  const states = events.filter((e) => e.kind in colors);
  const out = svg("svg", { id: "strip", class: "strip", width: w, height: h });
  if (states.length) {
    const t0 = events[0].time, t1 = Math.max(Date.now() / 1000, events[events.length - 1].time);
    const x = (t) => ((t - t0) / Math.max(1e-6, t1 - t0)) * w;
    states.forEach((e, i) => {
      const end = i + 1 < states.length ? states[i + 1].time : t1;
      const r = svg("rect", { x: x(e.time), y: 0, width: Math.max(1, x(end) - x(e.time)), height: h, fill: colors[e.kind] });
      r.append(svg("title", {}, document.createTextNode(e.kind)));
      out.append(r);
    });
  }
  s.replaceWith(out);
}
async function tailLog(j) {
  const rank = 0;
  if (st.log.offset === null) {
    const r = await api(`/v1/jobs/${encodeURIComponent(j.id)}/logs?rank=${rank}&offset=0`, { raw: true });
    const size = +r.headers.get("X-Tidal-Log-Size");
    st.log.offset = Math.max(0, size - LOG_TAIL);
  }
  for (let k = 0; k < 8; k++) {
    const r = await api(`/v1/jobs/${encodeURIComponent(j.id)}/logs?rank=${rank}&offset=${st.log.offset}`, { raw: true });
    const size = +r.headers.get("X-Tidal-Log-Size");
    const bytes = await r.arrayBuffer();
    if (size < st.log.offset) { st.log.offset = 0; st.log.text = ""; st.log.decoder = new TextDecoder(); continue; } // rolled back
    st.log.offset += bytes.byteLength;
    const text = st.log.decoder.decode(bytes, { stream: true }); // a character split between reads is kept for the next
    st.log.text = (st.log.text + text).slice(-LOG_TAIL);
    $("log-size").textContent = fmtB(size);
    if (!bytes.byteLength || st.log.offset >= size) break;
  }
  const pre = $("log");
  const atEnd = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 4;
  if (pre.textContent !== st.log.text) {
    pre.textContent = st.log.text;
    if (atEnd) pre.scrollTop = pre.scrollHeight;
  }
}
async function act(what) {
  const id = st.arg;
  let body;
  if (what === "migrate") body = $("migrate-to").value ? { to: $("migrate-to").value } : {};
  if (what === "resize") body = { devices: +$("resize-to").value };
  if (what === "cancel" && !confirm(`Cancel job ${id}?`)) return;
  $("act-result").textContent = what + "…";
  try {
    const r = await api(`/v1/jobs/${encodeURIComponent(id)}/${what}`, { method: "POST", body });
    $("act-result").textContent = `${what}: ${r.state}` + (r.to ? ` → ${r.to}` : "");
    showError(null);
  } catch (e) {
    $("act-result").textContent = "";
    showError(e);
  }
  refreshSoon();
}

// -- SLA ----------------------------------------------------------------------------------------------------
function drawSla(c) {
  const v = $("view-sla");
  const causes = Object.entries(c.preemptions).sort();
  v.replaceChildren(
    el("h1", { text: "SLA" }),
    el("p", { class: "muted", text: "Attainment per tier as the simulator defines it: Σ W·T_ideal / Σ W·T_real over live jobs that have started and jobs ended within the last hour. Targets: premium 95 %, standard 70 %, basic best effort." }),
    el("table", { id: "sla" },
      el("tr", {}, ...["tier", "attainment", "target", "jobs", "pending", "started", "mean queueing"].map((h) => el("th", { text: h }))),
      ...TIERS.map((t) => {
        const s = c.sla[t] || {}, q = c.queueing[t] || {};
        const miss = s.attainment !== null && s.target !== null && s.attainment < s.target;
        return el("tr", { "data-tier": t }, el("td", { class: "tier " + t, text: t }),
          el("td", { class: "num" + (miss ? " error" : ""), text: pct(s.attainment) }),
          el("td", { class: "num", text: s.target === null ? "best effort" : pct(s.target) }),
          el("td", { class: "num", text: String(s.jobs || 0) }), el("td", { class: "num", text: String(c.pending[t] || 0) }),
          el("td", { class: "num", text: String(q.started || 0) }), el("td", { class: "num", text: q.started ? fmtS(q.mean_s) : "–" }));
      })),
    el("h2", { text: "Attainment over time" }),
    chart("SLA attainment per tier (dashed: targets)", TIERS.map((t) => ({
      name: t, color: COLORS[t],
      points: withNow(c).map((p) => [p.time, p.sla[t]]).filter((p) => p[1] !== null) })),
    TIERS.filter((t) => c.sla[t] && c.sla[t].target !== null).map((t) => ({ y: c.sla[t].target, color: COLORS[t] }))),
    el("h2", { text: "Preemptions by cause" }),
    causes.length ? el("table", { id: "preemptions" }, el("tr", {}, el("th", { text: "cause" }), el("th", { text: "preemptions" })),
      ...causes.map(([k, n]) => el("tr", {}, el("td", { text: k }), el("td", { class: "num", text: String(n) }))))
      : el("p", { class: "muted", text: "No preemptions yet." }));
}

document.addEventListener("DOMContentLoaded", start);
