"""`vllm serve DIR` (vLLM's real CLI and OpenAI server) on torchtpu's "tpu" platform, on 127.0.0.1:
greedy completion text equals Hugging Face's, streaming, a malformed request gets vLLM's 400 and the
server keeps serving. The server runs in its own process group, killed at the end (no process or
port left behind); every wait is bounded."""
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

pytest.importorskip("vllm")
# Without vLLM installed, "import vllm" finds this very directory (tests/vllm).
pytest.importorskip("vllm.v1.attention.backend", reason="vLLM is not installed (bash tools/install_vllm.sh)")
pytest.importorskip("transformers")

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import tiny  # noqa: E402
from test_vllm_offline import _env, _has_entry_point  # noqa: E402

pytestmark = pytest.mark.skipif(not _has_entry_point(), reason="torchtpu's vllm.platform_plugins entry point missing")
NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _post(url, body, timeout=120):
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return r.status, r.read().decode()


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    d = str(tmp_path_factory.mktemp("tiny-llama-serve"))
    model, tok = tiny.make_llama(d)
    port = _free_port()
    log = tmp_path_factory.mktemp("serve") / "serve.log"
    vllm_cli = os.path.join(os.path.dirname(sys.executable), "vllm")
    cmd = [vllm_cli, "serve", d, "--host", "127.0.0.1", "--port", str(port), "--dtype", "float32",
           "--enforce-eager", "--max-model-len", "128", "--max-num-seqs", "4", "--gpu-memory-utilization", "0.3",
           # speculative decoding (n-gram): it must not change a token of any test below
           "--speculative-config", json.dumps(NGRAM)]
    f = open(log, "w")
    proc = subprocess.Popen(cmd, env=_env(multiprocessing=True), stdout=f, stderr=subprocess.STDOUT,
                            start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 300
        while True:
            if proc.poll() is not None:
                pytest.fail(f"vllm serve exited (rc={proc.returncode}):\n{log.read_text()[-6000:]}")
            try:
                with urllib.request.urlopen(base + "/v1/models", timeout=5) as r:
                    if r.status == 200:
                        break
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            if time.time() > deadline:
                pytest.fail(f"vllm serve not up after 300s:\n{log.read_text()[-6000:]}")
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
    with socket.socket() as s:  # nothing listens on the port any more (TIME_WAIT is fine)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", port))


def _spec_counter(base: str, name: str) -> float:
    with urllib.request.urlopen(base + "/metrics", timeout=30) as r:
        text = r.read().decode()
    return sum(float(ln.rsplit(" ", 1)[1]) for ln in text.splitlines() if ln.startswith(name + "{"))


def test_completions_greedy_matches_hf(server):
    """The server speculates with n-gram lookups (vLLM's --speculative-config): the same tokens
    as HF's greedy, and vLLM's own counters show drafts proposed (their acceptance:
    test_vllm_spec.py)."""
    base, d, model, tok = server
    prompts = ["The quick brown fox", "Hello", "one two three one two three one two three one two"]
    ref = tiny.hf_greedy(model, tok, prompts, 16)
    for p, r in zip(prompts, ref):
        status, body = _post(base + "/v1/completions", {"model": d, "prompt": p, "max_tokens": 16,
                                                        "temperature": 0, "ignore_eos": True,
                                                        "return_token_ids": True})
        assert status == 200
        choice = json.loads(body)["choices"][0]
        assert choice["token_ids"] == r
        # the text is the tokens' (vLLM holds back a trailing incomplete UTF-8 character)
        assert tok.decode(r).startswith(choice["text"]) and len(choice["text"]) >= len(tok.decode(r)) - 1
    assert _spec_counter(base, "vllm:spec_decode_num_drafts_total") > 0


def test_streaming_and_bad_request(server):
    base, d, model, tok = server
    status, body = _post(base + "/v1/completions", {"model": d, "prompt": "Hello", "max_tokens": 6,
                                                    "temperature": 0, "ignore_eos": True, "stream": True})
    assert status == 200
    chunks = [json.loads(ln[6:]) for ln in body.splitlines() if ln.startswith("data: ") and ln != "data: [DONE]"]
    assert body.rstrip().endswith("data: [DONE]")
    text = "".join(c["choices"][0]["text"] for c in chunks)
    assert text == tok.decode(tiny.hf_greedy(model, tok, ["Hello"], 6)[0])
    with pytest.raises(urllib.error.HTTPError) as e:
        _post(base + "/v1/completions", {"model": d, "prompt": "x", "max_tokens": -3})
    assert e.value.code == 400
    status, _ = _post(base + "/v1/completions", {"model": d, "prompt": "Hello", "max_tokens": 2})
    assert status == 200


def test_chat_completions_greedy_matches_hf(server):
    base, d, model, tok = server
    messages = [{"role": "user", "content": "Hello world!"}]
    prompt = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    ref = tiny.hf_greedy(model, tok, [prompt], 8)[0]
    status, body = _post(base + "/v1/chat/completions", {"model": d, "messages": messages, "max_tokens": 8,
                                                         "temperature": 0, "ignore_eos": True})
    assert status == 200
    assert json.loads(body)["choices"][0]["message"]["content"] == tok.decode(ref)
