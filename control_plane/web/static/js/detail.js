// Rollout detail: header and actions (retry: retry.js), stepper, variants, engines (engines.js), charts, correctness
// (correctness.js), checks (expandable evidence; sequential statistics: sequence.js) and events, all refreshed every 1.5 s; only new checks/events/points
// are fetched after the first load.
"use strict";
(() => {
  const { api, el, badge, pct, pt, ms, dur, clock, poll, mark } = SITS;
  const $ = (id) => document.getElementById(id);
  let R = JSON.parse($("rollout-data").textContent);
  const canAct = JSON.parse($("can-act").textContent);
  const workerHere = JSON.parse($("worker-here").textContent);
  const id = R.id;
  const METRICS = ["http_request_duration_seconds", "sits_time_to_first_token_seconds", "sits_inter_token_latency_seconds"];
  const LABEL = { http_request_duration_seconds: "Request latency", sits_time_to_first_token_seconds: "Time to first token", sits_inter_token_latency_seconds: "Inter-token latency" };
  let distBoxes = {}, dist = null, distSeq = 0;   // the latency cards' distribution boxes, the last one drawn
  let S = null, charts = {}, lastSeq = 0, lastCheckRow = 0, showAll = false;
  $("more-checks").addEventListener("click", () => {
    showAll = true;
    $("more-checks").hidden = true;
    loadChecks(true);
  });

  // ---- header ------------------------------------------------------------------------------------------------------
  const human = SITS.human;
  const PHASE_TEXT = { pending: "Waiting for the worker to deploy the canary and baseline.", initializing: "Deploying the canary and baseline; waiting until they are ready." };

  function header() {
    $("phase").replaceWith(Object.assign(badge(R.phase, true), { id: "phase" }));
    const lc = R.last_check;
    const why = human(R.reason) || PHASE_TEXT[R.phase] || "";
    const sentence = why.charAt(0).toUpperCase() + why.slice(1) + (why && !why.endsWith(".") ? "." : "");
    // nothing picks a pending rollout up when no worker runs (this process serves with --no-worker)
    const orphan = !workerHere && [SITS.PHASE.PENDING, SITS.PHASE.INITIALIZING].includes(R.phase) && !R.lease;
    $("reason").replaceChildren(...[el("span", {}, sentence),
      orphan ? el("span", { class: "warn", id: "no-worker-warning" }, " No worker has taken this rollout: this service runs without one (--no-worker); start `sits-control worker` on the same store.") : null,
      lc && R.active ? el("span", { class: "muted" }, ` Last check #${lc.seq}: ${lc.outcome} → ${lc.decision} (${human(lc.reason)}).`) : null].filter(Boolean));
    const pending = R.pending_commands || [];
    for (const btn of document.querySelectorAll("#actions button")) {
      const c = btn.dataset.command;
      const queued = pending.find((p) => p.command === c);
      const allowed = R.allowed_actions.includes(c);
      btn.hidden = (c === "resume" && R.phase !== SITS.PHASE.PAUSED) || (c === "pause" && R.phase === SITS.PHASE.PAUSED);
      btn.disabled = !canAct || !allowed || !!queued;
      btn.parentElement.dataset.tip = !canAct ? "needs the operator role" : queued ? `${c} queued by ${queued.actor || "someone"}`
        : !allowed ? (R.phase === SITS.PHASE.FAILED ? "the rollout failed: the worker takes no more commands for it (see the verdict)"
          : `not possible while ${SITS.phaseWord(R.phase)}`) : "";
      btn.setAttribute("aria-disabled", btn.disabled ? "true" : "false");
    }
    Retry.render(R);
    $("pending").textContent = pending.length ? "Queued for the worker: " + pending.map((p) => `${p.command} (${p.actor || "?"})`).join(", ") : "";
  }

  // the correctness gate before traffic, as the stepper's first stop: passed, failed (a wrong canary stops here),
  // running (waiting for canary and baseline, or replaying), or not reached (the rollout ended before it ran)
  function gateStop(failed) {
    const c = R.correctness;
    if (!c || !c.enabled) return null;
    const before = (c.history || []).filter((h) => h.step < 0);
    const last = before.length ? before[before.length - 1] : null;
    const state = last && last.outcome === "pass" ? "done" : last && last.outcome === "fail" ? "failed"
      : R.step >= 0 ? "done" : failed || !R.active ? "skipped" : "current";
    const t = state === "failed" ? `✗ failed (check #${last.seq})` : state === "done" ? "✓ passed" : state === "skipped" ? "not reached"
      : last ? "? retrying" : "…";
    return el("li", { class: `gate ${state}`, id: "gate-stop", "data-state": state, "aria-current": state === "current" || (state === "failed" && R.step < 0) ? "step" : null },
      el("span", { class: "dot", "aria-hidden": "true" }), el("span", { class: "w" }, "gate"), el("span", { class: "t" }, t),
      el("span", { class: "sr-only" }, " correctness gate before traffic"));
  }
  // a traffic step's time: its duration once known; a done step without one "✓" ("promoted" for a promoted 100 %)
  function stepTime(s) {
    if (s.seconds != null) return dur(s.seconds);
    if (s.state === "todo") return "";
    if (s.state !== "done") return "…";
    return s.weight === 100 && R.phase === SITS.PHASE.SUCCEEDED ? "promoted" : "✓";
  }
  function stepper() {
    const failed = [SITS.PHASE.ROLLED_BACK, SITS.PHASE.ROLLING_BACK, SITS.PHASE.FAILED].includes(R.phase);
    const gate = gateStop(failed);
    $("stepper").replaceChildren(...[gate, ...R.steps_timeline.map((s) => {
      const cls = s.state === "current" && failed ? "failed" : s.state === "current" && !R.active ? "done" : s.state;
      return el("li", { class: cls, "aria-current": s.state === "current" ? "step" : null },
        el("span", { class: "dot", "aria-hidden": "true" }), el("span", { class: "w" }, s.weight + " %"),
        el("span", { class: "t" }, stepTime(s)),
        el("span", { class: "sr-only" }, ` ${s.state}`));
    })].filter(Boolean));
    $("variants").replaceChildren(...SITS.ROLES.map((role) => {
      const v = R.variants[role];
      const ready = v.state === "removed" ? el("span", { class: "muted" }, "removed") : v.state === "promoted" ? el("span", { class: "ok" }, "promoted to production")
        : v.state === "replaced" ? el("span", { class: "muted" }, `replaced by ${R.variants.canary.kernels}, which serves production's ${v.weight} % now`)
        : v.state === "stranded" ? el("span", { class: "warn" }, "● still deployed, not watched")
        : v.crashing ? el("span", { class: "bad" }, "● crashing") : v.ready === true ? el("span", { class: "ok" }, "● ready")
        : v.ready === false ? el("span", { class: "bad" }, "● not ready") : el("span", { class: "muted" }, "not observed");
      const tp = R.spec && R.spec.tensor_parallel_size > 1 ? `${R.spec.tensor_parallel_size} GPUs per engine (tensor parallel)` : "";
      return el("div", { class: `variant ${role}` }, el("div", { class: "role" }, role),
        el("div", {}, el("strong", {}, v.kernels), " · ",
          ...(v.state === "replaced" ? [] : [el("span", { class: "num" }, v.weight + " %"), " · "]), ready),
        tp ? el("div", { class: "muted small tp" }, tp) : null,
        el("div", { class: "muted small gpus", "data-gpus": role }, Engines.placement(role)),
        el("div", { class: "muted small num" }, v.requests == null ? "no data this step"
          : v.replayed ? `${Math.round(v.requests)} requests this step (${Math.round(v.requests - v.replayed)} live, ${Math.round(v.replayed)} replayed), ${Math.round(v.errors)} errors`
          : `${Math.round(v.requests)} requests this step, ${Math.round(v.errors)} errors`));
    }));
    const lt = R.low_traffic;
    $("low-traffic").replaceChildren(!lt || !lt.enabled ? "" : el("span", {},
      el("strong", {}, "Low-traffic mode on: "),
      `replayed to canary and baseline ${Math.round(lt.replayed_step)} requests this step (${Math.round(lt.live_step)} live canary requests), `,
      `${Math.round(lt.replayed_rollout)} in this rollout; at most ${lt.max_rps} req/s, ${lt.max_requests_per_step} per step, ${lt.max_requests_per_rollout} per rollout`,
      lt.allow_replay_only ? "; a check may pass on replayed load alone" : "; a check passes only with live canary load too"));
  }

  // ---- actions -----------------------------------------------------------------------------------------------------
  const CONFIRM = {
    promote: "Promote: the canary takes all traffic and becomes production now, without waiting for the remaining checks.",
    abort: "Abort: all traffic goes back to production and the canary and baseline are removed.",
  };
  function actionError(text) {
    $("action-error-text").textContent = text || "";
    $("action-error").hidden = !text;
  }
  $("action-error-close").addEventListener("click", () => actionError(""));
  async function act(c) {
    actionError("");
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
    if (!res.ok) actionError(`${c[0].toUpperCase() + c.slice(1)} refused: ${(res.data && res.data.error && res.data.error.message) || `HTTP ${res.status}`}`);
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
    for (const k of ["t", "seq", "weight", "outcome", "decision", "decided_by"]) S[k].push(...n[k]);
    const pad = (arr, to) => { while (arr.length < to) arr.push(null); return arr; };
    for (const [name, c] of Object.entries(n.gated)) {
      const h = S.gated[name] || (S.gated[name] = { ...c, delta: [], low: [], high: [], outcome: [] });
      for (const k of ["delta", "low", "high", "outcome"]) h[k] = pad(h[k], len).concat(c[k]);
      h.threshold = c.threshold;
      for (const k of ["method", "ship", "windows", "block", "eta_s", "jumps"]) if (k in c) h[k] = c[k];
    }
    for (const c of Object.values(S.gated)) for (const k of ["delta", "low", "high", "outcome"]) pad(c[k], len + add);
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
  // the gated checks of a metric, highest quantile first ("error_rate" is its own row)
  const gatedOf = (metric) => Object.keys(S.gated).filter((n) => S.gated[n].metric === metric)
    .sort((x, y) => parseFloat((S.gated[y].quantile || "p0").slice(1)) - parseFloat((S.gated[x].quantile || "p0").slice(1)));
  // the check that ended the rollout (its last, when that one rolled back or promoted): ringed on the charts
  function decidedIndex() {
    const i = S.t.length - 1;
    return !R.active && i >= 0 && ["rollback", "promote", "gate"].includes(S.decision[i]) ? i : -1;
  }
  // did gated check `name` decide the check at index i? The server says (series decided_by, view CheckView.deciding):
  // a rollback's failing checks (the inconclusive ones when none failed), a promotion's passing ones
  function decides(name, i) {
    if (!S || i < 0) return false;   // no checks yet: nothing decided
    return (S.decided_by[i] || []).includes(name);
  }
  const seqCheck = (c) => c.method === "sequential";
  function checkFigure(name) {
    const c = S.gated[name], node = el("div", { class: "plot" });
    const title = c.kind === "abs" ? "Error rate" : `${LABEL[c.metric] || c.metric} ${c.quantile.toUpperCase()}`;
    const sub = seqCheck(c) ? ` · gated, ${Sequence.boundaries(name, c.ship, c.threshold)}` : ` · gated, threshold ${SITS.threshold(c.kind, c.threshold)}`;
    const fig = el("figure", { class: "chart delta", "data-check": name, "data-method": seqCheck(c) ? "sequential" : "fixed", style: "margin:0" },
      el("h3", {}, `${title}: canary vs ${S.compare_to}`, el("span", { class: "muted sub" }, sub)),
      node, el("figcaption", { class: "small cap" }));
    return { fig, node };
  }
  function caption(fig, name, decided) {
    const c = S.gated[name];
    let i = c.outcome.length - 1;
    while (i >= 0 && c.outcome[i] == null) i--;
    if (i < 0) { fig.querySelector(".cap").textContent = ""; return; }
    const o = c.outcome[i], ring = decides(name, decided), seq = seqCheck(c);
    const last = i === c.outcome.length - 1;   // the sequence's windows and time to decide are the newest point's
    fig.querySelector(".cap").replaceChildren(...[el("span", { class: "muted" }, `Check #${S.seq[i]}: `),
      el("span", { class: "val" }, seq ? Sequence.captionText(name, c.delta[i], c.low[i], c.high[i], c.ship, c.threshold)
        : SITS.resultText(c.kind, c.delta[i], c.low[i], c.high[i], c.threshold)), " ",
      el("span", { class: `verdict-${o}` }, `${mark[o]} ${o}`), c.delta[i] == null ? el("span", { class: "muted" }, " (no delta yet: too few requests)") : null,
      seq && last && c.windows != null ? el("span", { class: "muted seq-cap" }, ` · ${Sequence.windows(c)}` + (Sequence.eta({ ...c, outcome: o }) ? ` · ${Sequence.eta({ ...c, outcome: o })}` : "")) : null,
      ring ? el("span", { class: "decided" }, ` · ◯ check #${S.seq[decided]} decided: ${S.decision[decided]}`) : null].filter(Boolean));
    const fails = c.outcome.filter((x, j) => x === "fail" && c.delta[j] != null).length;
    Object.assign(fig.dataset, { fails, band: c.low.filter((x, j) => x != null && c.high[j] != null).length, decided: ring ? S.seq[decided] : "" });
    return ring;
  }
  // the verdict summary (Kayenta's per-metric scores): one row per gated check of the policy with its last delta,
  // interval, threshold and verdict, from the same columns as the charts; above it the overall result
  const ENDED = { latency: "Rolled back by the latency check", error_rate: "Rolled back by the error-rate check",
    guard: "Rolled back by a guard", correctness: "Rolled back by the correctness gate", inconclusive: "Rolled back: inconclusive",
    aborted: "Rolled back", deploy: "Rolled back", promoted: "Promoted", promoted_manually: "Promoted", other: "Ended",
    failed: "Failed" };
  const checkName = (c) => c.metric === "error_rate" ? "error_rate" : `${c.metric}:p${+(c.quantile * 100).toFixed(3)}`.replace(".", "_");
  function summary() {
    const decided = S ? decidedIndex() : -1, rows = [];
    let decider = null;
    for (const pc of R.policy.checks) {
      const name = checkName(pc), c = S && S.gated[name];
      const kind = pc.metric === "error_rate" ? "abs" : "rel";
      const label = kind === "abs" ? "Error rate" : `${LABEL[pc.metric] || pc.metric} P${+(pc.quantile * 100).toFixed(3)}`;
      let i = c ? c.outcome.length - 1 : -1;
      while (i >= 0 && c.outcome[i] == null) i--;
      const o = i >= 0 ? c.outcome[i] : null;
      const deciding = decides(name, decided), promoted = deciding && S.decision[decided] !== "rollback";
      if (deciding && !promoted && !decider) decider = label;
      const f = kind === "abs" ? pt : pct;
      const limit = kind === "abs" ? pc.max_abs_delta : pc.max_rel_delta;
      const seq = R.policy.statistics === "sequential";
      // sequential: the ship boundary as set, else half the limit (analysis/policy.py MetricCheck.ship)
      const ship = (kind === "abs" ? pc.ship_abs_delta : pc.ship_rel_delta) ?? limit / 2;
      const now = c && i >= 0 && seqCheck(c) && i === c.outcome.length - 1;
      const eta = now ? Sequence.eta({ ...c, outcome: o }) : "";
      const modes = now ? Sequence.modes({ ...c, outcome: o }) : null;
      rows.push(el("tr", { "data-check": name, class: deciding ? (promoted ? "decided promoted" : "decided") : null },
        el("th", { scope: "row" }, label, deciding ? el("span", { class: "decided-mark" }, promoted ? " ◀ passed" : " ◀ decided") : null),
        el("td", { class: "num", "data-label": "Last check" }, i < 0 ? el("span", { class: "muted" }, "no check yet") : c.delta[i] == null ? el("span", { class: "muted" }, "– (too few requests)")
          : `${f(c.delta[i])}` + (c.low[i] != null ? ` [${f(c.low[i])}, ${f(c.high[i])}]` : "")),
        el("td", { class: "num", "data-label": seq ? "Boundaries" : "Threshold" }, seq ? Sequence.boundaries(name, ship, limit) : `≤ ${SITS.threshold(kind, limit)}`),
        el("td", { "data-label": "Verdict" }, o ? el("span", { class: `verdict-${o}` }, `${mark[o]} ${o}`) : el("span", { class: "muted" }, "–"),
          eta ? el("span", { class: "need eta" }, eta) : null, modes)));
    }
    $("summary-rows").replaceChildren(...rows);
    const e = R.ended, lc = R.last_check;
    let text, extra = null;
    const last = lc ? ` last check #${lc.seq} ${lc.outcome} → ${lc.decision}.` : " no check yet.";
    if (e) text = `${ENDED[e.kind] || "Ended"}: ${e.text}` + (decider && !["aborted", "deploy", "failed"].includes(e.kind) ? ` (deciding metric: ${decider})` : "") + ".";
    else if (R.phase === SITS.PHASE.PAUSED) text = `Paused at ${R.weight} % (${human(R.reason)}):` + last;
    else if (R.phase === SITS.PHASE.PENDING || R.phase === SITS.PHASE.INITIALIZING) text = `${PHASE_TEXT[R.phase]} No traffic yet;` + last;
    else if (R.phase === SITS.PHASE.PROMOTING) text = `Promoting at ${R.weight} %:` + last;
    else if (R.phase === SITS.PHASE.ROLLING_BACK) text = `Rolling back from ${R.weight} %:` + last;
    else text = `Running at ${R.weight} %:` + last;
    if (e && e.kind === "failed") {
      const w = R.weights;
      extra = el("span", { class: "muted", id: "failed-help" }, ` Canary and baseline are still deployed and the router still sends them traffic as last set `
        + `(canary ${w.canary} %, baseline ${w.baseline} %, production ${w.production} %). The worker does nothing more with this rollout: `
        + `fix the deployment by hand, or retry it as a new rollout.`);
    }
    $("overall").replaceChildren(el("span", { class: e ? (["promoted", "promoted_manually"].includes(e.kind) ? "ok" : ["aborted", "other"].includes(e.kind) ? "muted" : "bad") : "" }, text), extra || "");
    $("verdict-summary").dataset.overall = e ? e.kind : "running";
  }

  function drawCharts() {
    if (!S || !S.t.length) return;
    const rows = [...METRICS.filter((m) => S.metrics[m] || gatedOf(m).length), ...(S.gated.error_rate ? ["error_rate"] : [])];
    $("no-charts").hidden = rows.length > 0;   // correctness checks alone draw nothing
    $("no-charts").textContent = "No latency checks yet: charts appear with the first one.";
    const box = $("charts"), decided = decidedIndex();
    for (const metric of rows) {
      const gated = metric === "error_rate" ? ["error_rate"] : gatedOf(metric);
      if (!charts[metric]) {
        const row = el("div", { class: "chart-row", "data-metric": metric });
        box.append(row);
        const c = charts[metric] = { checks: {}, plots: [] };
        if (metric !== "error_rate") {
          const left = el("div", { class: "plot" });
          // below the percentiles: the distribution behind them at the newest check (distribution.js)
          const dist = el("div", { class: "dist", "data-metric": metric, hidden: true },
            el("h4", {}, `Distribution: canary vs ${S.compare_to}`), el("div", { class: "dist-plot" }), el("p", { class: "small muted dist-cap" }));
          distBoxes[metric] = dist;
          row.append(el("figure", { class: "chart latency", style: `margin:0;grid-row:span ${Math.max(1, gated.length)}` },
            el("h3", {}, LABEL[metric], el("span", { class: "muted" }, " · P90 / P99, log scale")), left, dist));
          const w = Math.max(260, left.clientWidth || (box.clientWidth / 2 - 30));
          c.lat = Charts.latencyChart(left, w, markers);
          c.plots.push([c.lat, left]);
          if (!gated.length) {   // nothing gated on this metric: its deltas are shown, not decided
            const right = el("div", { class: "plot" });
            row.append(el("figure", { class: "chart delta", style: "margin:0" }, el("h3", {}, `${LABEL[metric]}: canary vs ${S.compare_to}`,
              el("span", { class: "muted" }, " · shown, not decided")), right));
            c.delta = Charts.deltaChart(right, w, markers, S.compare_to);
            c.plots.push([c.delta, right]);
          }
        }
      }
      const c = charts[metric], row = box.querySelector(`[data-metric="${metric}"]`);
      for (const name of gated) {
        if (!c.checks[name]) {
          const { fig, node } = checkFigure(name);
          row.append(fig);
          const w = Math.max(260, node.clientWidth || (box.clientWidth / 2 - 30));
          c.checks[name] = { u: Charts.checkChart(node, w, markers, S.gated[name].kind, seqCheck(S.gated[name])), fig };
          c.plots.push([c.checks[name].u, node]);
          const lat = row.querySelector(".chart.latency");
          if (lat) lat.style.gridRow = `span ${Object.keys(c.checks).length}`;
        }
        const ring = caption(c.checks[name].fig, name, decided);
        c.checks[name].u.setData(Charts.checkData(S, name, ring ? decided : -1, seqCheck(S.gated[name])));
      }
      if (c.lat) {
        c.lat.setData(Charts.latencyData(S, metric));
        // how many points each chart holds (x values with a canary P99), for people reading the DOM and the UI test
        row.dataset.points = Charts.latencyData(S, metric)[6].filter((v) => v != null).length;
      } else {
        row.dataset.points = S.gated.error_rate.outcome.filter((v) => v != null).length;
      }
      if (c.delta) c.delta.setData(Charts.deltaData(S, metric, thresholds(metric)));
    }
  }
  new ResizeObserver(() => {
    for (const c of Object.values(charts)) for (const [u, node] of c.plots) u.setSize({ width: node.clientWidth, height: 230 });
    if (dist) Distribution.renderAll(dist, distBoxes);
  }).observe($("charts"));
  // ---- checks --------------------------------------------------------------------------------------------------
  function resultGrid(c) {
    const grid = el("div", { class: c.results.some(Sequence.isSeq) ? "results seq" : "results" });
    for (const r of c.results) {
      const rate = r.check === "error_rate";
      const val = rate ? SITS.rate : ms;
      const route = (r.series.match(/route="([^"]+)"/) || [])[1];
      const delta = rate ? r.delta_abs : r.delta_rel;
      grid.append(el("span", { class: "lbl" }, r.label.replace("request latency", "latency"), route ? el("small", {}, " " + route) : null),
        el("span", {}, `${val(r.canary)} vs ${val(r.target)}`),
        Sequence.isSeq(r) ? Sequence.deltaCell(r)
          : el("span", { class: "delta", "data-check": r.check }, SITS.resultText(rate ? "abs" : "rel", delta, r.ci_low, r.ci_high, r.threshold)),
        el("span", { class: `verdict-${r.outcome}`, title: r.reason }, `${mark[r.outcome]} ${r.outcome}`, r.need_more && !Sequence.isSeq(r) ? el("span", { class: "need" }, `needs about ${SITS.requests(r.need_more)} more`) : null));
    }
    return grid;
  }
  function checkRow(c) {
    const v = c.variants, target = c.compare_to;
    const req = (role) => v[role] && v[role].requests != null ? Math.round(v[role].requests) + (v[role].replayed ? ` (${Math.round(v[role].replayed)} replayed)` : "") : "–";
    const btn = el("button", { type: "button", class: "secondary", "aria-expanded": "false" }, "Evidence");
    const gate = c.correctness;   // a correctness-gate check: prompts replayed, no latency results
    const tr = el("tr", { "data-seq": c.seq, class: gate ? "gate" : null },
      el("td", { class: "when" }, el("strong", {}, `#${c.seq}`), clock(c.at)),
      el("td", { class: "when" }, c.step < 0 ? "before traffic" : `step ${c.step + 1}/${R.steps.length}`, el("br"), `${c.weight} %`),
      gate ? el("td", { class: "when" }, `${gate.prompts} prompts`, el("br"), el("span", { class: "muted" }, "replayed on both"))
        : el("td", { class: "when" }, `${req("canary")}`, el("br"), el("span", { class: "muted" }, `${req(target)}`)),
      el("td", { class: "results-cell" }, gate ? Correctness.cell(c) : resultGrid(c)),
      el("td", { class: "verdict" }, el("strong", { class: `verdict-${c.outcome}` }, `${mark[c.outcome]} ${c.outcome}`), el("div", { class: "muted small" }, `→ ${c.decision}`),
        // sequential checks say "decides in ~N s" per metric instead of a request count
        c.need_more && !(c.results || []).some(Sequence.isSeq) ? el("span", { class: "need" }, `needs about ${SITS.requests(c.need_more)} more per variant`) : null, btn));
    btn.addEventListener("click", async () => {
      const open = tr.nextElementSibling && tr.nextElementSibling.classList.contains("evidence");
      if (open) { tr.nextElementSibling.remove(); btn.setAttribute("aria-expanded", "false"); return; }
      const res = await api(`/rollouts/${encodeURIComponent(id)}/checks/${c.seq}`);
      const pre = el("pre", { tabindex: "0", "aria-label": `raw evidence of check ${c.seq}` }, JSON.stringify(res.data, null, 1));
      tr.after(el("tr", { class: "evidence" }, el("td", { colspan: "5" }, el("div", { class: "evidence-box" }, el("p", { class: "small muted" }, human(c.reason)),
        Sequence.table(c.results, target), Sequence.replica(c.replica), pre))));
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
    for (const c of res.data.checks) {
      body.prepend(checkRow(c));
      if (c.seq > lastCheckRow && !c.correctness) $("replica").replaceChildren(Sequence.replica(c.replica) || "");
      lastCheckRow = Math.max(lastCheckRow, c.seq);
    }
    const rows = [...body.querySelectorAll("tr:not(.evidence)")];
    rows.forEach((tr, i) => { tr.hidden = !showAll && i >= 10; });
    $("more-checks").hidden = showAll || R.checks <= 10;
    $("more-checks").textContent = `Show all ${R.checks} checks`;
    $("no-checks").hidden = lastCheckRow > 0;
    document.getElementById("checks").hidden = lastCheckRow === 0;
  }
  // the newest latency check's histograms (a correctness check has none), fetched once per new check
  async function loadDistribution() {
    const seq = S && S.seq.length ? S.seq[S.seq.length - 1] : 0;
    if (!seq || seq === distSeq || !Object.keys(distBoxes).length) return;
    const res = await api(`/rollouts/${encodeURIComponent(id)}/checks/${seq}/distribution`);
    if (!res.ok) return;
    distSeq = seq;
    dist = res.data;
    Distribution.renderAll(dist, distBoxes);
  }
  async function refresh() {
    const res = await api(`/rollouts/${encodeURIComponent(id)}`);
    if (!res.ok) return false;
    R = res.data;
    header();
    stepper();
    Correctness.render($("correctness"), R);
    await Engines.load(R);
    if (R.checks > lastSeq) {
      const s = await api(`/rollouts/${encodeURIComponent(id)}/series?since_seq=${lastSeq}`);
      if (s.ok && s.data.last_seq != null) { appendSeries(s.data); lastSeq = s.data.last_seq; drawCharts(); }
      await loadChecks();
    }
    await loadDistribution();
    summary();
    await Events.load(id);
    return true;
  }
  header();
  stepper();
  Correctness.render($("correctness"), R);
  document.getElementById("checks").hidden = true;
  if (R.policy.statistics === "sequential") {   // the table's header in the sequence's words
    $("checks-results-h").textContent = `Per metric: canary vs ${R.compare_to}, effect [confidence sequence]; ship / limit; windows`;
    $("summary-delta-h").textContent = "Last check: effect [sequence]";
    $("summary-threshold-h").textContent = "Boundaries";
  }
  poll(refresh, 1500);
})();
