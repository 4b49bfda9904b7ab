// The detail page's Engines section: each variant's engines (local processes or Kubernetes pods) as the worker last
// listed them (GET /rollouts/<id>/engines): readiness, restarts, state, the GPUs it runs on and the last log line, one
// line each; and each variant's GPUs in one phrase for its card above (placement(role)).
"use strict";
const Engines = (() => {
  const { api, el, ago, clock } = SITS;
  let seenAt = undefined;   // observed_at of the list drawn; an ended rollout's list no longer changes
  let byRole = {};          // role -> its GPU placement in words, from the list drawn

  // a variant's GPUs in one phrase: the engines' own words when they agree (one replica, a Kubernetes GPU request,
  // sharing), else each replica's own set ("GPUs 0,1 | 2,3 of their own")
  function summarize(engines) {
    const notes = [...new Set(engines.map((e) => e.gpu_note || ""))];
    if (notes.length === 1) return notes[0];
    if (engines.every((e) => e.gpu_placement === "own" && (e.gpus || []).length)) {
      return `GPUs ${engines.map((e) => e.gpus.join(",")).join(" | ")} of their own`;
    }
    return notes.filter(Boolean).join("; ");
  }
  function placement(role) { return byRole[role] || ""; }
  function gpuCell(e) {
    if (!e.gpu_note) return el("span", { class: "muted" }, "—");
    return el("span", { class: e.gpu_placement === "shared" ? "warn" : null, title: e.gpu_note }, e.gpu_note);
  }

  const open = new Set();   // lines unfolded by a click or Enter: they stay so across refreshes
  function logLine(text) {
    const c = el("code", { class: "logline", title: text, tabindex: "0", role: "button", "aria-expanded": String(open.has(text)),
      "aria-label": `last log line: ${text}` }, text);
    const toggle = () => {
      const on = c.getAttribute("aria-expanded") !== "true";
      c.setAttribute("aria-expanded", String(on));
      if (on) open.add(text); else open.delete(text);
    };
    c.addEventListener("click", toggle);
    c.addEventListener("keydown", (ev) => { if (ev.key === "Enter" || ev.key === " ") { ev.preventDefault(); toggle(); } });
    return c;
  }
  // gone: the variant was removed (rolled back), promoted or replaced by the promotion since the worker listed it; its
  // last sight is shown muted
  function row(e, gone) {
    const ready = gone ? el("span", { class: "muted" }, "removed since") : e.ready ? el("span", { class: "ok" }, "● ready")
      : el("span", { class: "bad" }, "● not ready");
    const log = e.last_log_line ? logLine(e.last_log_line)
      : el("span", { class: "muted" }, e.log_error ? `log unavailable (${e.log_error})` : "nothing logged yet");
    return el("tr", { "data-role": e.role, "data-name": e.name, class: gone ? "gone" : null },
      el("td", { "data-label": "Variant", class: "role-cell" }, el("span", { class: `swatch ${e.role}`, "aria-hidden": "true" }), e.role),
      el("td", { "data-label": "Engine", class: "mono name" }, e.name),
      el("td", { "data-label": "Ready", class: "ready" }, ready),
      el("td", { "data-label": "Restarts", class: "num restarts" }, String(e.restarts)),
      el("td", { "data-label": "State", class: `state${gone || /^(running|pending)$/.test(e.state) ? "" : " warn"}` }, gone ? `was ${e.state}` : e.state),
      el("td", { "data-label": "GPUs", class: "gpus" }, gpuCell(e)),
      el("td", { "data-label": "Last log line", class: "log" }, log));
  }

  // draws the list into #engines-rows; fetched on every refresh while the rollout runs, once after it ended
  async function load(R) {
    if (!R.active && seenAt !== undefined) return;
    const res = await api(`/rollouts/${encodeURIComponent(R.id)}/engines`);
    if (!res.ok) return;
    const { engines, observed_at: at } = res.data;
    if (at === seenAt) return;
    seenAt = at;
    const gone = (role) => !R.active && ["removed", "promoted", "replaced"].includes((R.variants[role] || {}).state);
    document.getElementById("engines-rows").replaceChildren(...engines.map((e) => row(e, gone(e.role))));
    byRole = {};
    for (const role of SITS.ROLES) {
      const mine = engines.filter((e) => e.role === role);
      if (mine.length && !gone(role)) byRole[role] = summarize(mine);
    }
    for (const node of document.querySelectorAll("[data-gpus]")) node.textContent = placement(node.dataset.gpus);
    document.getElementById("engines-table").hidden = !engines.length;
    const note = document.getElementById("engines-note");
    note.textContent = at == null ? "Not listed yet: the worker lists the engines once the variants are being deployed."
      : !engines.length ? `None running when the worker last looked (${clock(at)}).`
      : R.active ? `As the worker saw them ${ago(at)} ago (${clock(at)}).`
      : `As the worker last saw them, at ${clock(at)}, before the rollout ended.`;
  }
  return { load, placement };
})();
