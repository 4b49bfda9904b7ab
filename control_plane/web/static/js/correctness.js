// The detail page's Correctness section (the latest gate verdict, its history, the first divergences side by side)
// and the checks table's cell for a correctness check; data from GET /rollouts/<id> (field "correctness").
"use strict";
const Correctness = (() => {
  const { api, el, clock, mark } = SITS;
  const frac = (x, d = 0) => x == null ? "–" : (x * 100).toFixed(d) + " %";
  const num = (x) => x == null ? "–" : Math.abs(x) >= 0.01 || x === 0 ? (+x.toPrecision(2)).toString() : x.toExponential(1);
  const where = (c, steps) => c.step < 0 ? "before traffic" : `step ${c.step + 1}/${steps} · ${c.weight} %`;
  const outcome = (o) => el("span", { class: `badge verdict-badge v-${o}` }, `${mark[o] || ""} ${o}`);
  const TOL = { identical_fraction: "identical fraction", top1_agreement: "top-1 agreement", drift_mean: "drift mean",
    drift_max: "drift max", flip_margin: "flip margin", max_error_fraction: "replay errors", conformance: "op-level conformance",
    confident_top1: "top-1 where the baseline was sure", confident_drift_mean: "drift mean where sure",
    confident_drift_max: "drift max where sure" };

  // the token ids with the one at `at` marked, and the text with everything from the first differing character on
  function ids(tokens, at) {
    return el("code", { class: "ids" }, "[", tokens.flatMap((t, i) => [i ? ", " : "",
      i === at ? el("mark", { title: `token ${at}: the first that differs` }, String(t)) : String(t)]), "]");
  }
  function text(s, other) {
    let i = 0;
    while (i < s.length && i < other.length && s[i] === other[i]) i++;
    return el("span", { class: "text" }, s.slice(0, i), i < s.length ? el("mark", {}, s.slice(i)) : null);
  }
  function divergence(e) {
    if (e.error) return el("li", { class: "div" }, el("p", { class: "prompt" }, `Prompt ${e.index} `, el("q", {}, e.prompt)), el("p", { class: "bad small" }, e.error));
    const at = e.first_divergence;
    const head = at == null ? "no divergence" : `first divergence at token ${at}`;
    const side = (role, toks, txt, other, margin) => el("div", { class: `side ${role}` },
      el("div", { class: "who" }, el("span", { class: `swatch ${role}`, "aria-hidden": "true" }), role,
        at != null ? el("span", { class: "muted small" }, ` · margin ${num(margin)}`) : null),
      text(txt, other), ids(toks, at));
    return el("li", { class: "div" },
      el("p", { class: "prompt" }, el("strong", {}, `Prompt ${e.index}`), " ", el("q", {}, e.prompt)),
      el("p", { class: "muted small" }, `${head} of ${e.compared} compared` + (at != null
        ? ` · logprob margins there: baseline ${num(e.baseline_margin)}, canary ${num(e.canary_margin)}` : "")
        + ` · drift max ${num(e.drift_max)} before it, ${num(e.forced_drift_max)} fed the baseline's tokens`),
      el("div", { class: "sides" }, side("baseline", e.baseline_tokens, e.baseline_text, e.canary_text, e.baseline_margin),
        side("canary", e.canary_tokens, e.canary_text, e.baseline_text, e.canary_margin)));
  }

  // the op-level conformance of the canary engine's kernels (analysis/conformance.py): what was judged, the failures
  function conformance(cf) {
    if (!cf) return null;
    const err = (f) => f.error == null ? (f.exception || "no result") : num(f.error);
    const rows = (cf.failures || []).map((f) => el("tr", {},
      el("td", { "data-label": "Op" }, el("code", {}, f.op)), el("td", { "data-label": "Shape" }, f.case),
      el("td", { class: "num bad", "data-label": "Error" }, err(f)),
      el("td", { class: "num", "data-label": "Allowed" }, num(f.allowed)),
      el("td", { class: "num", "data-label": "Reference's own" }, num(f.reference_error))));
    const w = cf.worst;
    // op names whole, one code element each: a line breaks between two ops, not inside one
    const opList = (ops) => !ops || !ops.length ? el("dd", {}, "none")
      : el("dd", { class: "ops" }, ...ops.flatMap((op, i) => [i ? ", " : null, el("code", {}, op)]));
    return el("div", { class: "card conformance", id: "conformance" },
      el("p", { class: "conformance-head" }, outcome(cf.outcome), " ", el("strong", {}, "Op-level conformance"),
        el("span", { class: "muted" }, ` · the canary's engine${cf.device ? ` on ${cf.device}` : ""}${cf.dtype ? ` · ${cf.dtype}` : ""}`)),
      el("dl", { class: "stats" },
        el("div", {}, el("dt", {}, "Judged (changed from production)"), opList(cf.judged_ops)),
        cf.unchanged_ops && cf.unchanged_ops.length ? el("div", {}, el("dt", {}, "As production (not judged)"), opList(cf.unchanged_ops)) : null,
        el("div", {}, el("dt", {}, "Cases at the served shapes"), el("dd", { class: cf.failed_cases ? "bad" : null },
          `${cf.cases}` + (cf.failed_cases ? `, ${cf.failed_cases} out of tolerance` : "") + (cf.seconds != null ? ` · measured in ${cf.seconds.toFixed(1)} s` : ""))),
        el("div", {}, el("dt", {}, "Bound"), el("dd", {}, `error ≤ ${cf.k != null ? cf.k : "k"} × the reference's own error + atol`)),
        w && !cf.failed_cases ? el("div", {}, el("dt", {}, "Closest to its bound"), el("dd", {}, `${w.op}: ${num(w.error)} of ${num(w.allowed)} allowed`)) : null),
      rows.length ? el("div", { class: "table-wrap" }, el("table", { class: "conformance-failures" },
        el("thead", {}, el("tr", {}, ["Op", "Shape", "Error", "Allowed", "Reference's own"].map((h) => el("th", {}, h)))),
        el("tbody", {}, rows))) : null,
      cf.outcome !== "fail" ? el("p", { class: "reason" }, cf.reason) : null);   // a failure's reason is the table
  }

  let shown = "", all = null;
  function render(box, R) {
    const c = R.correctness;
    if (!c || !c.latest) return;
    const L = c.latest, key = `${c.runs}:${L.seq}:${all ? "all" : ""}`;
    if (key === shown) return;
    shown = key;
    const steps = R.steps.length;
    const stat = (label, value, bad) => el("div", {}, el("dt", {}, label), el("dd", { class: bad ? "bad" : null }, value));
    const failed = new Set(L.failed || []);
    const evidence = all || L.evidence;
    const more = !all && L.evidence_total > L.evidence.length
      ? el("button", { type: "button", class: "secondary", id: "more-divergences" }, `Show all ${L.evidence_total} kept`) : null;
    if (more) more.addEventListener("click", async () => {
      const res = await api(`/rollouts/${encodeURIComponent(R.id)}/checks/${L.seq}`);
      if (res.ok) { all = res.data.verdict.correctness.evidence; render(box, R); }
    });
    // replaceChildren() turns a null argument into the text "null": pass only the parts that exist
    box.replaceChildren(...[
      el("div", { class: "card verdict-card" },
        el("p", { class: "verdict-head" }, outcome(L.outcome), " ", el("strong", {}, `check #${L.seq}`),
          el("span", { class: "muted" }, ` · ${where(L, steps)} · ${clock(L.at)} · → ${L.decision}`)),
        el("dl", { class: "stats" },
          stat("Tolerances", L.dtype || "unknown dtype"),
          stat("Prompts replayed", `${L.prompts}` + (L.errors ? `, ${L.errors} failed` : ""), failed.has("max_error_fraction")),
          stat(`Identical over ${c.compare_tokens} tokens`, `${frac(L.identical_fraction)} · ${L.diverged} diverged`, failed.has("identical_fraction")),
          stat("Top-1 agreement (teacher forcing)", frac(L.top1_agreement, 1), failed.has("top1_agreement")),
          stat("Logprob drift mean / max", `${num(L.drift_mean)} / ${num(L.drift_max)}`, failed.has("drift_mean") || failed.has("drift_max")),
          L.confident_positions ? stat(`Where the baseline was sure (${L.confident_positions} of ${L.positions} positions): top-1 · drift mean / max`,
            `${frac(L.confident_top1, 1)} · ${num(L.confident_drift_mean)} / ${num(L.confident_drift_max)}`,
            failed.has("confident_top1") || failed.has("confident_drift_mean") || failed.has("confident_drift_max")) : null,
          stat("Failed tolerances", failed.size ? [...failed].map((f) => TOL[f] || f).join(", ") : "none", failed.size > 0),
          L.seconds != null ? stat("Cost", `${L.requests} requests in ${L.seconds.toFixed(1)} s`) : null),
        el("p", { class: "reason" }, L.reason)),
      conformance(L.conformance),
      evidence.length ? el("h3", {}, `First divergences`, el("span", { class: "muted" }, ` · ${evidence.length} shown of the ${L.evidence_total} kept as evidence` + (L.diverged > L.evidence_total ? ` (${L.diverged} prompts diverged)` : ""))) : null,
      evidence.length ? el("ol", { class: "divergences" }, evidence.map(divergence)) : null,
      more ? el("p", { class: "center" }, more) : null,
      el("h3", {}, "History", el("span", { class: "muted" }, ` · ${c.runs} run${c.runs === 1 ? "" : "s"}`)),
      el("ol", { class: "events history" }, c.history.slice().reverse().map((h) => el("li", {},
        el("span", { class: "t" }, `#${h.seq} ${clock(h.at)}`), el("span", { class: `verdict-${h.outcome}` }, `${mark[h.outcome]} ${h.outcome} → ${h.decision}`),
        el("span", { class: "msg" }, el("span", { class: "muted" }, where(h, steps) + ": "), h.reason))))].filter(Boolean));
  }

  // the checks table's metric cell of a correctness check (it has no latency results)
  function cell(c) {
    const s = c.correctness;
    return el("div", { class: "gate-cell" }, el("strong", {}, "Correctness gate"), el("span", { class: "muted" }, ` (${s.dtype || "?"} tolerances)`), el("br"),
      `${s.prompts} prompts: ${frac(s.identical_fraction)} identical, ${s.diverged} diverged · top-1 ${frac(s.top1_agreement, 1)} · drift max ${num(s.drift_max)}`,
      s.conformance ? ` · ops ${s.conformance.outcome}` + (s.conformance.judged_ops && s.conformance.judged_ops.length ? ` (${s.conformance.judged_ops.join(", ")})` : "") : null,
      s.failed && s.failed.length ? el("span", { class: "bad" }, ` · failed: ${s.failed.map((f) => TOL[f] || f).join(", ")}`) : null,
      " ", el("a", { href: "#correctness-h" }, "details"));
  }
  return { render, cell, where };
})();
