"""An OpenAI-compatible server on tpu: transformers' own `transformers serve`
(chat completions, completions, responses; streaming; optional continuous
batching) with the model on the "tpu" device, behind a request validator.

    python -m torchtpu.serve MODEL_DIR [--port 8000] [--continuous-batching --cb-num-blocks 256]

`transformers serve` answers a malformed request (say `"messages": "hi"`)
with a bare 500 from inside its handler; the validator, an ASGI middleware
in front of transformers' app, answers it with a 400 and an OpenAI-style
error message instead, and any other failure of a request with a JSON 500.
The server keeps serving either way.

With continuous batching, size the KV cache (`--cb-num-blocks`, or
`--cb-max-memory-percent`): for a device it does not know, transformers
sizes it from the host's total memory.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import sys

import torchtpu  # noqa: F401  registers the "tpu" device

_CHAT, _COMPLETIONS = "/v1/chat/completions", "/v1/completions"


class RequestError(ValueError):
    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.param = param


def _check_int(body: dict, key: str, lo: int = 1) -> None:
    v = body.get(key)
    if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < lo):
        raise RequestError(f"'{key}' must be an integer >= {lo}, got {v!r}", key)


def _check_number(body: dict, key: str, lo: float, hi: float) -> None:
    v = body.get(key)
    if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not lo <= v <= hi):
        raise RequestError(f"'{key}' must be a number in [{lo}, {hi}], got {v!r}", key)


def validate(path: str, body) -> None:
    """Raises RequestError for a request transformers' handlers would fail on."""
    if not isinstance(body, dict):
        raise RequestError("the request body must be a JSON object")
    if path == _CHAT:
        msgs = body.get("messages")
        if not isinstance(msgs, list) or not msgs:
            raise RequestError("'messages' must be a non-empty list of {role, content} objects", "messages")
        for i, m in enumerate(msgs):
            if not isinstance(m, dict) or not isinstance(m.get("role"), str):
                raise RequestError(f"messages[{i}] must be an object with a string 'role'", "messages")
            c = m.get("content")
            if c is not None and not isinstance(c, (str, list)):
                raise RequestError(f"messages[{i}].content must be a string or a list of parts", "messages")
    else:
        p = body.get("prompt")
        if not (isinstance(p, str) or (isinstance(p, list) and p and all(isinstance(x, int) for x in p))):
            raise RequestError("'prompt' must be a string or a non-empty list of token ids", "prompt")
    for key in ("max_tokens", "max_completion_tokens", "n"):
        _check_int(body, key)
    if body.get("n", 1) != 1:
        raise RequestError("only n=1 is supported", "n")
    _check_int(body, "seed", 0)
    _check_number(body, "temperature", 0.0, 2.0)
    _check_number(body, "top_p", 0.0, 1.0)
    if "stream" in body and not isinstance(body["stream"], bool):
        raise RequestError("'stream' must be true or false", "stream")


def _json_response(status: int, payload: dict):
    data = json.dumps(payload).encode()
    return [{"type": "http.response.start", "status": status,
             "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]},
            {"type": "http.response.body", "body": data}]


def _error(status: int, message: str, kind: str, param: str | None = None):
    return _json_response(status, {"error": {"message": message, "type": kind, "param": param, "code": None}})


class ValidatingApp:
    """ASGI middleware: validates OpenAI requests before transformers' app sees them."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope.get("method") != "POST" or scope.get("path") not in (_CHAT, _COMPLETIONS):
            return await self.app(scope, receive, send)
        chunks, more = [], True
        while more:
            msg = await receive()
            if msg["type"] == "http.disconnect":
                return
            chunks.append(msg.get("body", b""))
            more = msg.get("more_body", False)
        raw = b"".join(chunks)
        try:
            body = json.loads(raw or b"null")
        except ValueError as e:
            return await self._send_all(send, _error(400, f"invalid JSON: {e}", "invalid_request_error"))
        try:
            validate(scope["path"], body)
        except RequestError as e:
            return await self._send_all(send, _error(400, str(e), "invalid_request_error", e.param))
        replayed = False

        async def replay():
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": raw, "more_body": False}
            return await receive()

        started = False

        async def watch(msg):
            nonlocal started
            if msg["type"] == "http.response.start":
                started = True
            await send(msg)

        try:
            await self.app(scope, replay, watch)
        except Exception as e:  # the request failed inside transformers: answer it, keep serving
            if not started:
                await self._send_all(send, _error(500, f"{type(e).__name__}: {e}", "server_error"))

    @staticmethod
    async def _send_all(send, msgs):
        for m in msgs:
            await send(m)


def _serve_class():
    from transformers.cli.serve import Serve

    class TpuServe(Serve):
        """transformers' Serve with the validator in front of its app."""

        def start_server(self):
            self.server.config.app = ValidatingApp(self.server.config.app)
            super().start_server()

    return TpuServe


def start(model: str, *, host: str = "127.0.0.1", port: int = 8000, device: str = "tpu", **kwargs):
    """Starts the server in a background thread; returns the server (`.kill_server()` stops it)."""
    return _serve_class()(force_model=model, device=device, host=host, port=port, non_blocking=True, **kwargs)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(prog="python -m torchtpu.serve", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model", help="a model directory (or hub id) for AutoModelForCausalLM")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--device", default="tpu")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--continuous-batching", action="store_true")
    p.add_argument("--cb-num-blocks", type=int, default=None)
    p.add_argument("--cb-block-size", type=int, default=None)
    p.add_argument("--cb-max-batch-tokens", type=int, default=None)
    p.add_argument("--cb-max-memory-percent", type=float, default=None)
    p.add_argument("--log-level", default="warning")
    a = p.parse_args(argv)
    cb = {}
    if a.continuous_batching:
        cb = {"continuous_batching": True, "cb_num_blocks": a.cb_num_blocks, "cb_block_size": a.cb_block_size,
              "cb_max_batch_tokens": a.cb_max_batch_tokens, "cb_max_memory_percent": a.cb_max_memory_percent,
              "cb_use_cuda_graph": False}
        if a.cb_num_blocks is None and a.cb_max_memory_percent is None:
            p.error("--continuous-batching needs --cb-num-blocks or --cb-max-memory-percent on tpu")
    srv = start(a.model, host=a.host, port=a.port, device=a.device, dtype=a.dtype, log_level=a.log_level, **cb)

    def stop(signum, frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)  # shut down as on Ctrl-C
    try:
        while srv._thread.is_alive():
            srv._thread.join(timeout=0.5)
    except KeyboardInterrupt:
        pass
    finally:
        srv.kill_server()
        srv._thread.join(timeout=5)
        # transformers' server leaves a non-daemon thread serving after kill_server: end the process
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


if __name__ == "__main__":
    main()
