// Shared by every page: the API client (session cookie + CSRF header), formatting, the live poller.
"use strict";
const SITS = (() => {
  const csrf = document.querySelector('meta[name="csrf-token"]').content;
  // roles and phases as the server defines them (control_plane/rollout/state.py), metric names in words
  // (control_plane/view/names.py): named once, in Python
  const { roles: ROLES, phases: PHASE, metrics: METRICS } = JSON.parse(document.getElementById("sits-vocabulary").textContent);

  // Set once the page is navigating away (a form posted, e.g. Log out): a poll's 401 answered in between must not
  // send the browser to the login page over that navigation (it would cancel the logout's own redirect).
  let leaving = false;
  document.addEventListener("submit", (e) => { if (!e.defaultPrevented) leaving = true; });   // after the form's own handlers
  addEventListener("pagehide", () => { leaving = true; });

  async function api(path, opts = {}) {
    const init = { method: opts.method || "GET", headers: { "Accept": "application/json" }, credentials: "same-origin" };
    if (init.method !== "GET") {
      init.headers["X-CSRF-Token"] = csrf;
      init.headers["Content-Type"] = "application/json";
      init.body = JSON.stringify(opts.body || {});
    }
    const r = await fetch("/api/v1" + path, init);
    let data = null;
    try { data = await r.json(); } catch (e) { data = null; }
    if (r.status === 401 && !opts.noRedirect && !leaving) {
      location.href = "/login?next=" + encodeURIComponent(location.pathname + location.search);
    }
    return { ok: r.ok, status: r.status, data, headers: r.headers };
  }

  // a reason or event as people read it: metric names in words ("request latency on /v1/completions", "TTFT")
  const SERIES = new RegExp(`\\b(${Object.keys(METRICS).join("|")})(\\{[^}]*\\})?`, "g");
  const human = (s) => (s || "").replace(SERIES, (_, metric, labels) => {
    const route = ((labels || "").match(/route="([^"]+)"/) || [])[1];
    return METRICS[metric] + (route ? " on " + route : "");
  }).replace(/:p(\d+)/g, " p$1");
  const requests = (n) => `${n} request${n === 1 ? "" : "s"}`;   // "1 request", "20 requests"

  function el(tag, attrs = {}, ...children) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs)) {
      if (v === null || v === undefined || v === false) continue;
      if (k === "class") e.className = v;
      else if (k === "text") e.textContent = v;
      else if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
      else e.setAttribute(k, v === true ? "" : v);
    }
    for (const c of children.flat()) {
      if (c === null || c === undefined || c === false) continue;
      e.append(c instanceof Node ? c : document.createTextNode(String(c)));
    }
    return e;
  }

  const phaseWord = (p) => p.replace(/_/g, " ");
  const badge = (phase, big) => el("span", { class: `badge phase-${phase}${big ? " big" : ""}` }, phaseWord(phase));

  function pct(x, digits = 1) {
    if (x === null || x === undefined) return "–";
    const v = x * 100;
    return (v >= 0 ? "+" : "−") + Math.abs(v).toFixed(digits) + " %";
  }
  function pt(x) {
    if (x === null || x === undefined) return "–";
    const v = x * 100;
    return (v >= 0 ? "+" : "−") + Math.abs(v).toFixed(2) + " pt";
  }
  const rate = (x) => x === null || x === undefined ? "–" : (x * 100).toFixed(2) + " %";   // 0.005 -> "0.50 %"
  function ms(x) {
    if (x === null || x === undefined) return "–";
    const v = x * 1000;
    if (v >= 1000) return (v / 1000).toFixed(v >= 10000 ? 1 : 2) + " s";
    return (v >= 100 ? v.toFixed(0) : v >= 10 ? v.toFixed(1) : v.toFixed(2)) + " ms";
  }
  function ago(t, now = Date.now() / 1000) {
    const s = Math.max(0, now - t);
    if (s < 60) return Math.round(s) + " s";
    if (s < 3600) return Math.round(s / 60) + " m";
    if (s < 86400) return (s / 3600).toFixed(s < 36000 ? 1 : 0) + " h";
    return Math.round(s / 86400) + " d";
  }
  function dur(s) {
    if (s === null || s === undefined) return "";
    if (s < 60) return Math.round(s) + " s";
    if (s < 3600) return Math.floor(s / 60) + " m " + String(Math.round(s % 60)).padStart(2, "0") + " s";
    return Math.floor(s / 3600) + " h " + Math.round((s % 3600) / 60) + " m";
  }
  const clock = (t) => new Date(t * 1000).toLocaleTimeString("en-GB", { hour: "2-digit", minute: "2-digit", second: "2-digit" });
  const mark = { pass: "✓", fail: "✗", inconclusive: "?" };

  // "p99 latency +3.1 % [−2.0, +8.0] ✓"
  function checkLine(c) {
    if (!c) return el("span", { class: "muted" }, "no checks yet");
    // the metric shown is the one whose verdict made the check's (present.headline): its own verdict beside it
    const v = c.result || c.outcome;
    const need = c.need_more ? el("span", { class: "muted" }, ` · needs about ${requests(c.need_more)} more`) : null;
    if (!c.label) {
      return el("span", { class: "lastcheck", title: c.reason }, el("span", { class: `verdict-${v}` }, `${mark[v] || ""} ${v}`), need);
    }
    const f = c.kind === "abs" ? pt : pct;
    const ci = c.ci && c.ci[0] != null ? ` [${f(c.ci[0]).replace(" %", "").replace(" pt", "")}, ${f(c.ci[1]).replace(" %", "").replace(" pt", "")}]` : "";
    // sequential statistics (present.headline): the windows' mean effect, its sequence; under it both boundaries and,
    // while undecided, the time to decide
    const seq = c.method === "sequential";
    const eta = seq && v === "inconclusive" && c.eta_s != null ? ` · decides in ~${Math.round(c.eta_s)} s` : "";
    const bounds = seq && c.ship != null ? el("span", { class: "muted seqline" },
      el("span", { class: "bounds" }, `ship ${threshold(c.kind, c.ship)} / limit ${threshold(c.kind, c.threshold)}`), eta) : null;
    return el("span", { class: "lastcheck", title: c.reason, "data-check": c.check, "data-method": seq ? "sequential" : null },
      el("span", { class: "muted" }, c.label + " "), c.delta == null ? "–" : f(c.delta), el("span", { class: "muted" }, ci), " ",
      el("span", { class: `verdict-${v}` }, `${mark[v]} ${v}`), c.delta == null ? need : null, bounds);
  }

  // one gated result as the checks table and the charts' captions write it: "+59.9 % [+36.7 %, +83.0 %] ≤ +25 %"
  function threshold(kind, t) {
    return kind === "abs" ? `+${(t * 100).toFixed(2)} pt` : `+${+(t * 100).toFixed(2)} %`;
  }
  function resultText(kind, delta, low, high, t) {
    const f = kind === "abs" ? pt : pct;
    return (delta != null ? f(delta) : "–") + (low != null ? ` [${f(low)}, ${f(high)}]` : "") + ` ≤ ${threshold(kind, t)}`;
  }

  function weightBar(w, phase) {
    if (phase === PHASE.SUCCEEDED) {
      return el("div", { class: "weight", title: "promoted: the canary's kernel set is production" },
        el("div", { class: "bar", role: "img", "aria-label": "promoted, 100 percent" }, el("span", { class: "promoted", style: "width:100%" })),
        el("span", { class: "pct" }, "100 %"));
    }
    const c = w.canary || 0, b = w.baseline || 0;
    return el("div", { class: "weight", title: `canary ${c} %, baseline ${b} %, production ${w.production} %` },
      el("div", { class: "bar", role: "img", "aria-label": `canary ${c} percent` },
        el("span", { class: "canary", style: `width:${c}%` }), el("span", { class: "baseline", style: `width:${b}%` })),
      el("span", { class: "pct" }, c + " %"));
  }

  // Polls fn() every `every` ms; the live indicator turns grey when the last success is older than 3 polls.
  function poll(fn, every = 1500) {
    const live = document.getElementById("live");
    let last = 0, timer = null;
    async function tick() {
      try { if (await fn() !== false) last = Date.now(); } catch (e) { console.warn("poll failed", e); }
      if (live) {
        const on = Date.now() - last < every * 3;
        live.classList.toggle("on", on);
        live.textContent = on ? "live" : "paused";
      }
      timer = setTimeout(tick, document.hidden ? every * 4 : every);
    }
    tick();
    return () => clearTimeout(timer);
  }

  return { ROLES, PHASE, human, requests, api, el, badge, pct, pt, rate, ms, ago, dur, clock, checkLine, weightBar, poll, phaseWord, mark, csrf, resultText, threshold };
})();
