// Rollout detail: header and actions, stepper, variants, charts, correctness (correctness.js), checks (expandable
// evidence) and events, all refreshed every 1.5 s; only new checks/events/points are fetched after the first load.
"use strict";
(() => {
  const { api, el, badge, pct, pt, ms, dur, clock, poll, mark } = SITS;
  const $ = (id) => document.getElementById(id);
  let R = JSON.parse($("rollout-data").textContent);
  const canAct = JSON.parse($("can-act").textContent);
  const id = R.id;
  const METRICS = ["http_request_duration_seconds", "sits_time_to_first_token_seconds", "sits_inter_token_latency_seconds"];
  const LABEL = { http_request_duration_seconds: "Request latency", sits_time_to_first_token_seconds: "Time to first token", sits_inter_token_latency_seconds: "Inter-token latency" };
  let S = null, charts = {}, lastSeq = 0, lastEvent = 0, lastCheckRow = 0, showAll = false;
  $("more-checks").addEventListener("click", () => {
    showAll = true;
    $("more-checks").hidden = true;
    loadChecks(true);
  });

  // ---- header ------------------------------------------------------------------------------------------------------
  const human = (s) => (s || "").replace(/http_request_duration_seconds\{route="([^"]+)"\}/g, "request latency on $1")
    .replace(/sits_time_to_first_token_seconds(\{[^}]*\})?/g, "TTFT").replace(/sits_inter_token_latency_seconds(\{[^}]*\})?/g, "inter-token latency")
    .replace(/http_request_duration_seconds/g, "request latency").replace(/:p(\d+)/g, " p$1");
  const PHASE_TEXT = { pending: "Waiting for the worker to deploy the canary and baseline.", initializing: "Deploying the canary and baseline; waiting until they are ready." };

  function header() {
    $("phase").replaceWith(Object.assign(badge(R.phase, true), { id: "phase" }));
    const lc = R.last_check;
    const why = human(R.reason) || PHASE_TEXT[R.phase] || "";
    $("reason").replaceChildren(...[el("span", {}, why.charAt(0).toUpperCase() + why.slice(1) + (why ? "." : "")),
      lc && R.active ? el("span", { class: "muted" }, ` Last check #${lc.seq}: ${lc.outcome} → ${lc.decision} (${human(lc.reason)}).`) : null].filter(Boolean));
    const pending = R.pending_commands || [];
    for (const btn of document.querySelectorAll("#actions button")) {
      const c = btn.dataset.command;
      const queued = pending.find((p) => p.command === c);
      const allowed = R.allowed_actions.includes(c);
      btn.hidden = (c === "resume" && R.phase !== "paused") || (c === "pause" && R.phase === "paused");
      btn.disabled = !canAct || !allowed || !!queued;
      btn.parentElement.dataset.tip = !canAct ? "needs the operator role" : queued ? `${c} queued by ${queued.actor || "someone"}`
        : !allowed ? `not possible while ${SITS.phaseWord(R.phase)}` : "";
      btn.setAttribute("aria-disabled", btn.disabled ? "true" : "false");
    }
    $("pending").textContent = pending.length ? "Queued for the worker: " + pending.map((p) => `${p.command} (${p.actor || "?"})`).join(", ") : "";
  }

  function stepper() {
    const failed = ["rolled_back", "rolling_back", "failed"].includes(R.phase);
    $("stepper").replaceChildren(...R.steps_timeline.map((s) => {
      const cls = s.state === "current" && failed ? "failed" : s.state;
      return el("li", { class: cls, "aria-current": s.state === "current" ? "step" : null },
        el("span", { class: "dot", "aria-hidden": "true" }), el("span", { class: "w" }, s.weight + " %"),
        el("span", { class: "t" }, s.seconds != null ? dur(s.seconds) : s.state === "todo" ? "" : "…"),
        el("span", { class: "sr-only" }, ` ${s.state}`));
    }));
    $("variants").replaceChildren(...["production", "baseline", "canary"].map((role) => {
      const v = R.variants[role];
      const ready = v.state === "removed" ? el("span", { class: "muted" }, "removed") : v.state === "promoted" ? el("span", { class: "ok" }, "promoted to production")
        : v.crashing ? el("span", { class: "bad" }, "● crashing") : v.ready === true ? el("span", { class: "ok" }, "● ready")
        : v.ready === false ? el("span", { class: "bad" }, "● not ready") : el("span", { class: "muted" }, "not observed");
      return el("div", { class: `variant ${role}` }, el("div", { class: "role" }, role),
        el("div", {}, el("strong", {}, v.kernels), " · ", el("span", { class: "num" }, v.weight + " %"), " · ", ready),
        el("div", { class: "muted small num" }, v.requests != null ? `${Math.round(v.requests)} requests this step, ${Math.round(v.errors)} errors` : "no data this step"));
    }));
  }

  // ---- actions -----------------------------------------------------------------------------------------------------
  const CONFIRM = {
    promote: "Promote: the canary takes all traffic and becomes production now, without waiting for the remaining checks.",
    abort: "Abort: all traffic goes back to production and the canary and baseline are removed.",
  };
  async function act(c) {
    if (CONFIRM[c]) {
      $("confirm-title").textContent = `${c[0].toUpperCase() + c.slice(1)} ${R.service}?`;
      $("confirm-text").textContent = CONFIRM[c];
      $("confirm-ok").textContent = c[0].toUpperCase() + c.slice(1);
      const dlg = $("confirm");
      dlg.returnValue = "";
      dlg.showModal();
      const answer = await new Promise((res) => dlg.addEventListener("close", () => res(dlg.returnValue), { once: true }));
      if (answer !== "ok") return;
    }
    const res = await api(`/rollouts/${encodeURIComponent(id)}/${c}`, { method: "POST" });
    if (!res.ok) $("pending").textContent = (res.data && res.data.error && res.data.error.message) || `HTTP ${res.status}`;
    await refresh();
  }
  for (const btn of document.querySelectorAll("#actions button")) btn.addEventListener("click", () => act(btn.dataset.command));

  // ---- charts ------------------------------------------------------------------------------------------------------
  function markers() {
    const warm = R.policy.warmup_s;
    return R.steps_timeline.filter((s) => s.entered_at != null).map((s) => ({ t: s.entered_at, until: s.entered_at + warm, label: s.weight + " %" }));
  }
  // the policy's thresholds of a metric by quantile ({p99: 0.1, p90: 0.05}): drawn even before a check decided
  function thresholds(metric) {
    const out = {};
    for (const c of R.policy.checks) {
      if (c.metric === metric && c.quantile != null) out["p" + +(c.quantile * 100).toFixed(3)] = c.max_rel_delta;
    }
    return out;
  }
  function appendSeries(n) {
    if (!S) { S = n; return; }
    const len = S.t.length, add = n.t.length;
    for (const k of ["t", "seq", "weight", "outcome"]) S[k].push(...n[k]);
    const pad = (arr, to) => { while (arr.length < to) arr.push(null); return arr; };
    for (const [metric, m] of Object.entries(n.metrics)) {
      const have = S.metrics[metric] || (S.metrics[metric] = { label: m.label, quantiles: {}, deltas: {} });
      for (const [role, qs] of Object.entries(m.quantiles)) {
        have.quantiles[role] = have.quantiles[role] || {};
        for (const [q, arr] of Object.entries(qs)) have.quantiles[role][q] = pad(have.quantiles[role][q] || [], len).concat(arr);
      }
      for (const [q, d] of Object.entries(m.deltas)) {
        const h = have.deltas[q] || (have.deltas[q] = { delta: [], low: [], high: [], outcome: [], checked: d.checked, threshold: d.threshold });
        for (const k of ["delta", "low", "high", "outcome"]) h[k] = pad(h[k], len).concat(d[k]);
        if (d.threshold != null) h.threshold = d.threshold;
      }
    }
    for (const m of Object.values(S.metrics)) {   // metrics absent from this batch: pad
      for (const qs of Object.values(m.quantiles)) for (const q of Object.keys(qs)) pad(qs[q], len + add);
      for (const d of Object.values(m.deltas)) for (const k of ["delta", "low", "high", "outcome"]) pad(d[k], len + add);
    }
  }
  function drawCharts() {
    if (!S || !S.t.length) return;
    $("no-charts").hidden = METRICS.some((m) => S.metrics[m]);   // correctness checks alone draw nothing
    $("no-charts").textContent = "No latency checks yet: charts appear with the first one.";
    const box = $("charts");
    for (const metric of METRICS) {
      if (!S.metrics[metric]) continue;
      if (!charts[metric]) {
        const left = el("div", { class: "plot" }), right = el("div", { class: "plot" });
        const lim = thresholds(metric);
        const thr = lim.p99 != null ? ` · P99 threshold +${(lim.p99 * 100).toFixed(0)} %` + (lim.p90 != null ? `, P90 +${(lim.p90 * 100).toFixed(0)} %` : "")
          : lim.p90 != null ? ` · P90 threshold +${(lim.p90 * 100).toFixed(0)} %` : " · shown, not decided";
        const row = el("div", { class: "chart-row", "data-metric": metric },
          el("figure", { class: "chart latency", style: "margin:0" }, el("h3", {}, LABEL[metric], el("span", { class: "muted" }, " · P90 / P99, log scale")), left),
          el("figure", { class: "chart delta", style: "margin:0" }, el("h3", {}, `${LABEL[metric]}: canary vs ${S.compare_to}`, el("span", { class: "muted" }, thr)), right));
        box.append(row);
        const w = Math.max(260, left.clientWidth || (box.clientWidth / 2 - 30));
        charts[metric] = { lat: Charts.latencyChart(left, w, markers), delta: Charts.deltaChart(right, w, markers, S.compare_to), left, right };
      }
      charts[metric].lat.setData(Charts.latencyData(S, metric));
      charts[metric].delta.setData(Charts.deltaData(S, metric, thresholds(metric)));
      // how many points each chart holds (x values with a canary P99), for people reading the DOM and the UI test
      const pts = Charts.latencyData(S, metric)[6].filter((v) => v != null).length;
      box.querySelector(`[data-metric="${metric}"]`).dataset.points = pts;
    }
  }
  new ResizeObserver(() => {
    for (const c of Object.values(charts)) {
      c.lat.setSize({ width: c.left.clientWidth, height: 230 });
      c.delta.setSize({ width: c.right.clientWidth, height: 230 });
    }
  }).observe($("charts"));

  // ---- checks and events ---------------------------------------------------------------------------------------------
  function resultGrid(c) {
    const grid = el("div", { class: "results" });
    for (const r of c.results) {
      const rate = r.check === "error_rate";
      const f = rate ? pt : pct;
      const val = rate ? (x) => x == null ? "–" : (x * 100).toFixed(2) + " %" : ms;
      const route = (r.series.match(/route="([^"]+)"/) || [])[1];
      const thr = rate ? `+${(r.threshold * 100).toFixed(2)} pt` : `+${(r.threshold * 100).toFixed(0)} %`;
      grid.append(el("span", { class: "lbl" }, r.label.replace("request latency", "latency"), route ? el("small", {}, " " + route) : null),
        el("span", {}, `${val(r.canary)} vs ${val(r.target)}`),
        el("span", {}, r.delta_rel != null || r.delta_abs != null ? f(rate ? r.delta_abs : r.delta_rel) : "–",
          el("span", { class: "muted" }, r.ci_low != null ? ` [${f(r.ci_low)}, ${f(r.ci_high)}]` : ""), el("span", { class: "muted" }, ` ≤ ${thr}`)),
        el("span", { class: `verdict-${r.outcome}`, title: r.reason }, `${mark[r.outcome]} ${r.outcome}`, r.need_more ? el("span", { class: "need" }, `needs about ${r.need_more} more requests`) : null));
    }
    return grid;
  }
  function checkRow(c) {
    const v = c.variants, target = c.compare_to;
    const req = (role) => v[role] && v[role].requests != null ? Math.round(v[role].requests) : "–";
    const btn = el("button", { type: "button", class: "secondary", "aria-expanded": "false" }, "Evidence");
    const gate = c.correctness;   // a correctness-gate check: prompts replayed, no latency results
    const tr = el("tr", { "data-seq": c.seq, class: gate ? "gate" : null },
      el("td", { class: "when" }, el("strong", {}, `#${c.seq}`), clock(c.at)),
      el("td", { class: "when" }, c.step < 0 ? "before traffic" : `step ${c.step + 1}/${R.steps.length}`, el("br"), `${c.weight} %`),
      gate ? el("td", { class: "when" }, `${gate.prompts} prompts`, el("br"), el("span", { class: "muted" }, "replayed on both"))
        : el("td", { class: "when" }, `${req("canary")}`, el("br"), el("span", { class: "muted" }, `${req(target)}`)),
      el("td", { class: "results-cell" }, gate ? Correctness.cell(c) : resultGrid(c)),
      el("td", { class: "verdict" }, el("strong", { class: `verdict-${c.outcome}` }, `${mark[c.outcome]} ${c.outcome}`), el("div", { class: "muted small" }, `→ ${c.decision}`),
        c.need_more ? el("span", { class: "need" }, `needs about ${c.need_more} more requests per variant`) : null, btn));
    btn.addEventListener("click", async () => {
      const open = tr.nextElementSibling && tr.nextElementSibling.classList.contains("evidence");
      if (open) { tr.nextElementSibling.remove(); btn.setAttribute("aria-expanded", "false"); return; }
      const res = await api(`/rollouts/${encodeURIComponent(id)}/checks/${c.seq}`);
      const pre = el("pre", { tabindex: "0", "aria-label": `raw evidence of check ${c.seq}` }, JSON.stringify(res.data, null, 1));
      tr.after(el("tr", { class: "evidence" }, el("td", { colspan: "5" }, el("p", { class: "small muted" }, human(c.reason)), pre)));
      btn.setAttribute("aria-expanded", "true");
    });
    return tr;
  }
  let loadingChecks = false;
  async function loadChecks(all = false) {
    if (loadingChecks) return;
    loadingChecks = true;
    try { await fetchChecks(all); } finally { loadingChecks = false; }
  }
  async function fetchChecks(all) {
    // first load: the newest 10 (what the table shows); "Show all" fetches the older ones
    const q = all ? "since_seq=0" : lastCheckRow ? `since_seq=${lastCheckRow}` : "last=10";
    const res = await api(`/rollouts/${encodeURIComponent(id)}/checks?view=compact&${q}`);
    if (!res.ok) return;
    const body = document.querySelector("#checks tbody");
    if (all) body.replaceChildren();
    for (const c of res.data.checks) { body.prepend(checkRow(c)); lastCheckRow = Math.max(lastCheckRow, c.seq); }
    const rows = [...body.querySelectorAll("tr:not(.evidence)")];
    rows.forEach((tr, i) => { tr.hidden = !showAll && i >= 10; });
    $("more-checks").hidden = showAll || R.checks <= 10;
    $("more-checks").textContent = `Show all ${R.checks} checks`;
    $("no-checks").hidden = lastCheckRow > 0;
    document.getElementById("checks").hidden = lastCheckRow === 0;
  }
  async function loadEvents() {
    const res = await api(`/rollouts/${encodeURIComponent(id)}/events?since_id=${lastEvent}`);
    if (!res.ok) return;
    const list = $("events");
    for (const e of res.data.events) {
      if (e.kind === "check") { lastEvent = Math.max(lastEvent, e.id); continue; }   // the checks table has them
      list.prepend(el("li", { class: `kind-${e.kind}` }, el("span", { class: "t", title: new Date(e.at * 1000).toLocaleString() }, clock(e.at)),
        el("span", { class: "actor" + (e.actor ? "" : " system") }, e.actor || "worker"), el("span", { class: "msg" }, human(e.message))));
      lastEvent = Math.max(lastEvent, e.id);
    }
    const rows = [
      ...res.data.actions.map((a) => ({ t: a.created_at, who: "worker", msg: a.what, status: a.status, err: a.error })),
      ...res.data.notifications.map((n) => ({ t: n.at, who: "webhook", msg: `${n.event} → ${n.webhook}`, status: n.status, err: n.error })),
    ].sort((a, b) => b.t - a.t);
    if (rows.length) {
      $("outbox").replaceChildren(...rows.map((r) => el("li", {}, el("span", { class: "t" }, clock(r.t)),
        el("span", { class: "actor system" }, r.who),
        el("span", { class: "msg" }, r.msg, " ", el("span", { class: r.status === "failed" ? "bad" : r.status === "pending" ? "warn" : "ok" }, r.status),
          r.err ? el("span", { class: "muted small" }, ` (${r.err})`) : null))));
    }
  }

  async function refresh() {
    const res = await api(`/rollouts/${encodeURIComponent(id)}`);
    if (!res.ok) return false;
    R = res.data;
    header();
    stepper();
    Correctness.render($("correctness"), R);
    if (R.checks > lastSeq) {
      const s = await api(`/rollouts/${encodeURIComponent(id)}/series?since_seq=${lastSeq}`);
      if (s.ok && s.data.last_seq != null) { appendSeries(s.data); lastSeq = s.data.last_seq; drawCharts(); }
      await loadChecks();
    }
    await loadEvents();
    return true;
  }
  header();
  stepper();
  Correctness.render($("correctness"), R);
  document.getElementById("checks").hidden = true;
  poll(refresh, 1500);
})();
