"""`GET /api/v1/openapi.json`: OpenAPI 3.1 description of every API route (a test keeps it in step with the URL map)."""
from __future__ import annotations

from sits.control_plane.rollout import Command, Phase
from sits.control_plane.validation import MAX_TENSOR_PARALLEL

_ERR = {"$ref": "#/components/schemas/Error"}


def _resp(desc: str, schema: dict | None = None) -> dict:
    out = {"description": desc}
    if schema is not None:
        out["content"] = {"application/json": {"schema": schema}}
    return out


def _errors(*codes: int) -> dict:
    words = {401: "no or invalid token", 403: "role too low, or CSRF token missing (cookie sessions)",
             404: "no such rollout", 409: "conflict: the service has an active rollout, or the action is not "
             "allowed in this phase", 413: "body too large", 422: "validation error; `field` names the input",
             429: "too many failed logins", 502: "the metrics source failed (Prometheus unreachable, a scrape failed)"}
    return {str(c): _resp(words[c], _ERR) for c in codes}


def _param(name: str, where: str = "query", schema: dict | None = None, desc: str = "") -> dict:
    return {"name": name, "in": where, "required": where == "path", "schema": schema or {"type": "string"},
            "description": desc}


RID = _param("rollout_id", "path", desc="rollout id")


def openapi_spec() -> dict:
    ro = {"$ref": "#/components/schemas/Rollout"}
    read = _errors(401, 404)
    paths = {
        "/rollouts": {
            "get": {"summary": "List rollouts, newest first", "parameters": [
                _param("service"), _param("phase", schema={"enum": [p.value for p in Phase]}),
                _param("active", schema={"type": "boolean"}),
                _param("limit", schema={"type": "integer", "minimum": 1, "maximum": 500, "default": 50}),
                _param("offset", schema={"type": "integer", "minimum": 0, "default": 0})],
                "responses": {"200": _resp("rollouts", {"type": "object", "properties": {
                    "rollouts": {"type": "array", "items": ro}, "total": {"type": "integer"},
                    "limit": {"type": "integer"}, "offset": {"type": "integer"}}}), **_errors(401, 422)}},
            "post": {"summary": "Start a canary rollout (the worker deploys and analyses it)",
                     "requestBody": {"required": True, "content": {"application/json": {
                         "schema": {"$ref": "#/components/schemas/NewRollout"}}}},
                     "responses": {"201": {**_resp("created (Location: the rollout's URL)", ro),
                                           "headers": {"Location": {"schema": {"type": "string"}}}},
                                   **_errors(401, 403, 409, 413, 422)}}},
        "/rollouts/{rollout_id}": {"get": {"summary": "A rollout: phase, step, weights, variants, policy, last "
                                           "verdict with its evidence, the correctness gate (field correctness: enabled, history "
                                           "of correctness checks, latest verdict with its first 5 divergences)",
                                           "parameters": [RID],
                                           "responses": {"200": _resp("the rollout", ro), **read}}},
        "/rollouts/{rollout_id}/checks": {"get": {
            "summary": "Every check with its full evidence (view=compact: without bucket counts; a correctness "
                       "check carries source 'correctness' and its verdict's figures without per-prompt evidence)",
            "parameters": [RID, _param("since_seq", schema={"type": "integer"}),
                           _param("limit", schema={"type": "integer"}),
                           _param("view", schema={"enum": ["full", "compact"]})],
            "responses": {"200": _resp("checks", {"type": "object", "properties": {
                "checks": {"type": "array", "items": {"type": "object"}}}}), **read}}},
        "/rollouts/{rollout_id}/checks/{seq}": {"get": {
            "summary": "One check's raw evidence (queries, bucket counts per variant, verdict)",
            "parameters": [RID, _param("seq", "path", {"type": "integer"})],
            "responses": {"200": _resp("the check", {"type": "object"}), **read}}},
        "/rollouts/{rollout_id}/checks/{seq}/distribution": {"get": {
            "summary": "One check's latency distributions: canary and comparison target per bucket (shares of "
                       "requests) on the engines' shared bounds, trimmed to the buckets used, with their P90/P99",
            "parameters": [RID, _param("seq", "path", {"type": "integer"})],
            "responses": {"200": _resp("distributions", {"type": "object", "properties": {
                "seq": {"type": "integer"}, "compare_to": {"type": "string"},
                "series": {"type": "array", "items": {"type": "object"}}}}), **read}}},
        "/rollouts/{rollout_id}/events": {"get": {
            "summary": "Events (who did what, when), the deployer's actions and the webhook deliveries",
            "parameters": [RID, _param("since_id", schema={"type": "integer"})],
            "responses": {"200": _resp("events", {"type": "object", "properties": {
                "events": {"type": "array", "items": {"$ref": "#/components/schemas/Event"}},
                "actions": {"type": "array", "items": {"type": "object"}},
                "notifications": {"type": "array", "items": {"type": "object"}}}}), **read}}},
        "/rollouts/{rollout_id}/engines": {"get": {
            "summary": "Each variant's engines (local: processes; Kubernetes: pods) as the worker last listed them, "
                       "every ~2 s while the variants are deployed: readiness, restarts, state and the last log line "
                       "(one line, redacted, at most 200 characters); the last sight is kept once the rollout ended",
            "parameters": [RID],
            "responses": {"200": _resp("engines", {"type": "object", "properties": {
                "engines": {"type": "array", "items": {"$ref": "#/components/schemas/Engine"}},
                "observed_at": {"type": ["number", "null"], "description": "when the worker listed them; null: "
                                "not yet"}}}), **read}}},
        "/rollouts/{rollout_id}/series": {"get": {
            "summary": "Chart data: P50/P90/P99 per variant and metric per check, deltas with intervals, and per "
                       "gated check (`gated`) the delta, interval, threshold and outcome the checks show (columnar)",
            "parameters": [RID, _param("since_seq", schema={"type": "integer"})],
            "responses": {"200": _resp("series", {"type": "object"}), **read}}},
        "/kernels": {"get": {"summary": "Kernel sets: name, version, devices, cuda_graphs, parent, ops overridden",
                             "responses": {"200": _resp("kernel sets", {"type": "object"}), **_errors(401)}}},
        "/services": {"get": {"summary": "Each service's production: kernel set, model, replicas, readiness",
                              "responses": {"200": _resp("services", {"type": "object"}), **_errors(401)}}},
        "/config": {"get": {"summary": "Policy defaults, worker and auth settings (admin)",
                            "responses": {"200": _resp("config", {"type": "object"}), **_errors(401, 403)}}},
        "/me": {"get": {"summary": "The caller's name and role",
                        "responses": {"200": _resp("user", {"type": "object"}), **_errors(401)}}},
        "/judge": {"post": {
            "summary": "SITS as a judge (docs/judge.md): canary vs baseline over a window, verdict with evidence. "
                       "An Argo Rollouts Web metric (always 200: jsonPath {$.verdict}, successCondition result == "
                       "\"pass\", failureCondition result == \"fail\") or a Flagger webhook (its payload; 200 pass, "
                       "412 fail or inconclusive; token in metadata.token). Viewer role; operator when the body "
                       "names URLs (prometheus_url, scrape_urls)",
            "security": [{"bearer": []}, {}],
            "requestBody": {"required": True, "content": {"application/json": {"schema": {"oneOf": [
                {"$ref": "#/components/schemas/JudgeRequest"}, {"$ref": "#/components/schemas/FlaggerPayload"}]}}}},
            "responses": {"200": _resp("the verdict (Flagger: pass)", {"$ref": "#/components/schemas/Judgement"}),
                          "412": _resp("Flagger payloads: fail or inconclusive, the reason in the body",
                                       {"$ref": "#/components/schemas/Judgement"}),
                          **_errors(401, 403, 413, 422, 429, 502)}}},
        "/": {"get": {"summary": "The API's index: where its resources and this document are", "security": [],
                      "responses": {"200": _resp("names and paths", {"type": "object"})}}},
        "/openapi.json": {"get": {"summary": "This document", "security": [],
                                  "responses": {"200": _resp("OpenAPI 3.1", {"type": "object"})}}},
    }
    for c in Command:
        paths[f"/rollouts/{{rollout_id}}/{c.value}"] = {"post": {
            "summary": f"{c.value.capitalize()} the rollout (queued for the worker; idempotent)",
            "parameters": [RID],
            "responses": {"202": _resp("accepted", {"type": "object", "properties": {
                "command_id": {"type": "integer"}, "command": {"type": "string"}, "actor": {"type": "string"},
                "rollout": ro}}), **_errors(401, 403, 404, 409)}}}
    return {
        "openapi": "3.1.0",
        "info": {"title": "SITS control plane", "version": "1",
                 "description": "Canary rollouts of kernel sets. Auth: Authorization: Bearer TOKEN (roles viewer < "
                                "operator < admin). Errors: {\"error\": {\"code\", \"message\", \"field\"}}."},
        "servers": [{"url": "/api/v1"}],
        "security": [{"bearer": []}],
        "paths": paths,
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
            "schemas": {
                "Error": {"type": "object", "required": ["error"], "properties": {"error": {
                    "type": "object", "required": ["code", "message", "field"], "properties": {
                        "code": {"type": "string"}, "message": {"type": "string"},
                        "field": {"type": ["string", "null"]}}}}},
                "NewRollout": {"type": "object", "required": ["service", "kernels"], "additionalProperties": False,
                               "properties": {
                                   "service": {"type": "string", "description": "a DNS label"},
                                   "kernels": {"type": "string", "description": "the canary's kernel set"},
                                   "production_kernels": {"type": "string",
                                                          "description": "default: what the service runs now"},
                                   "model": {"type": "string", "default": "tiny"},
                                   "replicas": {"type": "integer", "minimum": 1, "default": 1},
                                   "gpus": {"type": "integer", "minimum": 0, "default": 0,
                                            "description": "GPUs per replica (Kubernetes); 0: as many as "
                                            "tensor_parallel_size on CUDA"},
                                   "tensor_parallel_size": {"type": "integer", "minimum": 1,
                                                            "maximum": MAX_TENSOR_PARALLEL, "default": 1,
                                                            "description": "GPUs each engine spans (`sits-engine "
                                                            "serve --tensor-parallel-size`, given when > 1); the "
                                                            "local deployer gives every engine that many GPUs of "
                                                            "its own where the machine has enough free"},
                                   "device": {"enum": ["cpu", "cuda"], "description": "`sits-engine serve "
                                              "--device` of every variant; default: the engine's choice (a GPU "
                                              "where one is visible)"},
                                   "ready_timeout_s": {"type": "number", "exclusiveMinimum": 0, "maximum": 86400,
                                                       "description": "how long each deploy may take to get "
                                                       "ready before the rollout rolls back; default: the "
                                                       "policy's ready_timeout_s"},
                                   "policy": {"type": "object", "description": "fields of Policy (steps, checks, "
                                              "check_interval_s, compare_to, ...); defaults from GET /config"},
                                   "args": {"type": "array", "items": {"type": "string"},
                                            "description": "the canary's extra `sits-engine serve` flags; default: "
                                            "production_args (a canary changes only what it names)"},
                                   "production_args": {"type": "array", "items": {"type": "string"},
                                                       "description": "production's and the baseline's flags; "
                                                       "default: what the service's production runs now (the "
                                                       "last promoted canary's flags)"},
                                   "retry_of": {"type": "string", "description": "retry an ended rollout that did "
                                                "not succeed (rolled back, aborted, failed): the new rollout is "
                                                "linked to it (its retry_of; the old one's retried_as), and every "
                                                "field the body leaves out comes from it (service, kernels, model, "
                                                "replicas, args, ...; policy keys one by one); production_kernels "
                                                "is what the service runs now. 422 (field retry_of) for an unknown, "
                                                "active or succeeded rollout"}}},
                "Rollout": {"type": "object", "properties": {
                    "id": {"type": "string"}, "service": {"type": "string"},
                    "phase": {"enum": [p.value for p in Phase]}, "reason": {"type": "string"},
                    "step": {"type": "integer", "description": "index into steps; -1 before the first"},
                    "steps": {"type": "array", "items": {"type": "integer"}}, "weight": {"type": "integer"},
                    "weights": {"type": "object"}, "kernels": {"type": "string"},
                    "production_kernels": {"type": "string"}, "last_check": {"type": ["object", "null"]},
                    "flags": {"type": "array", "items": {"type": "string"}, "description": "the engine flags the "
                              "canary changes from production's, e.g. '--kv-cache-dtype fp8' (a release of flags on "
                              "production's own kernel set) or '--quantization fp8 (production: int8)'"},
                    "ended": {"type": ["object", "null"], "description": "why an ended rollout ended: {kind, text}; "
                              "kind: latency, error_rate, guard, correctness, inconclusive, aborted, deploy, promoted, "
                              "promoted_manually, other"},
                    "allowed_actions": {"type": "array", "items": {"enum": [c.value for c in Command]}},
                    "retry_of": {"type": ["string", "null"], "description": "the rollout this one retries"},
                    "retried_as": {"type": "array", "items": {"type": "string"}, "description": "the rollouts that "
                                   "retry this one, oldest first (GET of one rollout only)"},
                    "retryable": {"type": "boolean", "description": "whether POST /rollouts may name it in "
                                  "retry_of (GET of one rollout only)"}}},
                "Engine": {"type": "object", "properties": {
                    "role": {"enum": ["production", "baseline", "canary"]},
                    "name": {"type": "string", "description": "local: role-index; Kubernetes: the pod's name"},
                    "ready": {"type": "boolean"}, "restarts": {"type": "integer"},
                    "state": {"type": "string", "description": "running, exited N, pending, CrashLoopBackOff, ..."},
                    "last_log_line": {"type": "string"},
                    "log_error": {"type": "string", "description": "why the log could not be read, or \"\""},
                    "address": {"type": ["string", "null"]}}},
                "JudgeVariant": {"type": "object", "additionalProperties": False, "properties": {
                    "selector": {"type": "string", "maxLength": 1000,
                                 "description": "Prometheus label selector, e.g. {service=\"chat\",env=\"canary\"}"},
                    "scrape_urls": {"type": "array", "items": {"type": "string"}, "maxItems": 32,
                                    "description": "the variant's base URLs (GET /metrics)"}}},
                "JudgeRequest": {"type": "object", "required": ["canary", "baseline", "window"],
                                 "additionalProperties": False, "properties": {
                    "canary": {"$ref": "#/components/schemas/JudgeVariant"},
                    "baseline": {"$ref": "#/components/schemas/JudgeVariant"},
                    "window": {"type": ["string", "number"], "description": "\"5m\", \"30s\", \"1h\" or seconds "
                               "(10 s .. 24 h)"},
                    "policy": {"type": "object", "description": "fields of Policy (checks, z_fail, min_samples, ...)"},
                    "prometheus_url": {"type": "string", "description": "default: the service's Prometheus"},
                    "service": {"type": "string", "description": "scrape: keep only series with this service "
                                "label"}}},
                "FlaggerPayload": {"type": "object", "required": ["name", "namespace", "metadata"], "properties": {
                    "name": {"type": "string"}, "namespace": {"type": "string"}, "phase": {"type": "string"},
                    "checksum": {"type": "string"},
                    "metadata": {"type": "object", "additionalProperties": {"type": "string"}, "description":
                                 "canary_selector | canary_scrape_urls (comma-separated), baseline_selector | "
                                 "baseline_scrape_urls, window, policy (JSON text), prometheus_url, service, token"}}},
                "Judgement": {"type": "object", "properties": {
                    "verdict": {"enum": ["pass", "fail", "inconclusive"]}, "reason": {"type": "string"},
                    "need_more": {"type": ["integer", "null"]}, "window": {"type": "object"},
                    "source": {"type": "string"}, "pass": {"type": "boolean"}, "fail": {"type": "boolean"},
                    "inconclusive": {"type": "boolean"}, "variants": {"type": "object"},
                    "queries": {"type": "object"}, "evidence": {"type": "object"}}},
                "Event": {"type": "object", "properties": {
                    "id": {"type": "integer"}, "at": {"type": "number"}, "kind": {"type": "string"},
                    "phase": {"type": "string"}, "message": {"type": "string"}, "actor": {"type": "string"}}},
            }},
    }
