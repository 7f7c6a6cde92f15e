"""``python -m sglang.launch_server`` (SGLang's real CLI, OpenAI and native servers) on torchtpu's
"tpu" platform, on 127.0.0.1: greedy completion and chat text equal Hugging Face's, streaming,
SGLang's native /generate, a malformed request gets a 400 and the server keeps serving. The
server runs in its own process group, killed at the end (no process or port left behind); every
wait is bounded."""
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest

from conftest import env


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _post(url, body, timeout=120):
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return r.status, r.read().decode()


def _pids_with(mark: str) -> list[int]:
    out = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open(f"/proc/{pid}/environ", "rb") as f:
                    if mark.encode() in f.read():
                        out.append(int(pid))
            except OSError:
                pass
    return out


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    import uuid

    import tiny

    d = str(tmp_path_factory.mktemp("sgl-llama-serve"))
    model, tok = tiny.make_llama(d)
    port = _free_port()
    log = tmp_path_factory.mktemp("serve") / "serve.log"
    mark = uuid.uuid4().hex
    cmd = [sys.executable, "-m", "sglang.launch_server", "--model-path", d, "--host", "127.0.0.1",
           "--port", str(port), "--dtype", "float32", "--max-total-tokens", "2048", "--max-running-requests", "4",
           "--mem-fraction-static", "0.5", "--cuda-graph-max-bs-decode", "4", "--random-seed", "0",
           "--log-level", "warning"]
    f = open(log, "w")
    proc = subprocess.Popen(cmd, env=env(None, {"TORCHTPU_TEST_MARK": mark}), cwd=str(log.parent), stdout=f,
                            stderr=subprocess.STDOUT,
                            start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 300
        while True:
            if proc.poll() is not None:
                pytest.fail(f"launch_server exited (rc={proc.returncode}):\n{log.read_text()[-6000:]}")
            try:
                with urllib.request.urlopen(base + "/health_generate", timeout=30) as r:
                    if r.status == 200:
                        break
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            if time.time() > deadline:
                pytest.fail(f"launch_server not up after 300s:\n{log.read_text()[-6000:]}")
            time.sleep(2)
        yield base, d, model, tok
    finally:
        try:
            os.killpg(proc.pid, signal.SIGINT)
            proc.wait(timeout=30)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            pass
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
        f.close()
    # SGLang's scheduler and detokenizer are children in the same session: none is left
    deadline = time.time() + 15
    while _pids_with(mark) and time.time() < deadline:
        time.sleep(0.2)
    assert _pids_with(mark) == []
    with socket.socket() as s:  # nothing listens on the port any more (TIME_WAIT is fine)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", port))


def test_completions_and_native_generate_match_hf(server):
    import tiny

    base, d, model, tok = server
    prompts = ["The quick brown fox", "Hello"]
    ref = tiny.hf_greedy(model, tok, prompts, 8)
    for p, r in zip(prompts, ref):
        status, body = _post(base + "/v1/completions", {"model": d, "prompt": p, "max_tokens": 8,
                                                        "temperature": 0, "ignore_eos": True})
        assert status == 200
        assert json.loads(body)["choices"][0]["text"] == tok.decode(r)
        status, body = _post(base + "/generate", {"text": p, "sampling_params": {
            "max_new_tokens": 8, "temperature": 0, "ignore_eos": True}})
        assert status == 200
        out = json.loads(body)
        assert out["text"] == tok.decode(r)
        assert out["meta_info"]["completion_tokens"] == 8


def test_streaming_and_bad_request(server):
    import tiny

    base, d, model, tok = server
    status, body = _post(base + "/v1/completions", {"model": d, "prompt": "Hello", "max_tokens": 6,
                                                    "temperature": 0, "ignore_eos": True, "stream": True})
    assert status == 200
    chunks = [json.loads(ln[6:]) for ln in body.splitlines() if ln.startswith("data: ") and ln != "data: [DONE]"]
    assert body.rstrip().endswith("data: [DONE]")
    text = "".join(c["choices"][0]["text"] for c in chunks if c.get("choices"))
    assert text == tok.decode(tiny.hf_greedy(model, tok, ["Hello"], 6)[0])
    with pytest.raises(urllib.error.HTTPError) as e:
        _post(base + "/v1/completions", {"model": d, "prompt": "x", "max_tokens": -3})
    assert e.value.code == 400
    status, _ = _post(base + "/v1/completions", {"model": d, "prompt": "Hello", "max_tokens": 2})
    assert status == 200


def test_chat_completions_greedy_matches_hf(server):
    import tiny

    base, d, model, tok = server
    messages = [{"role": "user", "content": "Hello world!"}]
    prompt = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    ref = tiny.hf_greedy(model, tok, [prompt], 8)[0]
    status, body = _post(base + "/v1/chat/completions", {"model": d, "messages": messages, "max_tokens": 8,
                                                         "temperature": 0, "ignore_eos": True})
    assert status == 200
    assert json.loads(body)["choices"][0]["message"]["content"] == tok.decode(ref)
