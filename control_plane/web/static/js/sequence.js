// Sequential statistics (Policy.statistics "sequential") as the detail page shows them, the same things the same
// way as the CLI's text (control_plane/service/format.py sequential_rows, replica_lines): per check series the
// windows' mean effect, the confidence sequence [lo, hi], both boundaries "ship +12.5 % / limit +25 %", the windows
// used ("x2" when correlated windows were averaged in blocks) and, while undecided, "decides in ~N s"; and the
// replica offset (production against baseline, the same kernels at the same time: a live A/A). Results of the fixed
// method (older rollouts, statistics "fixed") carry no `method: "sequential"` and keep the fixed columns.
"use strict";
const Sequence = (() => {
  const { el, pct, pt, rate, ms, mark } = SITS;
  const isSeq = (r) => !!r && r.method === "sequential";
  const isRate = (check) => check === "error_rate";
  const fmt = (check) => isRate(check) ? pt : pct;

  // "p90 request latency /v1/completions" (format.py series_label), "error rate"
  function seriesLabel(label, series) {
    const route = ((series || "").match(/route="([^"]+)"/) || [])[1];
    return isRate(series) ? "error rate" : label + (route ? " " + route : "");
  }
  // a boundary as the policy writes it: "+12.5 %", "+0.50 pt"
  const bound = (check, x) => x == null ? "–" : isRate(check) ? SITS.threshold("abs", x) : SITS.threshold("rel", x);
  // "ship +12.5 % / limit +25 %"
  const boundaries = (check, ship, limit) => `ship ${bound(check, ship)} / limit ${bound(check, limit)}`;
  // "+19.8 % [+8.5 %, +32.2 %]": the effect and its sequence
  function effect(r) {
    const f = fmt(r.check);
    return (r.delta_rel != null ? f(r.delta_rel) : "–") + (r.ci_low != null ? ` [${f(r.ci_low)}, ${f(r.ci_high)}]` : "");
  }
  // "10 windows", "12 windows (x2)": blocks of 2 adjacent windows averaged (their values were correlated)
  function windows(r) {
    const n = r.windows || 0, b = r.block || 1;
    return `${n} window${n === 1 ? "" : "s"}` + (b > 1 ? ` (x${b})` : "");
  }
  // "decides in ~40 s" while inconclusive with an estimate; "" otherwise
  function eta(r) {
    if (r.outcome !== "inconclusive" || r.eta_s == null) return "";
    return `decides in ~${Math.round(r.eta_s)} s`;
  }
  // "3 of 26 windows jump 2x: two modes?" while undecided, when a minority of the windows lies a factor 2 from the
  // rest (analysis/sequential.py jumps): the quantile sits between two modes of the latency and decides slowly
  function modes(r) {
    if (r.outcome !== "inconclusive" || !r.jumps) return null;
    const why = "A few windows' quantile lands in a second, slower mode of the latency (e.g. steps that carry a "
      + "prefill chunk): the sequence narrows slowly. A quantile inside one mode decides sooner (docs/control-loop.md, "
      + "\"Choosing a tail quantile\").";
    return el("span", { class: "need modes", title: why }, `${r.jumps} of ${r.windows} windows jump 2x: two modes?`);
  }
  const blockTip = (r) => (r.block || 1) > 1 ? `adjacent windows averaged in blocks of ${r.block}: their values were correlated (lag-1 ${r.lag1 == null ? "?" : r.lag1.toFixed(2)})` : null;

  // the checks table's result cell (the grid's third column): the effect and its sequence, and under it the
  // boundaries, the windows and the time to decide
  function deltaCell(r) {
    return el("span", { class: "delta seq", "data-check": r.check, "data-method": "sequential" },
      el("span", { class: "eff" }, el("span", {}, r.delta_rel != null ? fmt(r.check)(r.delta_rel) : "–"),
        r.ci_low != null ? [" ", el("span", {}, `[${fmt(r.check)(r.ci_low)}, ${fmt(r.check)(r.ci_high)}]`)] : null),
      el("span", { class: "seq-meta" },
        el("span", { class: "bounds" }, boundaries(r.check, r.ship, r.threshold)),
        el("span", { class: "windows", title: blockTip(r) }, windows(r)),
        eta(r) ? el("span", { class: "eta" }, eta(r)) : null, modes(r)));
  }

  // a chart caption's and the verdict card's text: "+19.8 % [+8.5 %, +32.2 %] · ship +10 % / limit +25 %"
  const captionText = (check, delta, low, high, ship, limit) => {
    const f = fmt(check);
    return (delta != null ? f(delta) : "–") + (low != null ? ` [${f(low)}, ${f(high)}]` : "") + ` · ${boundaries(check, ship, limit)}`;
  };

  // the evidence box's table: format.py sequential_rows, one row per series
  function table(results, target) {
    const head = ["metric", "canary", target, "effect", "sequence", "ship / limit", "windows", "decides in", "verdict"];
    const rows = results.filter(isSeq).map((r) => {
      const f = fmt(r.check), val = isRate(r.check) ? rate : ms;
      const e = eta(r);
      // data-label: a phone shows each series as a card, every value under its column's name
      const td = (i, text, attrs = {}) => el("td", { class: "num", "data-label": head[i], ...attrs }, text);
      return el("tr", { "data-check": r.check },
        el("th", { scope: "row" }, seriesLabel(r.label || r.check, r.series)),
        td(1, val(r.canary)), td(2, val(r.target)),
        td(3, r.delta_rel != null ? f(r.delta_rel) : "–"),
        td(4, r.ci_low != null ? `[${f(r.ci_low)}, ${f(r.ci_high)}]` : "–"),
        td(5, `${bound(r.check, r.ship)} / ${bound(r.check, r.threshold)}`),
        td(6, String(r.windows || 0) + ((r.block || 1) > 1 ? ` (x${r.block})` : ""), { title: blockTip(r) }),
        td(7, e ? e.replace("decides in ", "") : "–"),
        el("td", { "data-label": head[8] }, el("span", { class: `verdict-${r.outcome}` }, `${mark[r.outcome]} ${r.outcome}`)));
    });
    if (!rows.length) return null;
    return el("div", { class: "seq-table-wrap" },
      el("p", { class: "small muted seq-caption" }, `Sequential statistics: the windows' mean effect, its confidence sequence (alpha ${fmtAlpha(results)}), both boundaries`),
      el("table", { class: "seq-table" },
      el("thead", {}, el("tr", {}, ...head.map((h) => el("th", { scope: "col" }, h)))), el("tbody", {}, ...rows)));
  }
  function fmtAlpha(results) {
    const a = results.filter(isSeq).map((r) => r.alpha).filter((x) => x != null);
    return a.length ? +Math.min(...a).toPrecision(2) + (a.length > 1 && Math.min(...a) !== Math.max(...a) ? "–" + +Math.max(...a).toPrecision(2) : "") + " per series" : "–";
  }

  // format.py replica_lines: one short line per series, "p90 request latency /v1/completions +4.3 % [−6.1 %, +15.8 %]
  // over 10 windows"
  function replicaLine(o) {
    const f = fmt(o.check);
    const bounds = o.ci_low != null ? ` [${f(o.ci_low)}, ${f(o.ci_high)}]` : "";
    return el("li", { "data-check": o.check }, el("span", { class: "lbl" }, seriesLabel(o.label || o.check, o.series)), " ",
      el("span", { class: "num" }, `${o.delta == null ? "–" : f(o.delta)}${bounds}`), el("span", { class: "muted" }, ` over ${o.windows} windows`));
  }
  function replica(list) {
    if (!list || !list.length) return null;
    return el("div", { class: "replica" },
      el("p", { class: "small muted replica-head" }, "Replica offset (production vs baseline, same kernels): how far two identical engines differ here, a live A/A the ship boundary must clear."),
      el("ul", { class: "replica-lines small" }, ...list.map(replicaLine)));
  }

  return { isSeq, boundaries, bound, effect, windows, eta, modes, deltaCell, captionText, table, replica, seriesLabel };
})();
