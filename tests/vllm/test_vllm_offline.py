"""vLLM's offline ``LLM`` on torchtpu's "tpu" platform plugin (torchtpu/vllm, docs/vllm.md).

Needs vLLM 0.33 in the running environment (``bash tools/install_vllm.sh``, its own venv):
skipped otherwise, so the main test run (no vLLM) skips this file. Every engine runs in a
fresh subprocess (tests/vllm/tiny.py) in its own process group, killed at the end, bounded
in time. The tiny Llama and its tokenizer are built here from configs (no hub).
"""
import json
import os
import signal
import subprocess
import sys
import time

import pytest

pytest.importorskip("vllm")
# Without vLLM installed, "import vllm" finds this very directory (tests/vllm, a namespace
# package once tests/ is on sys.path); a real vLLM has vllm.v1.
pytest.importorskip("vllm.v1.attention.backend", reason="vLLM is not installed (bash tools/install_vllm.sh)")
transformers = pytest.importorskip("transformers")

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
import tiny  # noqa: E402

MAX_TOKENS = 16
PROMPTS = [
    "The quick brown fox",
    "Hello",
    "Paged attention reads keys and values through a block table and more",
    "A tiny",
    "Numbers: 0 1 2",
    "Continuous batching schedules many",
]
# The two prompts share their first 40+ tokens: prefix-cache hits (block size 16).
SHARED = "Paged attention reads keys and values through a block table. " * 4
PREFIX_PROMPTS = [SHARED + "The quick brown fox", SHARED + "Hello world!"]
LLM_KWARGS = dict(dtype="float32", enforce_eager=True, max_model_len=128, max_num_seqs=4,
                  max_num_batched_tokens=128, gpu_memory_utilization=0.3, seed=0)
GREEDY = dict(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True)


def _has_entry_point() -> bool:
    import importlib.metadata as md

    return any(e.value == "torchtpu.vllm:register" for e in md.entry_points(group="vllm.platform_plugins"))


pytestmark = pytest.mark.skipif(
    not _has_entry_point(),
    reason="vllm.platform_plugins entry point torchtpu.vllm:register missing: pip-install torchtpu, "
           "or run tools/install_vllm.sh for a source tree on PYTHONPATH")


def _env(multiprocessing: bool = False, mode: str = "strict") -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TORCH_DEVICE_BACKEND_AUTOLOAD="0",
               TORCHTPU_MEMORY_LIMIT="256M", VLLM_ENABLE_V1_MULTIPROCESSING="1" if multiprocessing else "0",
               VLLM_NO_USAGE_STATS="1", DO_NOT_TRACK="1", TORCHTPU_MODE=mode)
    env.pop("VLLM_TARGET_DEVICE", None)  # "cpu" would bypass platform plugins
    return env


def run_llm(tmp_path, spec: dict, multiprocessing: bool = False, timeout: int = 420,
            mode: str = "strict", extra_env: dict | None = None) -> dict:
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(spec))
    log = tmp_path / "llm.log"
    env = _env(multiprocessing, mode)
    env["VLLM_CACHE_ROOT"] = str(tmp_path / "vllm_cache")  # vLLM's compile cache: not in ~/.cache
    env.update(extra_env or {})
    # Output to a file, not a pipe: the engine core process (multiprocessing mode) inherits it
    # and outlives the driver until the process group is killed below.
    with open(log, "w") as f:
        proc = subprocess.Popen([sys.executable, os.path.join(HERE, "tiny.py"), "run", str(path)],
                                env=env, cwd=str(tmp_path), stdout=f,
                                stderr=subprocess.STDOUT, text=True, start_new_session=True)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            pass
        finally:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()
    out = log.read_text()
    lines = [ln for ln in out.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, f"vLLM run failed (rc={proc.returncode}):\n{out[-8000:]}"
    return json.loads(lines[-1][len("RESULT "):])


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    d = str(tmp_path_factory.mktemp("tiny-llama"))
    model, tok = tiny.make_llama(d)
    return d, model, tok


def test_platform_resolves():
    code = ("from vllm.platforms import current_platform as p\n"
            "print('PLATFORM', type(p).__qualname__, p.device_type, p.dispatch_key, p.dist_backend, "
            "p.is_out_of_tree())\n")
    r = subprocess.run([sys.executable, "-c", code], env=_env(), capture_output=True, text=True, timeout=300)
    line = [ln for ln in r.stdout.splitlines() if ln.startswith("PLATFORM")]
    assert line, r.stdout[-3000:] + r.stderr[-3000:]
    assert line[0].split()[1:] == ["TpuPlatform", "tpu", "PrivateUse1", "tpu", "True"]


@pytest.mark.parametrize("mode", ["strict", "defer_and_fuse"])
def test_greedy_matches_hf_fp32(tmp_path, llama, mode):
    """Prompts of different lengths, more of them than max_num_seqs (continuous batching),
    in torchtpu's strict and defer_and_fuse eager modes."""
    d, model, tok = llama
    ref = tiny.hf_greedy(model, tok, PROMPTS, MAX_TOKENS)
    res = run_llm(tmp_path, {"model": d, "batches": [PROMPTS], "llm_kwargs": LLM_KWARGS, "sampling": GREEDY},
                  mode=mode)
    assert res["platform"] == "TpuPlatform"
    b = res["batches"][0]
    assert b["prompt_token_ids"] == [tok(p)["input_ids"] for p in PROMPTS]
    assert b["token_ids"] == ref
    assert res["cpu_fallbacks"] == {}, res["cpu_fallbacks"]
    assert res["native_executions"] > 0


@pytest.mark.parametrize("mode,graph", [("strict", "full"), ("defer_and_fuse", "full"), ("strict", "piecewise")])
def test_compiled_steps(tmp_path, llama, mode, graph):
    """enforce_eager=False: vLLM's own torch.compile with torchtpu's compiler, steps padded to
    vLLM's capture sizes (1, 2, 4, ..., 128 = max_num_batched_tokens: 8 buckets). The same
    prompts four times on one engine: HF's tokens every time and no new program while serving.

    full (the default): the whole model one graph, its attention torchtpu's paged ops with the
    step's metadata as inputs: one program per bucket, three programs per step. piecewise (splitting_ops given): vLLM's
    graph split at the attention ops (a 2-layer model: 3 pieces), attention eager between."""
    d, model, tok = llama
    ref = tiny.hf_greedy(model, tok, PROMPTS, MAX_TOKENS)
    cc = {}
    if graph == "piecewise":  # vLLM's attention ops (all of them, as vLLM requires) as split points
        from vllm.config import CompilationConfig

        cc = {"splitting_ops": CompilationConfig._attention_ops + ["vllm::unified_kv_cache_update"]}
    res = run_llm(tmp_path, {"model": d, "batches": [PROMPTS] * 4,
                             "llm_kwargs": dict(LLM_KWARGS, enforce_eager=False, compilation_config=cc),
                             "sampling": GREEDY}, mode=mode)
    for b in res["batches"]:
        assert b["token_ids"] == ref
        assert b["piece_programs"] == 0, [x["piece_programs"] for x in res["batches"]]
    comp = res["vllm_compiler"]
    pieces = 1 if graph == "full" else 3
    assert comp["pieces"] == pieces and comp["full_graphs"] == (graph == "full"), comp
    assert comp["programs"] == pieces * 8, comp
    assert comp["calls"] > pieces * 4 * MAX_TOKENS, comp
    # the eager parts (input preparation, sampler; attention when piecewise) have seen every
    # shape by then
    assert res["batches"][-1]["compiles"] == 0, [b["compiles"] for b in res["batches"]]
    if graph == "full":
        # a step: the runner's input preparation, the model, logits and sampler (the step's
        # eager work fused by defer_and_fuse whatever the process's mode); one model call per step
        assert comp["eager_calls"] <= 2, comp  # vLLM's profiling runs only
        for b in res["batches"][1:]:
            assert b["executions"] <= 3 * b["model_calls"], (b["executions"], b["model_calls"])
    assert res["cpu_fallbacks"] == {}, res["cpu_fallbacks"]


def test_long_prompt_through_many_blocks(tmp_path):
    """A 2,000-token prompt (125 blocks of 16), prefilled in chunks of 128 tokens over earlier
    chunks' cached blocks, then decoded: HF's greedy tokens, in compiled full-graph steps (eager
    steps run the same op: tests/test_paged_attention.py)."""
    import torch

    d = str(tmp_path / "llama-long")
    model, tok = tiny.make_llama_long(d)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, model.config.vocab_size, (2000,), generator=g).tolist()
    with torch.no_grad():
        ref = model.generate(torch.tensor([ids]), max_new_tokens=MAX_TOKENS, min_new_tokens=MAX_TOKENS,
                             do_sample=False, eos_token_id=None, pad_token_id=tok.pad_token_id)[0, len(ids):].tolist()
    res = run_llm(tmp_path, {"model": d, "batches": [[{"prompt_token_ids": ids}]],
                             "llm_kwargs": dict(LLM_KWARGS, enforce_eager=False, max_model_len=2048 + 64,
                                                enable_prefix_caching=False),
                             "sampling": GREEDY})
    assert res["batches"][0]["token_ids"] == [ref]


def test_chunked_prefill_and_prefix_cache(tmp_path, llama):
    """Prefill in chunks of 16 tokens; the second generate call hits the prefix cache."""
    d, model, tok = llama
    ref = tiny.hf_greedy(model, tok, PREFIX_PROMPTS, MAX_TOKENS)
    n_shared = len(tok(SHARED)["input_ids"])
    assert n_shared >= 32 and all(len(tok(p)["input_ids"]) > n_shared + 2 for p in PREFIX_PROMPTS)
    kwargs = dict(LLM_KWARGS, max_num_batched_tokens=16, max_num_seqs=2, enable_prefix_caching=True,
                  enable_chunked_prefill=True, disable_log_stats=False)
    res = run_llm(tmp_path, {"model": d, "batches": [PREFIX_PROMPTS[:1], PREFIX_PROMPTS[1:]],
                             "llm_kwargs": kwargs, "sampling": GREEDY})
    first, second = res["batches"]
    assert first["token_ids"] + second["token_ids"] == ref
    assert first["num_cached_tokens"] == [0]
    assert second["num_cached_tokens"][0] >= 32  # whole shared blocks came from the cache
    assert res["counters"]["vllm:prefix_cache_hits"] >= 32  # vLLM's own stats
    assert res["cpu_fallbacks"] == {}, res["cpu_fallbacks"]


def test_preemption_small_kv_cache(tmp_path, llama):
    """5 usable KV blocks of 16 tokens for 4 running requests of up to 30 tokens: vLLM preempts
    (its own counter says so) and recomputes; the tokens still equal HF's."""
    d, model, tok = llama
    ref = tiny.hf_greedy(model, tok, PROMPTS, MAX_TOKENS)
    kwargs = dict(LLM_KWARGS, num_gpu_blocks_override=6, max_model_len=64, disable_log_stats=False)
    res = run_llm(tmp_path, {"model": d, "batches": [PROMPTS], "llm_kwargs": kwargs, "sampling": GREEDY})
    assert res["counters"]["vllm:num_preemptions"] >= 1
    assert res["batches"][0]["token_ids"] == ref


def test_greedy_bf16_near_hf(tmp_path, llama):
    """bfloat16: rounding may flip a near-tie, so each greedy token is checked against the fp32
    Hugging Face logits of its own prefix (teacher forcing): it must be a (near-)argmax."""
    import torch

    d, model, tok = llama
    res = run_llm(tmp_path, {"model": d, "batches": [PROMPTS],
                             "llm_kwargs": dict(LLM_KWARGS, dtype="bfloat16"), "sampling": GREEDY})
    b = res["batches"][0]
    for p_ids, g in zip(b["prompt_token_ids"], b["token_ids"]):
        assert len(g) == MAX_TOKENS
        with torch.no_grad():
            logits = model(torch.tensor([p_ids + g])).logits[0, len(p_ids) - 1:-1]
        gap = logits.max(-1).values - logits[torch.arange(len(g)), torch.tensor(g)]
        assert gap.max().item() < 0.1, (gap, logits.std())
    assert res["cpu_fallbacks"] == {}, res["cpu_fallbacks"]


def test_seeded_sampling_reproducible(tmp_path, llama):
    """temperature/top-k/top-p with a per-request seed: the same tokens on a second call."""
    d, _, _ = llama
    sampling = dict(temperature=1.0, top_k=50, top_p=0.9, seed=1234, max_tokens=8, ignore_eos=True)
    res = run_llm(tmp_path, {"model": d, "batches": [PROMPTS[:2], PROMPTS[:2]], "llm_kwargs": LLM_KWARGS,
                             "sampling": sampling})
    first, second = res["batches"]
    assert first["token_ids"] == second["token_ids"]
    assert all(len(t) == 8 for t in first["token_ids"])


def test_engine_core_process(tmp_path, llama):
    """vLLM's default: the engine core in its own (spawned) process."""
    d, model, tok = llama
    prompts = PROMPTS[:3]
    ref = tiny.hf_greedy(model, tok, prompts, MAX_TOKENS)
    res = run_llm(tmp_path, {"model": d, "batches": [prompts], "llm_kwargs": LLM_KWARGS, "sampling": GREEDY},
                  multiprocessing=True)
    assert res["batches"][0]["token_ids"] == ref


def test_unsupported_dtype_is_named(tmp_path, llama):
    d, _, _ = llama
    path = tmp_path / "spec.json"
    path.write_text(json.dumps({"model": d, "batches": [["Hello"]],
                                "llm_kwargs": dict(LLM_KWARGS, dtype="float64"), "sampling": GREEDY}))
    r = subprocess.run([sys.executable, os.path.join(HERE, "tiny.py"), "run", str(path)], env=_env(),
                       capture_output=True, text=True, timeout=300, cwd=str(tmp_path))
    assert r.returncode != 0
    assert "float64" in (r.stdout + r.stderr)


def _processes_with(marker: str) -> list[int]:
    """Live processes whose environment carries marker (TORCHTPU_TEST_MARK)."""
    pids = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/environ", "rb") as f:
                    if f"TORCHTPU_TEST_MARK={marker}".encode() in f.read():
                        pids.append(int(d))
            except OSError:
                pass
    return pids


@pytest.mark.parametrize("eager", [pytest.param(True, marks=pytest.mark.slow), False], ids=["eager", "compiled"])
def test_tensor_parallel_2(tmp_path, llama, eager):
    """tensor_parallel_size=2: vLLM's multiprocess executor starts two tpu workers joined by
    torchtpu's c10d backend ("tpu"); vLLM's column/row-parallel layers all-reduce and all-gather
    through it (its default device communicator over torch.distributed). HF's tokens, every op
    native in both workers, and no process left once the run ends."""
    import uuid

    d, model, tok = llama
    ref = tiny.hf_greedy(model, tok, PROMPTS, MAX_TOKENS)
    mark = uuid.uuid4().hex
    res = run_llm(tmp_path, {"model": d, "batches": [PROMPTS, PROMPTS], "worker_report": True,
                             "llm_kwargs": dict(LLM_KWARGS, enforce_eager=eager, tensor_parallel_size=2),
                             "sampling": GREEDY}, extra_env={"TORCHTPU_TEST_MARK": mark})
    for b in res["batches"]:
        assert b["token_ids"] == ref
    workers = res["workers"]
    assert [w["rank"] for w in workers] == [0, 1], workers
    for w in workers:
        assert w["backend"] == "tpu" and w["device"].startswith("tpu"), w
        assert w["cpu_fallbacks"] == {}, w
        assert w["native_executions"] > 0, w
    # the driver's process group was SIGKILLed: its workers are gone once the kernel reaps them
    deadline = time.monotonic() + 15
    while _processes_with(mark) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _processes_with(mark) == []


JSON_SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 8},
                                                "age": {"type": "integer"}},
               "required": ["name", "age"], "additionalProperties": False}


def test_structured_output_json_schema(tmp_path, llama):
    """JSON-schema structured output (vLLM's xgrammar backend: the grammar on the host, its
    token bitmask applied to the logits on tpu by xgrammar's torch.compile kernel, which
    torchtpu's Inductor registration lowers): the tokens of HF greedy decoding on CPU under the
    same xgrammar matcher, and text that parses to the schema's fields."""
    d, model, tok = llama
    prompts = PROMPTS[:3]
    max_tokens = 48
    ref = [tiny.xgrammar_json_greedy(model, tok, p, JSON_SCHEMA, max_tokens) for p in prompts]
    sampling = dict(temperature=0, max_tokens=max_tokens, structured_outputs={"json": JSON_SCHEMA})
    res = run_llm(tmp_path, {"model": d, "batches": [prompts], "llm_kwargs": LLM_KWARGS, "sampling": sampling})
    b = res["batches"][0]
    assert b["token_ids"] == ref
    finished = 0
    for (c,) in b["outputs"]:
        if c["finish_reason"] == "stop":  # the grammar completed: the text is the object
            obj = json.loads(c["text"], strict=False)  # the tiny vocabulary yields control chars
            assert set(obj) == {"name", "age"} and isinstance(obj["age"], int), c["text"]
            assert isinstance(obj["name"], str) and len(obj["name"]) <= 8
            finished += 1
        else:
            assert c["text"].lstrip().startswith("{"), c["text"]
    assert finished >= 1, b["outputs"]
    assert res["cpu_fallbacks"] == {}, res["cpu_fallbacks"]


@pytest.mark.parametrize("eager", [True, False], ids=["eager", "compiled"])
def test_lora_adapters(tmp_path, llama, eager):
    """enable_lora: two PEFT adapters (q, v, down projections) and the base model mixed in one
    batch (vLLM's punica wrapper over its pure-torch LoRA ops, on tpu); each request's tokens
    equal HF CPU's greedy tokens of the base model with that adapter merged. With compilation
    asked for, the platform runs eager steps (the ops branch on per-step metadata a compiled
    piece would freeze: that gave wrong tokens) and builds no piece."""
    d, model, tok = llama
    adapters = {name: (str(tmp_path / f"lora_{name}"), tiny.make_lora(str(tmp_path / f"lora_{name}"), model, seed))
                for name, seed in (("a", 1), ("b", 2))}
    plan = ["a", "b", None, "a"]
    prompts = PROMPTS[:4]
    ref = [tiny.hf_greedy(adapters[n][1] if n else model, tok, [p], MAX_TOKENS)[0] for n, p in zip(plan, prompts)]
    ids = {"a": 1, "b": 2}
    res = run_llm(tmp_path, {"model": d, "batches": [prompts, prompts],
                             "llm_kwargs": dict(LLM_KWARGS, enforce_eager=eager, enable_lora=True, max_loras=2,
                                                max_lora_rank=8),
                             "lora": [[n, ids[n], adapters[n][0]] if n else None for n in plan],
                             "sampling": GREEDY})
    for b in res["batches"]:
        assert b["token_ids"] == ref
    assert not (res["vllm_compiler"] or {}).get("programs"), res["vllm_compiler"]  # no piece at all
    assert res["cpu_fallbacks"] == {}, res["cpu_fallbacks"]
