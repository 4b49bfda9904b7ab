// The API reference page: a small renderer of the service's own OpenAPI document (paths, parameters, request body,
// responses, component schemas), no third-party code.
"use strict";
(() => {
  const { el } = SITS;
  const METHODS = ["get", "post", "put", "patch", "delete"];
  let doc = null;
  const refName = (ref) => ref.split("/").pop();
  function schemaText(s, depth = 0) {
    if (!s) return "";
    if (s.$ref) return refName(s.$ref);
    if (s.enum) return s.enum.map((x) => JSON.stringify(x)).join(" | ");
    if (s.oneOf || s.anyOf) return (s.oneOf || s.anyOf).map((x) => schemaText(x, depth)).join(" | ");
    if (s.type === "array") return `${schemaText(s.items, depth)}[]`;
    if (s.type === "object" && s.properties && depth < 1) {
      return "{ " + Object.entries(s.properties).map(([k, v]) => `${k}${(s.required || []).includes(k) ? "" : "?"}: ${schemaText(v, depth + 1)}`).join(", ") + " }";
    }
    return Array.isArray(s.type) ? s.type.join(" | ") : (s.type || "any");
  }
  const schemaNode = (s) => {
    const t = schemaText(s);
    return s && s.$ref ? el("a", { href: `#schema-${refName(s.$ref)}`, class: "mono" }, t) : el("code", {}, t);
  };
  function operation(path, method, op) {
    const id = `op-${method}-${path.replace(/[^a-z0-9]+/gi, "-")}`;
    const params = op.parameters || [];
    const body = op.requestBody && op.requestBody.content && op.requestBody.content["application/json"];
    return el("section", { class: "card api-op", id, "data-path": path, "data-method": method },
      el("h3", {}, el("span", { class: `method m-${method}` }, method.toUpperCase()), " ", el("code", { class: "path" }, "/api/v1" + path)),
      op.summary ? el("p", {}, op.summary) : null,
      op.description ? el("p", { class: "muted small" }, op.description) : null,
      params.length ? el("table", { class: "plain api-params" },
        el("thead", {}, el("tr", {}, el("th", { scope: "col" }, "parameter"), el("th", { scope: "col" }, "in"), el("th", { scope: "col" }, "type"), el("th", { scope: "col" }, ""))),
        el("tbody", {}, params.map((p) => el("tr", {}, el("td", { "data-label": "parameter" }, el("code", {}, p.name), p.required ? el("span", { class: "bad" }, " *") : null),
          el("td", { "data-label": "in" }, p.in), el("td", { "data-label": "type" }, schemaNode(p.schema)), el("td", { "data-label": "" }, p.description || ""))))) : null,
      body ? el("p", {}, el("strong", {}, "Body: "), schemaNode(body.schema)) : null,
      el("ul", { class: "api-responses" }, Object.entries(op.responses || {}).map(([code, r]) => {
        const c = r.content && r.content["application/json"];
        return el("li", {}, el("code", { class: Number(code) < 400 ? "ok" : "bad" }, code), " ", r.description || "", c ? [" → ", schemaNode(c.schema)] : null);
      })));
  }
  function render() {
    const toc = [], ops = [];
    for (const [path, item] of Object.entries(doc.paths || {})) {
      for (const m of METHODS) {
        if (!item[m]) continue;
        const node = operation(path, m, item[m]);
        ops.push(node);
        toc.push(el("li", {}, el("a", { href: `#${node.id}` }, el("span", { class: `method m-${m}` }, m.toUpperCase()), " ", el("code", {}, path))));
      }
    }
    const schemas = Object.entries((doc.components && doc.components.schemas) || {}).map(([name, s]) =>
      el("section", { class: "card api-schema", id: `schema-${name}` }, el("h3", {}, el("code", {}, name)),
        s.description ? el("p", { class: "muted small" }, s.description) : null,
        s.properties ? el("dl", { class: "api-props" }, Object.entries(s.properties).flatMap(([k, v]) => [
          el("dt", {}, el("code", {}, k), (s.required || []).includes(k) ? el("span", { class: "bad" }, " *") : null),
          el("dd", {}, schemaNode(v), v.description ? el("span", { class: "muted" }, ` — ${v.description}`) : null)])) : el("p", {}, schemaNode(s))));
    document.getElementById("api-toc").replaceChildren(el("p", {}, el("strong", {}, `${doc.info.title} ${doc.info.version}`),
      el("span", { class: "muted" }, ` · OpenAPI ${doc.openapi} · ${ops.length} operations`)), el("ol", { class: "toc" }, toc));
    document.getElementById("api-ref").replaceChildren(el("h2", {}, "Operations"), ...ops, el("h2", {}, "Schemas"), ...schemas);
  }
  fetch("/api/v1/openapi.json", { headers: { Accept: "application/json" } }).then((r) => r.json()).then((d) => { doc = d; render(); })
    .catch((e) => { document.getElementById("api-ref").textContent = "Could not load the OpenAPI document: " + e.message; });
})();
