// Service history: local times and durations, and why each rollout ended (from the list API's "ended").
"use strict";
(() => {
  const { api, dur } = SITS;
  for (const t of document.querySelectorAll("time.ts")) {
    const d = new Date(Number(t.dataset.t) * 1000);
    t.dateTime = d.toISOString();
    t.textContent = d.toLocaleString("en-GB", { year: "numeric", month: "short", day: "numeric", hour: "2-digit", minute: "2-digit" });
  }
  for (const s of document.querySelectorAll(".dur")) s.textContent = dur(Number(s.dataset.s));
  for (const s of document.querySelectorAll(".so-far")) s.textContent = dur(Math.max(0, Date.now() / 1000 - Number(s.dataset.since)));
  const service = location.pathname.split("/").pop();
  api(`/rollouts?service=${service}&limit=500`).then((res) => {
    if (!res.ok) return;
    for (const r of res.data.rollouts) {
      const cell = document.querySelector(`.ending[data-id="${CSS.escape(r.id)}"]`);
      if (cell && r.ended) { cell.textContent = r.ended.text; cell.classList.add(`end-${r.ended.kind}`); cell.dataset.kind = r.ended.kind; }
    }
  });
})();
