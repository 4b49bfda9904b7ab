// uPlot charts of the detail page: per metric, P90/P99 of production (grey), baseline (blue), canary (orange) on a
// log scale, and the canary-vs-target delta with its confidence band, the threshold (dashed red) and verdict dots.
"use strict";
const Charts = (() => {
  const css = (name) => getComputedStyle(document.documentElement).getPropertyValue(name).trim();
  const { ROLES } = SITS;
  const syncKey = "sits-detail";
  // the nearest 1-2-5 x 10^k below (floor) or above (ceil) x: round log-axis ends
  function nice(x, round) {
    const k = Math.floor(Math.log10(x)), steps = [1, 2, 5, 10];
    const m = x / 10 ** k;
    const pick = round === Math.floor ? [...steps].reverse().find((s) => s <= m + 1e-9) : steps.find((s) => s >= m - 1e-9);
    return pick * 10 ** k;
  }

  function axes(yFmt) {
    const grid = { stroke: css("--line-soft"), width: 1 };
    const ticks = { stroke: css("--line"), width: 1 };
    return [
      { stroke: css("--muted"), grid, ticks, space: 80, values: (u, vals) => {
        const span = (u.scales.x.max ?? 0) - (u.scales.x.min ?? 0);
        const f = span < 900 ? { hour: "2-digit", minute: "2-digit", second: "2-digit" } : { hour: "2-digit", minute: "2-digit" };
        return vals.map((v) => new Date(v * 1000).toLocaleTimeString("en-GB", f));
      } },
      { stroke: css("--muted"), grid, ticks, size: 70, values: (u, vals) => vals.map((v) => v == null ? "" : yFmt(v)) },
    ];
  }

  // vertical markers at weight changes, shaded warm-up windows after them
  function markerPlugin(getMarkers) {
    return {
      hooks: {
        drawClear: [(u) => {
          const { ctx } = u;
          const top = u.bbox.top, h = u.bbox.height;
          ctx.save();
          for (const m of getMarkers()) {
            const x0 = u.valToPos(m.t, "x", true);
            if (m.until) {
              const x1 = u.valToPos(m.until, "x", true);
              ctx.fillStyle = "rgba(128,128,128,0.10)";
              ctx.fillRect(Math.max(x0, u.bbox.left), top, Math.max(0, Math.min(x1, u.bbox.left + u.bbox.width) - Math.max(x0, u.bbox.left)), h);
            }
            if (x0 >= u.bbox.left && x0 <= u.bbox.left + u.bbox.width) {
              ctx.strokeStyle = css("--muted");
              ctx.setLineDash([2, 3]);
              ctx.lineWidth = 1;
              ctx.beginPath(); ctx.moveTo(x0, top); ctx.lineTo(x0, top + h); ctx.stroke();
              ctx.setLineDash([]);
              ctx.fillStyle = css("--muted");
              ctx.font = `${11 * devicePixelRatio}px system-ui`;
              ctx.fillText(m.label, x0 + 4 * devicePixelRatio, top + 12 * devicePixelRatio);
            }
          }
          ctx.restore();
        }],
      },
    };
  }

  function latencyChart(node, width, getMarkers) {
    const series = [{ label: "time", value: (u, v) => v == null ? "–" : SITS.clock(v) }];
    for (const role of ROLES) {
      const color = css("--" + role);
      series.push({ label: `${role} P90`, stroke: color, width: 1.5, dash: [5, 4], spanGaps: false, value: (u, v) => SITS.ms(v) });
      series.push({ label: `${role} P99`, stroke: color, width: 2, spanGaps: false, value: (u, v) => SITS.ms(v) });
    }
    const opts = {
      width, height: 250, series, axes: axes((v) => SITS.ms(v)), plugins: [markerPlugin(getMarkers)],
      scales: { x: { time: true }, y: { distr: 3, log: 10, range: (u, min, max) => {
        if (min == null || max == null || !(min > 0)) return [0.001, 1];
        return [nice(min / 1.3, Math.floor), nice(max * 1.3, Math.ceil)];
      } } },
      cursor: { sync: { key: syncKey }, points: { size: 6 } },
      legend: { live: true },
    };
    return new uPlot(opts, [[], [], [], [], [], [], []], node);
  }

  function deltaChart(node, width, getMarkers, target) {
    const bad = css("--bad"), ok = css("--ok"), grey = css("--muted"), canary = css("--canary");
    const pctv = (u, v) => SITS.pct(v);
    const dots = (label, color) => ({ label, stroke: color, fill: color, width: 0, paths: () => null,
      points: { show: true, size: 9, width: 1, stroke: color, fill: color }, value: pctv });
    const series = [
      { label: "time", value: (u, v) => v == null ? "–" : SITS.clock(v) },
      { label: "P99 CI low", stroke: "transparent", width: 0, value: pctv, points: { show: false } },
      { label: "P99 CI high", stroke: "transparent", width: 0, value: pctv, points: { show: false } },
      { label: `P99 vs ${target}`, stroke: canary, width: 2, value: pctv },
      { label: `P90 vs ${target}`, stroke: canary, width: 1.2, dash: [5, 4], value: pctv },
      { label: "P99 threshold", stroke: bad, width: 1.5, dash: [7, 5], value: pctv, points: { show: false } },
      { label: "P90 threshold", stroke: bad, width: 1, dash: [2, 4], value: pctv, points: { show: false } },
      dots("pass", ok), dots("inconclusive", grey), dots("fail", bad),
    ];
    const opts = {
      width, height: 250, series, axes: axes((v) => SITS.pct(v, 0)), plugins: [markerPlugin(getMarkers)],
      bands: [{ series: [2, 1], fill: "rgba(224,112,26,0.16)" }],
      scales: { x: { time: true }, y: { range: (u, min, max) => {
        const lo = Math.min(min ?? 0, -0.05), hi = Math.max(max ?? 0, 0.05);
        const pad = (hi - lo) * 0.08;
        return [lo - pad, hi + pad];
      } } },
      cursor: { sync: { key: syncKey }, points: { size: 6 } },
      legend: { live: true },
    };
    return new uPlot(opts, [[], [], [], [], [], [], [], [], [], []], node);
  }

  // one gated check (a quantile of a metric, or the error rate) against the target: the same delta, interval and
  // outcome as the checks table's row for it, the band between the bounds, the threshold dashed red, a dot per check
  // coloured by its verdict, and a ring on the check that decided the rollout's end. Sequential statistics (`seq`):
  // the band is the confidence sequence, and both boundaries are drawn: the limit dashed red, the ship boundary
  // (a change small enough to ship; the canary fails once the sequence's lower bound is above it) dotted amber
  function checkChart(node, width, getMarkers, kind, seq = false) {
    const bad = css("--bad"), ok = css("--ok"), grey = css("--muted"), canary = css("--canary");
    const f = kind === "abs" ? SITS.pt : SITS.pct;
    const v = (u, x) => f(x);
    const dots = (label, color, size = 9, fill = color) => ({ label, stroke: color, fill, width: 0, paths: () => null,
      points: { show: true, size, width: size > 9 ? 2.5 : 1, stroke: color, fill }, value: v });
    const series = [
      { label: "time", value: (u, x) => x == null ? "–" : SITS.clock(x) },
      { label: "low", stroke: "transparent", width: 0, value: v, points: { show: false } },
      { label: "high", stroke: "transparent", width: 0, value: v, points: { show: false } },
      { label: "delta", stroke: canary, width: 2, value: v },
      { label: seq ? "limit" : "threshold", stroke: bad, width: 1.5, dash: [7, 5], value: v, points: { show: false } },
      dots("pass", ok), dots("inconclusive", grey), dots("fail", bad),
      dots("decided", css("--text"), 17, "transparent"),
    ];
    if (seq) series.push({ label: "ship", stroke: css("--warn"), width: 1.5, dash: [2, 3], value: v, points: { show: false } });
    const opts = {
      width, height: 230, series, axes: axes((x) => kind === "abs" ? SITS.pt(x) : SITS.pct(x, 0)),
      plugins: [markerPlugin(getMarkers)], bands: [{ series: [2, 1], fill: "rgba(224,112,26,0.18)" }],
      scales: { x: { time: true }, y: { range: (u, min, max) => {
        const span = kind === "abs" ? 0.005 : 0.05;
        const lo = Math.min(min ?? 0, -span), hi = Math.max(max ?? 0, span);
        const pad = (hi - lo) * 0.08;
        return [lo - pad, hi + pad];
      } } },
      cursor: { sync: { key: syncKey }, points: { size: 6 } },
      legend: { live: true },
    };
    return new uPlot(opts, series.map(() => []), node);
  }

  // S.gated[name] -> checkChart's data; `decided`: the index of the check that ended the rollout (or -1)
  // (sequential: one more column, the ship boundary)
  function checkData(s, name, decided = -1, seq = false) {
    const c = s.gated[name];
    const none = s.t.map(() => null);
    if (!c) return [s.t, none, none, none, none, none, none, none, none, ...(seq ? [none] : [])];
    // a check without a delta (too few requests) has no dot: the table shows "–" for it too
    const at = (o) => c.delta.map((x, i) => c.outcome[i] === o ? x : null);
    return [s.t, c.low, c.high, c.delta, s.t.map(() => c.threshold), at("pass"), at("inconclusive"), at("fail"),
      c.delta.map((x, i) => i === decided ? x : null), ...(seq ? [s.t.map(() => c.ship ?? null)] : [])];
  }

  // data of one metric -> the two charts' data arrays
  function latencyData(s, metric) {
    const m = s.metrics[metric];
    const out = [s.t];
    for (const role of ROLES) {
      out.push(m ? m.quantiles[role].p90 : s.t.map(() => null));
      out.push(m ? m.quantiles[role].p99 : s.t.map(() => null));
    }
    return out;
  }

  function deltaData(s, metric, limits = {}) {
    const m = s.metrics[metric];
    const none = s.t.map(() => null);
    const d99 = (m && m.deltas.p99) || null, d90 = (m && m.deltas.p90) || null;
    const th = (q) => limits[q] != null ? s.t.map(() => limits[q]) : none;
    const dot = (which) => d99 ? d99.delta.map((v, i) => d99.outcome[i] === which ? v : null) : none;
    return [s.t, d99 ? d99.low : none, d99 ? d99.high : none, d99 ? d99.delta : none, d90 ? d90.delta : none,
      th("p99"), th("p90"), dot("pass"), dot("inconclusive"), dot("fail")];
  }

  return { latencyChart, deltaChart, checkChart, latencyData, deltaData, checkData };
})();
