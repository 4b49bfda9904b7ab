"""Shared helpers for the engine tests."""


def run_to_completion(engine, max_steps: int = 10_000) -> dict:
    """Step until idle; returns {request_id: {"tokens", "text", "finish_reason", "outputs"}}."""
    results: dict = {}
    for _ in range(max_steps):
        if not engine.has_unfinished_requests():
            return results
        for out in engine.step():
            r = results.setdefault(out.request_id, {"tokens": [], "text": "", "finish_reason": None, "outputs": []})
            r["tokens"] += out.new_token_ids
            r["text"] += out.new_text
            r["outputs"].append(out)
            if out.finished:
                r["finish_reason"] = out.finish_reason
    raise AssertionError("engine did not finish")
