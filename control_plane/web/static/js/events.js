// The detail page's Events (who did what, when) and its deploy actions and notifications, fetched incrementally
// (GET /rollouts/<id>/events?since_id=N): new events are prepended, the outbox is redrawn, unfolded errors stay open.
"use strict";
const Events = (() => {
  const { api, el, clock, human } = SITS;
  let lastEvent = 0;
  // a failed action's error: its first line, the engine's log tail (the next lines) folded away
  const openErrors = new Set();   // the outbox is redrawn on every refresh: an unfolded error stays unfolded
  function errorText(err, key) {
    const [first, ...rest] = err.split("\n");
    if (!rest.length) return el("span", { class: "muted small" }, ` (${first})`);
    const d = el("details", { class: "err small", open: openErrors.has(key) }, el("summary", {}, first),
      el("div", { class: "evidence-box" }, el("pre", { tabindex: "0" }, rest.join("\n"))));
    d.addEventListener("toggle", () => { if (d.open) openErrors.add(key); else openErrors.delete(key); });
    return d;
  }
  async function load(id) {
    const res = await api(`/rollouts/${encodeURIComponent(id)}/events?since_id=${lastEvent}`);
    if (!res.ok) return;
    const list = document.getElementById("events");
    for (const e of res.data.events) {
      if (e.kind === "check") { lastEvent = Math.max(lastEvent, e.id); continue; }   // the checks table has them
      list.prepend(el("li", { class: `kind-${e.kind}` }, el("span", { class: "t", title: new Date(e.at * 1000).toLocaleString() }, clock(e.at)),
        el("span", { class: "actor" + (e.actor ? "" : " system") }, e.actor || "worker"), el("span", { class: "msg" }, human(e.message))));
      lastEvent = Math.max(lastEvent, e.id);
    }
    const rows = [
      ...res.data.actions.map((a) => ({ t: a.created_at, who: "worker", msg: a.what, status: a.status, err: a.error, key: `a${a.id}` })),
      ...res.data.notifications.map((n) => ({ t: n.at, who: "webhook", msg: `${n.event} → ${n.webhook}`, status: n.status, err: n.error })),
    ].sort((a, b) => b.t - a.t);
    if (rows.length) {
      document.getElementById("outbox").replaceChildren(...rows.map((r) => el("li", {}, el("span", { class: "t" }, clock(r.t)),
        el("span", { class: "actor system" }, r.who),
        el("span", { class: "msg" }, r.msg, " ", el("span", { class: r.status === "failed" ? "bad" : r.status === "pending" ? "warn" : "ok" }, r.status),
          r.err ? errorText(r.err, r.key || `${r.t}${r.msg}`) : null))));
    }
  }
  return { load };
})();
