"""A small real HTTP upstream for router tests (run as a subprocess): echoes requests, streams, sleeps, digests bodies.

    python tests/control_plane/router/upstream_server.py --name canary --port 8123
"""
from __future__ import annotations

import argparse
import asyncio
import hashlib
import json

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, StreamingResponse
from starlette.routing import Route


def make_app(name: str) -> Starlette:
    async def echo(request: Request):
        delay = float(request.query_params.get("delay", "0"))
        if delay:
            await asyncio.sleep(delay)
        body = await request.body()
        return JSONResponse({"name": name, "method": request.method, "path": request.url.path,
                             "query": request.url.query, "body": body.decode(),
                             "traceparent": request.headers.get("traceparent"),
                             "x_forwarded_for": request.headers.get("x-forwarded-for"),
                             "headers": [[k.decode("latin-1"), v.decode("latin-1")] for k, v in request.headers.raw]})

    async def digest(request: Request):
        h, n = hashlib.sha256(), 0
        async for chunk in request.stream():
            h.update(chunk)
            n += len(chunk)
        return JSONResponse({"name": name, "bytes": n, "sha256": h.hexdigest()})

    async def hop(request: Request):
        # a response naming its own hop-by-hop header in Connection, which a proxy must not pass on
        return PlainTextResponse("hop", headers={"connection": "x-hop-secret", "x-hop-secret": "1",
                                                 "x-end-to-end": "kept"})

    async def stream(request: Request):
        n, delay = int(request.query_params.get("n", "5")), float(request.query_params.get("delay", "0.1"))

        async def gen():
            for i in range(n):
                yield f"data: {json.dumps({'name': name, 'i': i})}\n\n"
                await asyncio.sleep(delay)
            yield "data: [DONE]\n\n"
        return StreamingResponse(gen(), media_type="text/event-stream")

    async def ok(request: Request):
        return PlainTextResponse("ok")

    return Starlette(routes=[Route("/echo", echo, methods=["GET", "POST"]), Route("/v1/completions", echo,
                             methods=["POST"]), Route("/stream", stream), Route("/readyz", ok), Route("/healthz", ok),
                             Route("/digest", digest, methods=["POST", "PUT"]), Route("/hop", hop)])


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--name", required=True)
    p.add_argument("--port", type=int, required=True)
    a = p.parse_args()
    uvicorn.run(make_app(a.name), host="127.0.0.1", port=a.port, log_level="warning", access_log=False)
