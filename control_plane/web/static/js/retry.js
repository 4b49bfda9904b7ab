// The detail page's retry: the links between a rollout and its retries ("retry of", "retried as") and the Retry
// button (operators only: the template leaves it out for viewers), shown while the rollout can be retried (it
// ended without promoting its canary). The button opens the new-canary form prefilled with this rollout's spec and
// policy (ui.new_rollout ?retry_of=ID).
"use strict";
const Retry = (() => {
  const { el } = SITS;
  const link = (id) => el("a", { href: `/rollouts/${encodeURIComponent(id)}`, class: "mono" }, id);
  let drawn = "";

  function render(R) {
    const btn = document.getElementById("retry");
    if (btn) btn.hidden = !R.retryable;
    const key = JSON.stringify([R.retry_of, R.retried_as]);
    if (key === drawn) return;   // redrawn only when a link changes: a focused link keeps its focus
    drawn = key;
    const parts = [];
    if (R.retry_of) parts.push(el("span", { id: "retry-of" }, "↻ Retry of ", link(R.retry_of)));
    if (R.retried_as && R.retried_as.length) {
      parts.push(el("span", { id: "retried-as" }, "Retried as ", ...R.retried_as.flatMap((id, i) => [i ? ", " : "", link(id)])));
    }
    const box = document.getElementById("retry-links");
    box.replaceChildren(...parts.flatMap((p, i) => [i ? " · " : "", p]));
    box.hidden = !parts.length;
  }
  return { render };
})();
