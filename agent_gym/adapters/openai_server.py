"""A small OpenAI-compatible chat server for one of our models (``POST /v1/chat/completions``).

What libraries that speak to a model over HTTP (verifiers, OpenAI-client harnesses) need from a local model on a
CPU machine where vLLM's server is too heavy to start in a test. Each request's ``messages`` are rendered with the
model's chat template and continued by the same ``TransformersBackend`` our trainer samples with; ``temperature``
0 is greedy, ``max_tokens`` / ``max_completion_tokens`` bound the reply, ``stop`` strings are honoured. No tool
calling: the env parses tool calls from the reply text in its own wire format. ``n`` > 1 and streaming are
refused with 400.
"""

# No `from __future__ import annotations`: FastAPI resolves the request handler's types at runtime.
import threading
import time
import uuid
from typing import Any

__all__ = ["create_chat_app"]


def create_chat_app(model: Any, tokenizer: Any, model_name: str = "agent-gym", max_tokens: int = 256) -> Any:
    """The FastAPI app serving ``model`` (a causal LM with its tokenizer's chat template) as ``model_name``."""
    from fastapi import FastAPI, Request
    from fastapi.responses import JSONResponse

    from agent_gym.models.chat_template import render_prompt, turn_stop_token_ids
    from agent_gym.trainers.backends import SamplingParams, TransformersBackend

    backend = TransformersBackend(model, tokenizer)
    stop_ids = turn_stop_token_ids(tokenizer)
    lock = threading.Lock()  # one generation at a time: the model is shared
    app = FastAPI(title=f"{model_name} (OpenAI-compatible)", docs_url=None, redoc_url=None)

    def error(status: int, message: str) -> Any:
        return JSONResponse({"error": {"message": message, "type": "invalid_request_error"}}, status_code=status)

    @app.get("/v1/models")
    def models() -> Any:
        return {"object": "list", "data": [{"id": model_name, "object": "model", "owned_by": "agent-gym"}]}

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Any:
        try:
            body = await request.json()
        except ValueError:
            return error(400, "the body is not JSON")
        messages = body.get("messages") if isinstance(body, dict) else None
        if not isinstance(messages, list) or not messages:
            return error(400, "messages must be a non-empty list of {role, content}")
        if body.get("stream") or int(body.get("n") or 1) != 1:
            return error(400, "this server answers with one non-streamed choice (n=1, stream=false)")
        limit = body.get("max_completion_tokens") or body.get("max_tokens") or max_tokens
        stop = body.get("stop") or []
        params = SamplingParams(
            max_new_tokens=int(limit), temperature=float(body.get("temperature", 1.0) or 0.0),
            top_p=float(body.get("top_p", 1.0) or 1.0), stop_token_ids=stop_ids,
            stop_strings=[stop] if isinstance(stop, str) else list(stop),
            seed=body.get("seed") if isinstance(body.get("seed"), int) else None,
        )
        plain = [{"role": m.get("role", "user"), "content": _text(m.get("content"))} for m in messages]
        try:
            prompt = render_prompt(tokenizer, plain)
        except Exception as problem:  # noqa: BLE001 - a template that cannot render these messages is a 400
            return error(400, f"cannot render the messages with the model's chat template: {problem}")
        with lock:
            (generation,) = backend.generate([prompt], params)
        text = tokenizer.decode(generation.token_ids, skip_special_tokens=True)
        return {
            "id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion", "created": int(time.time()),
            "model": body.get("model") or model_name,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                         "finish_reason": generation.finish_reason, "logprobs": None}],
            "usage": {"prompt_tokens": len(prompt), "completion_tokens": len(generation.token_ids),
                      "total_tokens": len(prompt) + len(generation.token_ids)},
        }

    return app


def _text(content: Any) -> str:
    """A message's content as text (OpenAI's list-of-parts form joined)."""
    if isinstance(content, list):
        return "".join(part.get("text", "") for part in content if isinstance(part, dict))
    return "" if content is None else str(content)
