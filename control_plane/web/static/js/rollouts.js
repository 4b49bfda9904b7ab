// Rollouts list: active first, then newest first; refreshed every 1.5 s from /api/v1/rollouts.
"use strict";
(() => {
  const { api, el, badge, checkLine, weightBar, ago, poll } = SITS;
  const rows = document.getElementById("rows");
  const fService = document.getElementById("f-service"), fPhase = document.getElementById("f-phase");
  const params = new URLSearchParams(location.search);
  const PAGE = 50;
  let offset = Number(params.get("offset") || 0);
  fService.value = params.get("service") || "";
  fPhase.value = params.get("phase") || "";

  // why an ended rollout ended (present.ending): the kind in a word, then the deciding detail
  const ENDED = { latency: ["✗", "latency check failed"], error_rate: ["✗", "error rate check failed"],
    guard: ["✗", "guard"], correctness: ["✗", "correctness gate failed"], inconclusive: ["?", "inconclusive"],
    aborted: ["■", "aborted"], deploy: ["⚠", "deploy failed"], promoted: ["✓", "promoted"],
    promoted_manually: ["✓", "promoted manually"], failed: ["⚠", "failed"], other: ["•", "ended"] };
  function ending(e) {
    const [icon, word] = ENDED[e.kind] || ENDED.other;
    const text = ["aborted", "promoted_manually", "deploy", "failed"].includes(e.kind) ? e.text : `${word}: ${e.text}`;
    return el("span", { class: `ending end-${e.kind}`, "data-kind": e.kind, title: e.text }, el("span", { "aria-hidden": "true" }, icon + " "), text);
  }

  function row(r) {
    const href = `/rollouts/${encodeURIComponent(r.id)}`;
    const tr = el("tr", { "data-id": r.id, onclick: (e) => { if (!e.target.closest("a")) location.href = href; } },
      el("td", { class: "c-service" }, el("a", { href }, el("strong", {}, r.service))),
      el("td", { class: "c-kernels" }, el("span", { class: "kset" }, r.kernels, el("span", { class: "arrow", "aria-label": "replacing" }, "→"), r.production_kernels),
        r.flags && r.flags.length ? el("div", { class: "flags muted small", title: "engine flags the canary changes" }, r.flags.join(" · ")) : null),
      el("td", { class: "c-phase" }, badge(r.phase)),
      el("td", { class: "c-weight" }, weightBar(r.weights, r.phase)),
      el("td", { class: "c-check" }, r.ended ? ending(r.ended) : checkLine(r.last_check)),
      el("td", { class: "age", title: new Date(r.created_at * 1000).toLocaleString() }, ago(r.created_at)));
    return tr;
  }

  async function refresh() {
    const q = new URLSearchParams({ limit: PAGE, offset });
    if (fService.value) q.set("service", fService.value);
    if (fPhase.value) q.set("phase", fPhase.value);
    const res = await api("/rollouts?" + q);
    if (!res.ok) return false;
    const list = res.data.rollouts.slice();
    list.sort((a, b) => (b.active - a.active) || (b.created_at - a.created_at));
    rows.replaceChildren(...list.map(row));
    document.getElementById("empty").hidden = res.data.total > 0;
    const total = res.data.total;
    document.getElementById("page-info").textContent = total ? `${offset + 1}–${Math.min(offset + PAGE, total)} of ${total}` : "";
    document.getElementById("prev").disabled = offset === 0;
    document.getElementById("next").disabled = offset + PAGE >= total;
    document.querySelector(".pager").hidden = total <= PAGE;
    return true;
  }

  function navigate() {
    const q = new URLSearchParams();
    if (fService.value) q.set("service", fService.value);
    if (fPhase.value) q.set("phase", fPhase.value);
    if (offset) q.set("offset", offset);
    history.replaceState(null, "", location.pathname + (q.toString() ? "?" + q : ""));
    refresh();
  }
  fService.addEventListener("change", () => { offset = 0; navigate(); });
  fPhase.addEventListener("change", () => { offset = 0; navigate(); });
  document.getElementById("prev").addEventListener("click", () => { offset = Math.max(0, offset - PAGE); navigate(); });
  document.getElementById("next").addEventListener("click", () => { offset += PAGE; navigate(); });
  poll(refresh, 1500);
})();
