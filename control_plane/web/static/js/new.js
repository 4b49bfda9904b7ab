// New canary form: builds the POST /api/v1/rollouts body, shows the server's 422 next to the offending field; a
// retry (?retry_of=ID) starts prefilled with the old rollout's kernel set, spec and policy.
"use strict";
(() => {
  const { api, el } = SITS;
  const $ = (id) => document.getElementById(id);
  const kernels = JSON.parse($("kernel-data").textContent);
  const services = JSON.parse($("service-data").textContent);
  const defaults = JSON.parse($("policy-defaults").textContent);
  const byName = Object.fromEntries(kernels.map((k) => [k.name, k]));
  const form = $("new-canary");
  const LIMITS = { max_rel_delta: [0.0001, 100] };   // analysis/policy.py LIMITS: the server checks them again

  // the threshold rows: [metric, quantile, label, unit]; enabled and filled from the policy defaults
  const ROWS = [
    ["http_request_duration_seconds", 0.99, "Request latency P99", "%"],
    ["http_request_duration_seconds", 0.9, "Request latency P90", "%"],
    ["sits_time_to_first_token_seconds", 0.99, "Time to first token P99", "%"],
    ["sits_inter_token_latency_seconds", 0.99, "Inter-token latency P99", "%"],
    ["error_rate", null, "Error rate", "pt"],
  ];
  const thresholds = $("thresholds");
  // sequential statistics (the default): a latency check has two boundaries, the limit (a regression that must not
  // ship) and, optional, the ship boundary (a change small enough to ship; empty: half the limit)
  const sequential = defaults.statistics === "sequential";
  const rowEls = ROWS.map(([metric, q, label, unit], i) => {
    const d = defaults.checks.find((c) => c.metric === metric && (c.quantile ?? null) === q);
    const value = d ? (metric === "error_rate" ? d.max_abs_delta : d.max_rel_delta) * 100 : 10;
    const id = `thr-${i}`;
    const box = el("input", { type: "checkbox", id: `${id}-on`, checked: !!d, "aria-label": `check ${label}` });
    const input = el("input", { type: "number", id, step: "any", value: +value.toFixed(4), inputmode: "decimal" });
    const err = el("p", { class: "field-error", id: `${id}-err`, hidden: true });
    input.setAttribute("aria-describedby", err.id);
    let ship = null, shipErr = null, shipRow = null;
    if (sequential && metric !== "error_rate") {
      const given = d && d.ship_rel_delta != null ? +(d.ship_rel_delta * 100).toFixed(4) : "";
      ship = el("input", { type: "number", id: `${id}-ship`, step: "any", value: given, inputmode: "decimal", min: "0",
        placeholder: "", "aria-describedby": `${id}-ship-help` });
      shipErr = el("p", { class: "field-error", id: `${id}-ship-err`, hidden: true });
      const half = () => { const v = Number(input.value); ship.placeholder = input.value !== "" && Number.isFinite(v) ? String(+(v / 2).toFixed(4)) : ""; };
      input.addEventListener("input", half);
      half();
      shipRow = el("span", { class: "unit ship" }, el("label", { for: ship.id, class: "sr-only" }, `${label} ship boundary`),
        el("span", { class: "muted pre" }, "ship below +"), ship, "%",
        el("span", { class: "sr-only", id: `${id}-ship-help` }, "optional: a change small enough to ship; empty is half the limit"));
    }
    box.addEventListener("change", () => { input.disabled = !box.checked; if (ship) ship.disabled = !box.checked; });
    input.disabled = !box.checked;
    if (ship) ship.disabled = !box.checked;
    const wrap = el("div", { class: "threshold" },
      el("label", { class: "check name", for: `${id}-on` }, box, label),
      el("span", { class: "unit" }, el("label", { for: id, class: "sr-only" }, `${label} threshold`), el("span", { class: "muted pre" }, sequential ? "limit +" : "at most +"), input, unit === "%" ? "%" : "points"),
      err, shipRow, shipErr);
    thresholds.append(wrap);
    return { metric, q, input, box, err, label, ship, shipErr };
  });
  if (sequential) $("thresholds-help").hidden = false;

  function updateChanges() {
    const c = byName[$("kernels").value], p = byName[$("production_kernels").value];
    const box = $("changes");
    box.hidden = !c || !p;
    if (!c || !p) { box.textContent = ""; return; }
    const diff = Object.keys(c.ops).filter((op) => c.ops[op] !== p.ops[op]);
    box.replaceChildren(el("div", {},
      el("strong", {}, `${c.name} ${c.version}`), " vs ", el("strong", {}, `${p.name} ${p.version}`), ": ",
      diff.length ? ["changes ", ...diff.flatMap((op, i) => [i ? " " : "", el("code", { class: "op" }, op)])]
        : el("span", { class: "warn" }, "same implementations (a control experiment)"),
      el("br"), el("span", { class: "muted" }, `${c.description} · devices ${c.devices.join(", ")} · CUDA graphs ${c.cuda_graphs ? "yes" : "no"}`)));
  }
  function updateChips() {
    const chips = $("steps-chips");
    const steps = parseSteps();
    chips.replaceChildren(...(steps || []).flatMap((s, i) => [i ? el("span", { class: "arrow" }, "→") : null, el("span", { class: "chip" }, s + " %")]).filter(Boolean));
  }
  function parseSteps() {
    const parts = $("steps").value.split(/[\s,;]+/).filter(Boolean);
    const nums = parts.map(Number);
    return nums.every((n) => Number.isInteger(n)) ? nums : null;
  }
  // production's engine flags (the last promoted canary's): the server gives them to the baseline, and to the
  // canary when its field is empty
  function updateProductionFlags(s) {
    const flags = (s && s.production_args) || [];
    $("production-flags").hidden = !flags.length;
    $("production-flags-value").textContent = flags.join(" ");
    $("args").placeholder = flags.length ? flags.join(" ") : "--max-num-seqs 64";
    if (flags.length) document.querySelector("details.advanced").open = true;
  }
  $("service").addEventListener("input", () => {
    const s = services.find((x) => x.service === $("service").value);
    updateProductionFlags(s);
    if (s && byName[s.production_kernels]) { $("production_kernels").value = s.production_kernels; updateChanges(); }
  });
  $("kernels").addEventListener("change", updateChanges);
  $("production_kernels").addEventListener("change", updateChanges);
  $("steps").addEventListener("input", updateChips);
  // "Retry" / "Canary this version again" on a service's history: the form comes prefilled from the URL
  const pre = new URLSearchParams(location.search);
  if (pre.get("service")) {
    $("service").value = pre.get("service");
    const s = services.find((x) => x.service === pre.get("service"));   // production: what the service runs now
    if (s && byName[s.production_kernels]) $("production_kernels").value = s.production_kernels;
    updateProductionFlags(s);
  }
  // a set the link names but the catalogue lacks: nothing is chosen for it, and the field says why
  const unknown = [];
  for (const k of ["kernels", "production_kernels"]) {
    const want = pre.get(k);
    if (want == null) continue;
    if (byName[want]) { $(k).value = want; continue; }
    $(k).value = "";
    unknown.push(want);
    const err = $(`${k}-err`);
    err.textContent = `The link asks for kernel set “${want}”, which this catalogue does not have: choose one.`;
    err.hidden = false;
    $(k).setAttribute("aria-invalid", "true");
    $(k).setAttribute("aria-describedby", err.id);
    $(k).addEventListener("change", () => { err.hidden = true; $(k).removeAttribute("aria-invalid"); }, { once: true });
  }
  if (pre.get("from")) {
    $("prefilled").hidden = false;
    $("prefilled-from").textContent = pre.get("from");
    $("prefilled-from").href = `/rollouts/${encodeURIComponent(pre.get("from"))}`;
    $("prefilled-unknown").textContent = unknown.length ? ` Not prefilled: ${unknown.join(", ")} (not in the catalogue).` : "";
  }
  // "Retry…" on an ended rollout's page (?retry_of=ID): its kernel set, spec and policy, editable; production stays
  // what the service runs now (filled in above from the service)
  const retry = JSON.parse($("retry-data").textContent);
  if (retry) prefillRetry(retry);
  function prefillRetry(r) {
    const p = r.policy;
    $("service").value = r.service;
    $("service").dispatchEvent(new Event("input"));
    if (byName[r.kernels]) $("kernels").value = r.kernels;
    $("model").value = r.model;
    $("replicas").value = r.replicas;
    $("tensor_parallel_size").value = r.tensor_parallel_size || 1;
    $("args").value = r.args.join(" ");
    if (r.args.length) document.querySelector("details.advanced").open = true;
    $("steps").value = p.steps.join(", ");
    form.querySelector(`input[name="compare_to"][value="${p.compare_to}"]`).checked = true;
    for (const k of ["check_interval_s", "warmup_s", "min_samples"]) $(k).value = p[k];
    $("correctness").checked = !!(p.correctness && p.correctness.enabled);
    const used = new Set();
    for (const row of rowEls) {
      const i = p.checks.findIndex((c, j) => !used.has(j) && c.metric === row.metric && (c.quantile ?? null) === row.q);
      row.box.checked = i >= 0;
      row.input.disabled = i < 0;
      if (i < 0) continue;
      used.add(i);
      const c = p.checks[i];
      row.input.value = +((row.metric === "error_rate" ? c.max_abs_delta : c.max_rel_delta) * 100).toFixed(4);
      if (row.ship) {
        row.ship.value = c.ship_rel_delta != null ? +(c.ship_rel_delta * 100).toFixed(4) : "";
        row.input.dispatchEvent(new Event("input"));   // the placeholder: half the new limit
      }
    }
    const dropped = p.checks.length - used.size;   // checks the form has no row for: not part of the retry
    $("retry-dropped").textContent = dropped ? ` ${dropped} of its checks ${dropped === 1 ? "has" : "have"} no row in this form and ${dropped === 1 ? "is" : "are"} left out.` : "";
  }
  updateChanges();
  updateChips();

  function clearErrors() {
    form.querySelectorAll("[aria-invalid]").forEach((e) => e.removeAttribute("aria-invalid"));
    form.querySelectorAll(".field-error").forEach((e) => { e.hidden = true; e.textContent = ""; });
    $("form-error").hidden = true;
  }
  function showError(field, message, checkRows) {
    let input = null, err = null;
    const m = field && field.match(/^policy\.checks\[(\d+)\]/);
    if (m && checkRows[+m[1]] && /\.ship_rel_delta$/.test(field) && checkRows[+m[1]].ship) {
      ({ ship: input, shipErr: err } = checkRows[+m[1]]);   // the ship boundary's own input
    } else if (m && checkRows[+m[1]]) {
      ({ input, err } = checkRows[+m[1]]);
    } else if (field) {
      if (field.startsWith("policy.correctness")) field = "policy.correctness.enabled";   // the form's only gate field
      input = form.querySelector(`[data-field="${CSS.escape(field)}"]`);
      if (input) {
        err = input.parentElement.querySelector(`.field-error[data-for="${CSS.escape(field)}"]`);
        if (!err) { err = el("p", { class: "field-error", "data-for": field, id: `err-${input.id}` }); input.after(err); }
      }
    }
    if (input && err) {
      message = inTheFormsWords(message, field, input);
      input.setAttribute("aria-invalid", "true");
      input.setAttribute("aria-describedby", err.id);
      err.textContent = message;
      err.hidden = false;
      input.focus();
    } else {
      $("form-error").textContent = message;
      $("form-error").hidden = false;
      $("form-error").focus?.();
    }
  }

  // the server names fields as its API does ("policy.min_samples must be an integer from 1 to 1e+09"): next to a
  // field, its label says which, and numbers read as numbers
  function inTheFormsWords(message, field, input) {
    const label = form.querySelector(`label[for="${CSS.escape(input.id)}"]`);
    const name = label ? label.textContent.trim() : null;
    const key = field.split(".").pop();
    let m = message;
    if (name) {
      for (const raw of [field, key]) {
        if (m.startsWith(raw + " ")) { m = `${name}: ${m.slice(raw.length + 1)}`; break; }
        if (m.startsWith(raw + ": ")) { m = `${name}: ${m.slice(raw.length + 2)}`; break; }
      }
    }
    // the label names the field: the server's parenthetical gloss of it goes ("ship_rel_delta (a change small enough
    // to ship) must be ..."), and a field it is compared with is named as the form names it
    if (name && m.startsWith(name + ": (")) m = m.replace(/^([^:]+: )\([^)]*\) /, "$1");
    m = m.replace(/\bmax_rel_delta\b/g, "the limit").replace(/\bmax_abs_delta\b/g, "the limit");
    return m.replace(/\b(\d+(?:\.\d+)?)e\+(\d+)\b/g, (x) => Number(x).toLocaleString("en-US"));
  }

  // 409: the service already has an active rollout; say which, with a link to it (one rollout per service at a time)
  async function showConflict(service) {
    const res = await api(`/rollouts?service=${encodeURIComponent(service)}&active=true&limit=1`);
    const active = res.ok && res.data.rollouts[0];
    const box = $("form-error");
    box.replaceChildren(`${service} already has an active rollout`, ...(active ? [": ",
      el("a", { href: `/rollouts/${encodeURIComponent(active.id)}`, id: "active-rollout" }, `${active.kernels} → ${active.production_kernels}`),
      ` (${SITS.phaseWord(active.phase)}, started ${SITS.ago(active.created_at)} ago)`] : []),
      ". A service runs one rollout at a time: wait for it to end, or abort it, then start this one.");
    box.hidden = false;
    box.focus();
  }

  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    clearErrors();
    const steps = parseSteps();
    const svc = $("service");
    if (!svc.value.trim()) return showError("service", "Enter the service to release the canary to, e.g. chat.", []);
    if (svc.validity.patternMismatch) return showError("service", "A service name is lower-case letters, digits and dashes, starting and ending with a letter or digit.", []);
    for (const k of ["kernels", "production_kernels"]) if (!$(k).value) return showError(k, "Choose a kernel set.", []);
    if (!steps || !steps.length) return showError("policy.steps", "Steps are whole percents, e.g. 5, 10, 25, 50, 100.", []);
    const replicas = Number($("replicas").value), maxReplicas = Number($("replicas").max);
    if (!Number.isInteger(replicas) || replicas < 1 || (maxReplicas && replicas > maxReplicas)) {
      const range = maxReplicas === 1 ? "1 is the only choice here" : `a whole number from 1 to ${maxReplicas}`;
      return showError("replicas", `Replicas per variant: ${range} (${$("replicas").dataset.why}).`, []);
    }
    const tp = Number($("tensor_parallel_size").value), maxTp = Number($("tensor_parallel_size").max);
    if (!Number.isInteger(tp) || tp < 1 || tp > maxTp) {
      return showError("tensor_parallel_size", `GPUs per engine: a whole number from 1 to ${maxTp}; you typed ${$("tensor_parallel_size").value || "nothing"}.`, []);
    }
    const checkRows = rowEls.filter((r) => r.box.checked);
    // thresholds are typed in the user's units (% for latency, points for the error rate): check them here, in those
    for (const [i, r] of checkRows.entries()) {
      const v = r.input.value === "" ? NaN : Number(r.input.value);
      const [lo, hi, unit] = r.metric === "error_rate" ? [0, 100, " points"] : [LIMITS.max_rel_delta[0] * 100, LIMITS.max_rel_delta[1] * 100, " %"];
      const ok = Number.isFinite(v) && v >= lo && (r.metric === "error_rate" ? v < hi : v <= hi);
      if (!ok) return showError(`policy.checks[${i}]`, `${r.label}: the threshold must be between +${lo}${unit} and +${hi}${unit}${r.metric === "error_rate" ? " (exclusive)" : ""}; you typed ${r.input.value === "" ? "nothing" : r.input.value + unit}.`, checkRows);
      // the ship boundary (optional): from +0 % up to, not including, the limit
      if (r.ship && r.ship.value !== "") {
        const s = Number(r.ship.value);
        if (!Number.isFinite(s) || s < 0 || s >= v) return showError(`policy.checks[${i}].ship_rel_delta`, `${r.label}: the ship boundary must be from +0 % up to below the limit (+${v} %), or empty for half the limit; you typed ${r.ship.value} %.`, checkRows);
      }
    }
    const num = (id) => $(id).value === "" ? undefined : Number($(id).value);
    const policy = {
      steps, compare_to: form.querySelector('input[name="compare_to"]:checked').value,
      check_interval_s: num("check_interval_s"), warmup_s: num("warmup_s"), min_samples: num("min_samples"),
      correctness: { enabled: $("correctness").checked },
      checks: checkRows.map((r) => r.metric === "error_rate"
        ? { metric: r.metric, max_abs_delta: Number(r.input.value) / 100 }
        : { metric: r.metric, quantile: r.q, max_rel_delta: Number(r.input.value) / 100,
          ...(r.ship && r.ship.value !== "" ? { ship_rel_delta: Number(r.ship.value) / 100 } : {}) }),
    };
    const body = {
      service: $("service").value.trim(), kernels: $("kernels").value, production_kernels: $("production_kernels").value,
      model: $("model").value.trim(), replicas, policy,
    };
    if (tp !== 1 || retry) body.tensor_parallel_size = tp;   // a retry's 1 is said, not taken from the old rollout
    const args = $("args").value.trim();
    if (args) body.args = args.split(/\s+/);
    if (retry) { body.retry_of = retry.id; body.args = body.args || []; }   // emptied args: none, not the old ones
    $("start").disabled = true;
    try {
      const res = await api("/rollouts", { method: "POST", body });
      if (res.status === 201) { location.href = `/rollouts/${encodeURIComponent(res.data.id)}`; return; }
      const e = (res.data && res.data.error) || { message: `HTTP ${res.status}`, field: null };
      if (res.status === 409) return showConflict(body.service);
      const human = (m) => m.replace(/^policy: /, "").replace(/http_request_duration_seconds/g, "request latency")
        .replace(/sits_time_to_first_token_seconds/g, "time to first token").replace(/sits_inter_token_latency_seconds/g, "inter-token latency");
      showError(e.field, human(e.message), checkRows);
    } catch (e) {
      showError(null, "The service did not answer: " + e.message, []);
    } finally {
      $("start").disabled = false;
    }
  });
})();
