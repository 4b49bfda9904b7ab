"""OpenAI-compatible HTTP server around LLMEngine (starlette on uvicorn; the engine loop runs in its own thread)."""

from sits.engine.server.main import ServerConfig, build_app, main

__all__ = ["ServerConfig", "build_app", "main"]
