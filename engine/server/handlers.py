"""/v1/completions and /v1/chat/completions: validate, admit into the engine, stream or collect, account."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from dataclasses import dataclass
from typing import Any, AsyncIterator

from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response

from sits.engine.errors import ContextLengthError, EngineError, InvalidRequestError, QueueFullError, check_context_length
from sits.engine.sampling_params import SamplingParams
from sits.engine.server.errors import APIError, error_body
from sits.engine.server.logprobs import chat_logprobs, completion_logprobs
from sits.engine.server.protocol import GenerationRequest, parse_tenant
from sits.engine.core.runner import Rejected, Runner
from sits.engine.server.sse import SSE_DONE, SSEResponse, sse_event, wait_for_disconnect
from sits.engine.server.state import ServerState, server_state
from sits.engine.server.tracker import Tracker
from sits.wire.headers import PROBE_HEADER, REPLAY_HEADER, marked
from sits.wire.http_limits import MAX_BODY_BYTES

_LONG_PROMPT_CHARS = 8192  # tokenize longer prompts in a worker thread, not on the event loop
RETRY_AFTER_S = "1"


async def completions(request: Request) -> Response:
    return await _generate(request, "completion")


async def chat_completions(request: Request) -> Response:
    return await _generate(request, "chat")


@dataclass(slots=True, frozen=True)
class Prepared:
    """A validated generation request, ready for the engine."""

    request: GenerationRequest
    prompt_ids: list[int]
    params: SamplingParams
    tenant: str
    priority: int
    arrival: float   # when the request body was complete: TTFT, queue time and e2e latency count from here


async def _prepare(request: Request, kind: str) -> Prepared:
    state = server_state(request)
    runner = state.runner
    if not runner.ready.is_set():
        raise APIError(503, runner.load_error or "the model is still loading", headers={"Retry-After": "5"})
    raw = await _read_body(request)
    arrival = time.perf_counter()   # the client's upload time is not the server's latency (see HTTPMetricsMiddleware)
    greq = await state.body_parser.parse(raw, kind)   # a large body off the event loop (engine/server/body_parser.py)
    if greq.model not in state.model_names:
        raise APIError(404, f"the model {greq.model!r} does not exist; this server serves "
                       f"{', '.join(sorted(state.model_names))}", param="model", code="model_not_found")
    tenant, priority = parse_tenant(request.headers)
    engine = runner.engine
    tok = engine.tokenizer
    prompt_param = "messages" if kind == "chat" else "prompt"
    if kind == "chat":
        greq.prompt = tok.apply_chat_template(greq.messages)
    if isinstance(greq.prompt, str):
        if len(greq.prompt) > _LONG_PROMPT_CHARS:
            ids = await asyncio.to_thread(tok.encode, greq.prompt)
        else:
            ids = tok.encode(greq.prompt)
    else:
        ids = greq.prompt
    ctx = engine.max_model_len
    if not ids:
        raise APIError(400, "the prompt is empty after tokenization", param=prompt_param)
    max_tokens = greq.max_tokens if greq.max_tokens is not None else max(ctx - len(ids), 1)
    if greq.echo and max_tokens == 0:
        max_tokens = 1   # scoring only: the engine always generates one token; the response leaves it out
    try:
        check_context_length(len(ids), max_tokens, ctx, prompt_param)
    except ContextLengthError as e:
        raise APIError(400, str(e), param=e.param, code="context_length_exceeded") from None
    try:
        params = SamplingParams(max_tokens=max_tokens, temperature=greq.temperature, top_p=greq.top_p,
                                top_k=greq.top_k, seed=greq.seed, stop=greq.stop,
                                stop_token_ids=greq.stop_token_ids, ignore_eos=greq.ignore_eos,
                                logprobs=greq.logprobs,
                                prompt_logprobs=greq.logprobs if greq.echo else None)
    except (InvalidRequestError, ValueError) as e:
        raise APIError(400, str(e), param=getattr(e, "param", None)) from None
    return Prepared(greq, ids, params, tenant, priority, arrival)


async def _read_body(request: Request) -> bytes:
    declared = request.headers.get("content-length", "")
    if declared.isascii() and declared.isdigit() and (len(declared) > 18 or int(declared) > MAX_BODY_BYTES):
        raise APIError(413, f"request body of {declared[:20]} bytes exceeds the limit of {MAX_BODY_BYTES} bytes")
    chunks, size = [], 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > MAX_BODY_BYTES:
                raise APIError(413, f"request body exceeds the limit of {MAX_BODY_BYTES} bytes")
            chunks.append(chunk)
    except ClientDisconnect:   # the client went away (or missed the body deadline) before its body was complete
        raise APIError(400, "the connection closed before the request body was complete") from None
    return b"".join(chunks)


def _rejection(error: Exception) -> APIError:
    if isinstance(error, QueueFullError):
        return APIError(429, f"the server's waiting queue is full: {error}", code="queue_full",
                        headers={"Retry-After": RETRY_AFTER_S})
    if isinstance(error, ContextLengthError):
        return APIError(400, str(error), param=error.param, code="context_length_exceeded")
    if isinstance(error, (InvalidRequestError, ValueError)):
        return APIError(400, str(error), param=getattr(error, "param", None))
    return APIError(503, f"the engine could not take the request: {error}", headers={"Retry-After": RETRY_AFTER_S})


async def _generate(request: Request, kind: str) -> Response:
    state = server_state(request)
    prep = await _prepare(request, kind)
    greq, ids, tenant, priority = prep.request, prep.prompt_ids, prep.tenant, prep.priority
    faults = state.faults
    if faults.error_rate > 0 and faults.rng.random() < faults.error_rate:
        raise APIError(500, "injected fault (--fault-error-rate): the request failed", code="injected_fault")
    rid = f"{'chatcmpl' if kind == 'chat' else 'cmpl'}-{uuid.uuid4().hex}"
    span = state.tracer.start_request(f"POST /v1/{'chat/completions' if kind == 'chat' else 'completions'}",
                                      request.headers, tenant=tenant, priority=priority, request_id=rid)
    tracker = Tracker(state, span, prep.arrival, len(ids), probe=is_probe(request.headers),
                      replay=marked(request.headers, REPLAY_HEADER))
    if faults.latency_s > 0:
        await asyncio.sleep(faults.latency_s)  # fault injection: once per request, before the first token
    runner = state.runner
    try:
        queue = await runner.submit(rid, ids, prep.params, tenant=tenant, priority=priority)
    except EngineError as e:
        err = _rejection(e)
        tracker.close(error=err.message)
        raise err from None
    created = int(time.time())
    if greq.stream:
        return SSEResponse(_stream(greq, rid, created, queue, tracker, state),
                           on_close=lambda: _on_stream_close(runner, rid, tracker))
    return await _collect(request, greq, ids, rid, created, queue, tracker, state)


def _on_stream_close(runner: Runner, rid: str, tracker: Tracker) -> None:
    if not tracker.closed:
        runner.abort(rid)
        tracker.close(aborted=True)


async def _collect(request: Request, greq: GenerationRequest, ids: list[int], rid: str, created: int,
                   queue: asyncio.Queue, tracker: Tracker, state: ServerState) -> Response:
    async def drain() -> str | None:
        while True:
            item = await queue.get()
            if isinstance(item, Rejected):
                return str(item.error)
            tracker.on_output(item)
            tracker.text.append(item.out.new_text)
            if item.out.finished:
                return None

    drain_task = asyncio.ensure_future(drain())
    gone_task = asyncio.ensure_future(wait_for_disconnect(request.receive))
    try:
        await asyncio.wait({drain_task, gone_task}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone_task.cancel()
        abandoned = not drain_task.done()   # the client left (or this handler was cancelled) first
        if abandoned:
            drain_task.cancel()
            state.runner.abort(rid)
            tracker.close(aborted=True)
    if abandoned:
        # cancel() only asks: the task is not cancelled until it runs again, so never read its result here
        await asyncio.gather(drain_task, return_exceptions=True)
        return Response(status_code=499)  # nobody is listening; recorded as 499 like nginx does, never as a 5xx
    error = drain_task.result()
    if error is not None:
        tracker.close(error=error)
        raise APIError(503, f"the request was interrupted: {error}")
    tracker.close()
    text = "".join(tracker.text)
    fp = state.system_fingerprint
    decode = state.runner.engine.tokenizer.decode if greq.logprobs is not None else None
    if greq.kind == "chat":
        lp = chat_logprobs(decode, tracker.logprobs) if greq.logprobs is not None else None
        choice = {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": lp,
                  "finish_reason": tracker.finish_reason}
        body = {"id": rid, "object": "chat.completion", "created": created, "model": greq.model,
                "system_fingerprint": fp, "choices": [choice], "usage": tracker.usage()}
    else:
        choice = _completion_choice(greq, ids, text, tracker, state)
        usage = tracker.usage()
        if greq.echo and greq.max_tokens == 0:
            usage.update(completion_tokens=0, total_tokens=usage["prompt_tokens"])
        body = {"id": rid, "object": "text_completion", "created": created, "model": greq.model,
                "system_fingerprint": fp, "choices": [choice], "usage": usage}
    return JSONResponse(body)


def _completion_choice(greq: GenerationRequest, ids: list[int], text: str, tracker: Tracker,
                       state: ServerState) -> dict:
    """echo: the prompt leads the text, and (with logprobs) its tokens lead the logprobs, scored given what precedes
    them (the first has none); max_tokens 0 with echo scores the prompt alone."""
    decode = state.runner.engine.tokenizer.decode
    out_ids, entries = tracker.token_ids, tracker.logprobs
    if greq.echo and greq.max_tokens == 0:
        text, out_ids, entries = "", [], []
    if greq.echo:
        text = (greq.prompt if isinstance(greq.prompt, str) else decode(ids)) + text
    lp = None
    if greq.logprobs is not None:
        lead = [ids[0], *tracker.prompt_logprobs] if greq.echo else []
        lp = completion_logprobs(decode, lead + entries, 0, as_ids=greq.tokens_as_ids)
    choice = {"index": 0, "text": text, "logprobs": lp, "finish_reason": tracker.finish_reason}
    if greq.return_token_ids:
        choice.update(prompt_token_ids=list(ids), token_ids=list(out_ids))
    return choice


def is_probe(headers: Any) -> bool:
    return marked(headers, PROBE_HEADER)


async def _stream(greq: GenerationRequest, rid: str, created: int, queue: asyncio.Queue, tracker: Tracker,
                  state: ServerState) -> AsyncIterator[bytes]:
    chat = greq.kind == "chat"
    head = {"id": rid, "object": "chat.completion.chunk" if chat else "text_completion", "created": created,
            "model": greq.model, "system_fingerprint": state.system_fingerprint}
    dumps = json.dumps
    decode = state.runner.engine.tokenizer.decode if greq.logprobs is not None else None
    sent = {"logprobs": 0, "chars": 0}   # logprob entries already sent; completion text offset

    def chunk(text: str | None, finish: str | None, role: bool = False) -> bytes:
        lp = None
        if greq.logprobs is not None and not role:
            entries = tracker.logprobs[sent["logprobs"]:]
            sent["logprobs"] = len(tracker.logprobs)
            lp = chat_logprobs(decode, entries) if chat else completion_logprobs(decode, entries, sent["chars"],
                                                                                 as_ids=greq.tokens_as_ids)
            sent["chars"] += sum(len(t) for t in lp.get("tokens", ()))
        if chat:
            delta: dict[str, str] = {"role": "assistant", "content": ""} if role else {}
            if text:
                delta["content"] = text
            choice = {"index": 0, "delta": delta, "logprobs": lp, "finish_reason": finish}
        else:
            choice = {"index": 0, "text": text or "", "logprobs": lp, "finish_reason": finish}
        return sse_event(dumps({**head, "choices": [choice]}).encode())

    if chat:
        yield chunk(None, None, role=True)
    finished = False
    while not finished:
        items = [await queue.get()]
        while not queue.empty():  # the loop fell behind the engine: send what piled up as one chunk
            items.append(queue.get_nowait())
        text: list[str] = []
        for item in items:
            if isinstance(item, Rejected):
                tracker.close(error=str(item.error))
                state.metrics.count_error(503)  # the 200 status line is long gone: count the in-band error
                if any(text):
                    yield chunk("".join(text), None)
                yield sse_event(dumps(error_body(503, f"the request was interrupted: {item.error}")).encode())
                return
            tracker.on_output(item)
            text.append(item.out.new_text)
            finished = item.out.finished
        if finished:
            tracker.close()  # before the last yield: a client that stops reading now still counts as served
            yield chunk("".join(text), tracker.finish_reason)
        elif any(text) or (greq.logprobs is not None and len(tracker.logprobs) > sent["logprobs"]):
            yield chunk("".join(text), None)
    if greq.include_usage:
        yield sse_event(dumps({**head, "choices": [], "usage": tracker.usage()}).encode())
    yield SSE_DONE
