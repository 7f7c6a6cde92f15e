"""The OpenAI-compatible server (torchtpu.serve: transformers serve on tpu) with a real
HTTP client: chat and text completions equal the model's own greedy generation,
streaming, and bad requests get a 4xx with a message while the server keeps serving."""
import json
import socket
import time

import pytest
import torch

transformers = pytest.importorskip("transformers")
httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
pytest.importorskip("openai")  # transformers serve needs it


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """A tiny Llama and a byte-level BPE tokenizer with a chat template, saved locally."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    d = tmp_path_factory.mktemp("tiny-llama")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<pad>", "<eos>", "<bos>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(["hello world, this is a tiny corpus for a tiny model."] * 10, trainer)
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>",
                                                bos_token="<bos>")
    fast.chat_template = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                          "{% if add_generation_prompt %}assistant:{% endif %}")
    fast.save_pretrained(d)
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, vocab_size=len(fast), max_position_embeddings=512,
                                   pad_token_id=fast.pad_token_id, eos_token_id=fast.eos_token_id,
                                   bos_token_id=fast.bos_token_id)
    transformers.LlamaForCausalLM(cfg).eval().save_pretrained(d)
    return str(d)


def _start(model_dir, **kwargs):
    """Starts torchtpu.serve on a free 127.0.0.1 port; returns (server, base url) once it answers."""
    from torchtpu import serve

    port = _free_port()
    srv = serve.start(model_dir, port=port, log_level="error", **kwargs)
    base = f"http://127.0.0.1:{port}"
    deadline = time.time() + 60
    while True:
        try:
            if httpx.get(base + "/health", timeout=2).status_code == 200:
                return srv, base
        except httpx.HTTPError:
            pass
        if time.time() > deadline:
            srv.kill_server()
            raise RuntimeError("server did not start")
        time.sleep(0.2)


@pytest.fixture(scope="module")
def server(model_dir):
    srv, base = _start(model_dir)
    try:
        yield base
    finally:
        srv.kill_server()


def _greedy(model_dir, text=None, messages=None, n=8):
    tok = transformers.AutoTokenizer.from_pretrained(model_dir)
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir)
    if messages is not None:
        ids = tok.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)
        ids = ids["input_ids"]
    else:
        ids = tok(text, return_tensors="pt")["input_ids"]
    out = model.generate(ids, max_new_tokens=n, do_sample=False)[0, ids.shape[1]:]
    return tok.decode(out, skip_special_tokens=True)


def test_chat_completion_equals_greedy_generation(server, model_dir):
    msgs = [{"role": "user", "content": "hello world"}]
    r = httpx.post(server + "/v1/chat/completions", timeout=120,
                   json={"model": model_dir, "messages": msgs, "max_tokens": 8})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "chat.completion"
    assert body["choices"][0]["message"]["role"] == "assistant"
    assert body["choices"][0]["message"]["content"] == _greedy(model_dir, messages=msgs)
    assert 1 <= body["usage"]["completion_tokens"] <= 8


def test_completion_and_streaming(server, model_dir):
    r = httpx.post(server + "/v1/completions", timeout=120,
                   json={"model": model_dir, "prompt": "hello world", "max_tokens": 8})
    assert r.status_code == 200, r.text
    text = r.json()["choices"][0]["text"]
    assert text and text == _greedy(model_dir, text="hello world")
    msgs = [{"role": "user", "content": "a tiny test"}]
    deltas, finish = [], None
    with httpx.stream("POST", server + "/v1/chat/completions", timeout=120,
                      json={"model": model_dir, "messages": msgs, "max_tokens": 6, "stream": True}) as s:
        assert s.status_code == 200
        for line in s.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            choice = json.loads(line[6:])["choices"][0]
            deltas.append(choice["delta"].get("content") or "")
            finish = choice.get("finish_reason") or finish
    assert finish in ("stop", "length")
    assert "".join(deltas) == _greedy(model_dir, messages=msgs, n=6)


@pytest.mark.parametrize("path,payload,param", [
    ("/v1/chat/completions", {"messages": "hi"}, "messages"),
    ("/v1/chat/completions", {"messages": [{"content": "no role"}]}, "messages"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "max_tokens": -3}, "max_tokens"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "temperature": "hot"}, "temperature"),
    ("/v1/completions", {"prompt": 42}, "prompt"),
    ("/v1/completions", [1, 2], None),
])
def test_bad_requests_get_400_and_the_server_keeps_serving(server, model_dir, path, payload, param):
    r = httpx.post(server + path, json=payload, timeout=60)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and err["message"] and err["param"] == param
    r = httpx.post(server + "/v1/completions", content=b"{not json", timeout=60,
                   headers={"content-type": "application/json"})
    assert r.status_code == 400 and "invalid JSON" in r.json()["error"]["message"]
    r = httpx.post(server + "/v1/completions", json={"model": model_dir, "prompt": "hello", "max_tokens": 2},
                   timeout=120)
    assert r.status_code == 200


@pytest.mark.slow  # a second server and continuous batching's compiles: about a minute
def test_continuous_batching_server_concurrent_requests(model_dir):
    from concurrent.futures import ThreadPoolExecutor

    srv, base = _start(model_dir, continuous_batching=True, cb_num_blocks=32, cb_max_batch_tokens=64,
                       cb_use_cuda_graph=False)
    try:
        prompts = ["hello world", "this is a tiny", "a tiny model for a corpus"]

        def ask(p):
            r = httpx.post(base + "/v1/completions", timeout=300,
                           json={"model": model_dir, "prompt": p, "max_tokens": 6})
            assert r.status_code == 200, r.text
            return r.json()["choices"][0]["text"]

        with ThreadPoolExecutor(3) as pool:
            texts = list(pool.map(ask, prompts))
        assert texts == [_greedy(model_dir, text=p, n=6) for p in prompts]
        assert httpx.post(base + "/v1/completions", json={"prompt": None}, timeout=60).status_code == 400
    finally:
        srv.kill_server()
