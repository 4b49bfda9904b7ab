// A check's latency distribution (GET .../checks/<seq>/distribution): canary against its comparison target as two
// step outlines over the engines' shared buckets, log-scale time axis, each variant's P90/P99 as ticks; every bin
// says its range and shares on hover. Drawn as SVG (no library); colours from the CSS variables.
"use strict";
const Distribution = (() => {
  const NS = "http://www.w3.org/2000/svg";
  const svg = (tag, attrs = {}, ...kids) => {
    const e = document.createElementNS(NS, tag);
    for (const [k, v] of Object.entries(attrs)) if (v != null) e.setAttribute(k, v);
    for (const k of kids) e.append(k instanceof Node ? k : document.createTextNode(String(k)));
    return e;
  };
  const H = 170, PAD = { l: 40, r: 10, t: 10, b: 22 };

  // 1-2-5 ticks per decade inside [lo, hi] (seconds), at most ~7
  function ticks(lo, hi) {
    const out = [];
    for (let e = Math.floor(Math.log10(lo)); e <= Math.ceil(Math.log10(hi)); e++) {
      for (const m of [1, 2, 5]) { const v = m * 10 ** e; if (v >= lo && v <= hi) out.push(v); }
    }
    return out.length > 7 ? out.filter((v) => String(v).match(/^1|^0\.0*1/)) : out;
  }

  function render(box, d, target, width) {
    const n = d.lower.length;
    const lower = d.lower.map((x, i) => x > 0 ? x : d.upper[i] / 1.25);
    const upper = d.upper.map((x, i) => x != null ? x : lower[i] * 1.5);
    const lo = lower[0], hi = upper[n - 1];
    const W = Math.max(260, width), iw = W - PAD.l - PAD.r, ih = H - PAD.t - PAD.b;
    const X = (v) => PAD.l + iw * (Math.log10(v) - Math.log10(lo)) / (Math.log10(hi) - Math.log10(lo));
    const top = Math.max(...d.canary, ...d.target) * 1.1 || 1;
    const Y = (v) => PAD.t + ih * (1 - v / top);
    const outline = (shares) => {
      let p = `M${X(lower[0]).toFixed(1)},${Y(0).toFixed(1)}`;
      for (let i = 0; i < n; i++) p += `V${Y(shares[i]).toFixed(1)}H${X(upper[i]).toFixed(1)}`;
      return p + `V${Y(0).toFixed(1)}Z`;
    };
    const q = d.quantiles || {};
    const label = `${d.label} distribution: canary P99 ${SITS.ms((q.p99 || {}).canary)} vs ${target} ${SITS.ms((q.p99 || {}).target)}`;
    const s = svg("svg", { viewBox: `0 0 ${W} ${H}`, width: "100%", height: H, role: "img", "aria-label": label, class: "dist-svg" });
    s.append(svg("title", {}, label));
    for (const t of ticks(lo, hi)) {
      s.append(svg("line", { x1: X(t), x2: X(t), y1: PAD.t, y2: PAD.t + ih, class: "grid" }),
        svg("text", { x: X(t), y: H - 6, "text-anchor": "middle", class: "tick" }, SITS.ms(t)));
    }
    for (const f of [0.5, 1]) {
      const v = top / 1.1 * f;
      s.append(svg("text", { x: PAD.l - 4, y: Y(v) + 3, "text-anchor": "end", class: "tick" }, `${(v * 100).toFixed(v < 0.1 ? 1 : 0)} %`));
    }
    s.append(svg("path", { d: outline(d.target), class: "area target" }), svg("path", { d: outline(d.canary), class: "area canary" }));
    for (const [role, cls] of [["target", "target"], ["canary", "canary"]]) {
      for (const [name, dash] of [["p90", "4 3"], ["p99", null]]) {
        const v = (q[name] || {})[role];
        if (v != null && v >= lo && v <= hi) {
          s.append(svg("line", { x1: X(v), x2: X(v), y1: PAD.t, y2: PAD.t + ih, class: `q ${cls}`, "stroke-dasharray": dash },
            svg("title", {}, `${role === "target" ? target : "canary"} ${name.toUpperCase()} ${SITS.ms(v)}`)));
        }
      }
    }
    s.append(svg("line", { x1: PAD.l, x2: PAD.l + iw, y1: PAD.t + ih, y2: PAD.t + ih, class: "axis" }));
    for (let i = 0; i < n; i++) {   // hover targets: one per bin
      s.append(svg("rect", { x: X(lower[i]), y: PAD.t, width: Math.max(1, X(upper[i]) - X(lower[i])), height: ih, class: "bin", "data-bin": i },
        svg("title", {}, `${SITS.ms(d.lower[i])}–${d.upper[i] == null ? "∞" : SITS.ms(d.upper[i])}: canary ${(d.canary[i] * 100).toFixed(1)} %, ${target} ${(d.target[i] * 100).toFixed(1)} %`)));
    }
    box.replaceChildren(s);
  }

  // into each metric's latency card: its series' distribution at check `data.seq`
  function renderAll(data, boxes) {
    for (const [metric, box] of Object.entries(boxes)) {
      const d = data.series.find((x) => x.metric === metric);
      const body = box.querySelector(".dist-plot"), cap = box.querySelector(".dist-cap");
      box.hidden = !d;
      if (!d) continue;
      box.dataset.seq = data.seq;
      box.dataset.bins = d.lower.length;
      render(body, d, data.compare_to, body.clientWidth || box.clientWidth);
      cap.textContent = `Check #${data.seq}: ${Math.round(d.n_canary)} canary and ${Math.round(d.n_target)} ${data.compare_to} requests over the analysed window, share of each per bucket (log time axis); ticks: P90 dashed, P99 solid.`;
    }
  }
  return { render, renderAll };
})();
