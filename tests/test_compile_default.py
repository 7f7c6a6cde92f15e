"""torch.compile with the default backend (Inductor) on tpu tensors goes through
torchtpu's lowering (registered with Inductor for the "tpu" device), never
through Inductor's Pallas/JAX code generation."""
import sys
import warnings

import pytest
import torch
import torch.nn as nn

import torchtpu
from test_compile import _reset_dynamo, _stats  # noqa: F401  (an autouse fixture)


def test_default_compile_forward_backward_matches_cpu():
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.LayerNorm(16), nn.Linear(16, 4))
    x = torch.randn(5, 8)
    ref_x = x.clone().requires_grad_()
    ref = m(ref_x)
    ref.square().sum().backward()
    mt = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.LayerNorm(16), nn.Linear(16, 4))
    mt.load_state_dict(m.state_dict())
    mt = mt.to("tpu")
    before = _stats()
    cm = torch.compile(mt)  # no backend: Inductor
    xt = x.to("tpu").requires_grad_()
    out = cm(xt)
    out.square().sum().backward()
    after = _stats()
    assert out.device.type == "tpu"
    torch.testing.assert_close(out.cpu(), ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(xt.grad.cpu(), ref_x.grad, rtol=1e-5, atol=1e-5)
    for p, q in zip(mt.parameters(), m.parameters()):
        torch.testing.assert_close(p.grad.cpu(), q.grad, rtol=1e-5, atol=1e-5)
    assert after["graphs_compiled"] - before["graphs_compiled"] == 2  # forward and backward
    assert after["graph_fallbacks"] == before["graph_fallbacks"]
    assert after["graph_calls"] - before["graph_calls"] == 2
    assert "jax" not in sys.modules


def test_default_compile_softmax_backward_is_lowered():
    """Inductor decomposes softmax's backward into prims::fma (FLUX's attention in torchtitan
    met it): lowered as addcmul, no graph runs eagerly, gradients equal CPU's."""
    torch.manual_seed(0)
    q, k = torch.randn(2, 3, 6, 8), torch.randn(2, 3, 6, 8)

    def f(q, k):
        return torch.softmax(q @ k.transpose(-1, -2) / 8 ** 0.5, dim=-1).square().sum()

    ref_q = q.clone().requires_grad_()
    f(ref_q, k).backward()
    before = _stats()
    qt = q.to("tpu").requires_grad_()
    torch.compile(f)(qt, k.to("tpu")).backward()
    after = _stats()
    torch.testing.assert_close(qt.grad.cpu(), ref_q.grad, rtol=1e-5, atol=1e-6)
    assert after["graph_fallbacks"] == before["graph_fallbacks"]
    assert after["graphs_compiled"] - before["graphs_compiled"] == 2


def test_default_compile_buffer_mutation_and_cached_program(metrics):
    class Counter(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("total", torch.zeros(4))
            self.register_buffer("cache", torch.zeros(6, 4))

        def forward(self, x, pos):
            self.total.add_(x.sum(0))
            self.cache.index_copy_(0, pos, x)  # a static KV cache's update
            return self.cache.cumsum(0) * 2

    ref_m, m = Counter(), Counter().to("tpu")
    cm = torch.compile(m, fullgraph=True)
    for step in range(3):
        x = torch.randn(2, 4)
        pos = torch.tensor([2 * step, 2 * step + 1])
        ref = ref_m(x, pos)
        out = cm(x.to("tpu"), pos.to("tpu"))
        torch.testing.assert_close(out.cpu(), ref)
        if step == 0:
            torchtpu.reset_metrics()
    torch.testing.assert_close(m.total.cpu(), ref_m.total)
    torch.testing.assert_close(m.cache.cpu(), ref_m.cache)
    assert metrics()["compiles"] == 0  # steps 2 and 3 ran the cached program


def test_default_compile_graph_that_only_writes_its_input():
    """A compiled function returning nothing, writing its argument in place (xgrammar's
    torch.compile bitmask kernel, which vLLM's structured output runs on non-CUDA devices):
    the graph's op has no outputs (schema "-> ()") and must return None."""

    def mask_(logits, bitmask, vocab: int):
        bits = (torch.repeat_interleave(bitmask, 32, dim=-1)
                >> torch.arange(32, dtype=torch.int32, device=logits.device).repeat(bitmask.shape[-1])) & 1
        logits[..., :vocab].masked_fill_(bits[..., :vocab] == 0, float("-inf"))

    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 70, generator=g)
    bitmask = torch.randint(-2**31, 2**31 - 1, (3, 3), generator=g, dtype=torch.int32)
    ref = logits.clone()
    mask_(ref, bitmask, 70)
    out = logits.to("tpu")
    assert torch.compile(mask_, dynamic=False)(out, bitmask.to("tpu"), 70) is None
    torch.testing.assert_close(out.cpu(), ref)
    assert torch.isinf(ref).any() and not torch.isinf(ref).all()


def test_default_compile_unlowerable_graph_runs_eagerly():
    def f(x):
        return torch.special.zeta(x.abs() + 1.5, torch.full_like(x, 2.0)) * 3

    x = torch.rand(6) + 0.1
    before = _stats()
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        out = torch.compile(f)(x.to("tpu"))
    torch.testing.assert_close(out.cpu(), f(x))
    assert _stats()["graph_fallbacks"] == before["graph_fallbacks"] + 1
    assert any("running this graph eagerly" in str(m.message) for m in w)


def test_default_compile_dynamic_shapes_run_eagerly_and_correctly():
    def f(x):
        return (x * 2).softmax(-1)

    cf = torch.compile(f, dynamic=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for n in (3, 5):
            x = torch.randn(n, 4)
            torch.testing.assert_close(cf(x.to("tpu")).cpu(), f(x))


def test_default_compile_graph_returning_a_size():
    # A post-grad graph may return a SymInt next to its tensors (dynamic shapes): the size
    # stays an FX computation, the tensors come from the tpu call (was: AttributeError:
    # 'SymInt' object has no attribute 'shape' in the device pass).
    def f(x):
        return x * 2, x.shape[0] + 1

    cf = torch.compile(f, dynamic=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for n in (3, 5):
            x = torch.randn(n, 4)
            out, size = cf(x.to("tpu"))
            assert size == n + 1
            torch.testing.assert_close(out.cpu(), x * 2)


def test_default_compile_programs_are_not_reused_across_processes(pyrun, tmp_path):
    # Inductor's FX graph cache must not hand a second process wrapper code naming the
    # first process's lowered graphs: two same-shaped functions, compiled in opposite orders.
    code = """
import sys, torch, torchtpu
f = torch.compile(lambda x: x * 2 + 1)
g = torch.compile(lambda x: x * 3 - 1)
x = torch.arange(4.0, device="tpu")
order = [f, g] if "{first}" == "f" else [g, f]
outs = {{fn: fn(x).cpu().tolist() for fn in order}}
print(outs[f], outs[g])
"""
    env = {"TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")}
    for first in ("f", "g"):
        r = pyrun(code.format(first=first), env=env, timeout=300)
        assert r.returncode == 0, r.stderr[-3000:]
        assert r.stdout.split("\n")[-2] == "[1.0, 3.0, 5.0, 7.0] [-1.0, 2.0, 5.0, 8.0]", r.stdout


transformers = pytest.importorskip("transformers")


def _tiny(kind):
    torch.manual_seed(0)
    if kind == "llama":
        cfg = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                       num_attention_heads=4, num_key_value_heads=2, vocab_size=128,
                                       max_position_embeddings=256, pad_token_id=0, eos_token_id=1)
        return transformers.LlamaForCausalLM(cfg).eval()
    cfg = transformers.GPT2Config(n_embd=64, n_layer=2, n_head=4, vocab_size=128, n_positions=256,
                                  pad_token_id=0, eos_token_id=1)
    return transformers.GPT2LMHeadModel(cfg).eval()


@pytest.mark.parametrize("kind", ["llama", "gpt2"])
def test_generate_compile_model_forward_fullgraph(kind):
    # as transformers' test of the same name: the decode step compiled by generate with an
    # explicit CompileConfig (backend "inductor"), a static cache, fullgraph, no dynamic shapes
    cpu, tpu = _tiny(kind), _tiny(kind).to("tpu")
    ids = torch.randint(3, 128, (2, 6), generator=torch.Generator().manual_seed(1))
    kw = dict(max_new_tokens=6, do_sample=False, return_dict_in_generate=True, output_scores=True)
    ref = cpu.generate(ids, **kw)
    cc = transformers.CompileConfig(fullgraph=True, dynamic=False)
    before = _stats()
    for _ in range(2):
        out = tpu.generate(ids.to("tpu"), cache_implementation="static", compile_config=cc, **kw)
        assert torch.equal(out.sequences.cpu(), ref.sequences)
        for a, b in zip(out.scores, ref.scores):
            torch.testing.assert_close(a.cpu(), b, rtol=1e-4, atol=1e-4)
    after = _stats()
    assert hasattr(tpu, "_compiled_call")
    assert after["graphs_compiled"] - before["graphs_compiled"] == 1  # one decode graph
    assert after["graph_calls"] - before["graph_calls"] == 2 * 5  # every decode step ran it
    assert after["graph_fallbacks"] == before["graph_fallbacks"]


def test_generate_compilation_all_outputs():
    # as transformers' test of the same name: compiled generate returns every optional output
    cpu, tpu = _tiny("llama"), _tiny("llama").to("tpu")
    cpu.config._attn_implementation = tpu.config._attn_implementation = "eager"  # attentions
    ids = torch.randint(3, 128, (2, 5), generator=torch.Generator().manual_seed(2))
    kw = dict(max_new_tokens=4, do_sample=False, return_dict_in_generate=True, output_scores=True,
              output_logits=True, output_hidden_states=True, output_attentions=True,
              cache_implementation="static")
    ref = cpu.generate(ids, **kw)
    before = _stats()
    out = tpu.generate(ids.to("tpu"), compile_config=transformers.CompileConfig(), **kw)
    assert _stats()["graphs_compiled"] > before["graphs_compiled"]
    assert torch.equal(out.sequences.cpu(), ref.sequences)
    for name in ("scores", "logits"):
        for a, b in zip(getattr(out, name), getattr(ref, name)):
            torch.testing.assert_close(a.cpu(), b, rtol=1e-4, atol=1e-4)
    for name in ("hidden_states", "attentions"):
        got, want = getattr(out, name), getattr(ref, name)
        assert len(got) == len(want) == 4
        for step_a, step_b in zip(got, want):
            for a, b in zip(step_a, step_b):
                torch.testing.assert_close(a.cpu(), b, rtol=1e-4, atol=1e-4)
    assert isinstance(out.past_key_values, transformers.StaticCache)


def test_generate_compiled_mistral_static_cache():
    # transformers' test_generate_compilation_all_outputs / test_static_cache_no_recompile_*
    # on Mistral: the decode step, recompiled with dynamic shapes, returns a SymInt.
    torch.manual_seed(0)
    cfg = transformers.MistralConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                     num_attention_heads=4, num_key_value_heads=2, vocab_size=128,
                                     max_position_embeddings=256, pad_token_id=0, eos_token_id=1,
                                     sliding_window=4)
    cpu = transformers.MistralForCausalLM(cfg).eval()
    tpu = transformers.MistralForCausalLM(cfg).eval()
    tpu.load_state_dict(cpu.state_dict())
    tpu = tpu.to("tpu")
    ids = torch.randint(3, 128, (2, 5), generator=torch.Generator().manual_seed(2))
    kw = dict(max_new_tokens=4, do_sample=False, return_dict_in_generate=True, output_scores=True,
              cache_implementation="static")
    ref = cpu.generate(ids, **kw)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = tpu.generate(ids.to("tpu"), compile_config=transformers.CompileConfig(), **kw)
    assert torch.equal(out.sequences.cpu(), ref.sequences)
    for a, b in zip(out.scores, ref.scores):
        torch.testing.assert_close(a.cpu(), b, rtol=1e-4, atol=1e-4)
