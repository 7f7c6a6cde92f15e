"""torch.compile of transformers' MoE models on tpu in every dtype.

transformers 5.23 routes tpu tensors to torch._grouped_mm under
torch.compile for every dtype (integrations/moe.py, _can_use_grouped_mm);
torch's fake-tensor meta for it accepts only bf16 (2.13) or bf16/f16 (2.14),
CUDA's limits. torchtpu's fake rule (torchtpu/compile/fake.py) covers tpu
tensors; CPU tensors keep torch's own meta kernel.
"""
import copy

import pytest
import torch

import torchtpu

transformers = pytest.importorskip("transformers")

TOL = {torch.float32: (2e-5, 1e-4), torch.bfloat16: (3e-2, 3e-2), torch.float16: (5e-3, 5e-3)}


def _model(kind, dtype):
    torch.manual_seed(0)
    if kind == "mixtral":
        cfg = transformers.MixtralConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2, num_local_experts=4,
                                         num_experts_per_tok=2, max_position_embeddings=64)
        m = transformers.MixtralForCausalLM(cfg)
    else:
        cfg = transformers.Qwen3MoeConfig(vocab_size=64, hidden_size=32, intermediate_size=64, moe_intermediate_size=32,
                                          num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                          num_experts=4, num_experts_per_tok=2, head_dim=8, max_position_embeddings=64)
        m = transformers.Qwen3MoeForCausalLM(cfg)
    return m.to(dtype)


@pytest.mark.parametrize("kind,dtype", [("mixtral", torch.float32), ("mixtral", torch.bfloat16),
                                        ("mixtral", torch.float16), ("qwen3_moe", torch.float32)])
def test_compiled_moe_forward_and_training_step_match_cpu(kind, dtype):
    cpu = _model(kind, dtype)
    tpu = copy.deepcopy(cpu).to("tpu")
    before = torchtpu.metrics()["compile"]
    step = torch.compile(tpu, backend="tpu", dynamic=False)
    ids = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(1))
    out = step(ids.to("tpu"), labels=ids.to("tpu"))
    ref = cpu(ids, labels=ids)
    atol, rtol = TOL[dtype]
    torch.testing.assert_close(out.logits.cpu(), ref.logits, atol=atol, rtol=rtol)
    out.loss.backward()
    ref.loss.backward()
    for p in (tpu, cpu):
        torch.optim.SGD(p.parameters(), lr=0.1).step()
    for (n, p), q in zip(tpu.named_parameters(), cpu.parameters()):
        torch.testing.assert_close(p.detach().cpu(), q.detach(), atol=atol, rtol=rtol, msg=n)
    after = torchtpu.metrics()["compile"]
    # forward and backward both compiled (no graph ran eagerly)
    assert after["graph_fallbacks"] == before["graph_fallbacks"], after["graph_fallback_reasons"]
    assert after["graphs_compiled"] - before["graphs_compiled"] >= 2


def test_cpu_fake_grouped_mm_keeps_torchs_meta():
    """CPU fake tensors get torch's meta kernel unchanged (its float32 verdict, bf16 shapes)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    import torchtpu.compile.fake as fake

    fake.register()
    with FakeTensorMode():
        a = torch.empty(8, 16, dtype=torch.bfloat16)
        b = torch.empty(2, 16, 32, dtype=torch.bfloat16).transpose(-2, -1).contiguous().transpose(-2, -1)
        offs = torch.tensor([3, 8], dtype=torch.int32)
        assert torch._grouped_mm(a, b, offs=offs).shape == (8, 32)
        # float32: whatever torch's own meta function says (torch 2.13/2.14 refuse
        # it, naming BF16; 2.15 accepts it)
        try:
            want = fake._torch_grouped_mm_meta()(a.float(), b.float(), offs, None, None)
        except RuntimeError as e:
            with pytest.raises(RuntimeError, match="BF16|BFloat16"):
                torch._grouped_mm(a.float(), b.float(), offs=offs)
            assert "BF16" in str(e) or "BFloat16" in str(e)
        else:
            got = torch._grouped_mm(a.float(), b.float(), offs=offs)
            assert got.shape == want.shape and got.dtype == want.dtype
    with FakeTensorMode():  # tpu fake tensors: every floating dtype
        a = torch.empty(8, 16, device="tpu")
        b = torch.empty(2, 16, 32, device="tpu")
        offs = torch.tensor([3, 8], dtype=torch.int32, device="tpu")
        out = torch._grouped_mm(a, b, offs=offs)
        assert out.shape == (8, 32) and out.dtype == torch.float32 and out.device.type == "tpu"


def test_torchtitan_deterministic_scatter_add_lowers_in_compiled_graphs():
    """torchtitan's MoE combine step is a custom op (torchtitan::deterministic_scatter_add):
    opaque to torch.compile, lowered as scatter_add along dim 0, forward and backward."""
    scatter = pytest.importorskip("torchtitan.ops.scatter_add").deterministic_scatter_add
    from torchtpu.compile import lower

    def combine(x, idx, src):
        return scatter(torch.zeros_like(x), idx.reshape(-1, 1).expand(-1, x.shape[1]), src * 2).square().sum()

    g = torch.Generator().manual_seed(0)
    x, src = torch.randn(6, 4, generator=g), torch.randn(9, 4, generator=g)
    idx = torch.randint(0, 6, (9,), generator=g)
    before = lower.metrics()["graph_fallbacks"]
    f = torch.compile(combine, backend="tpu", fullgraph=True)
    sd = src.to("tpu").requires_grad_()
    out = f(x.to("tpu"), idx.to("tpu"), sd)
    out.backward()
    sc = src.clone().requires_grad_()
    ref = combine(x, idx, sc)
    ref.backward()
    torch.testing.assert_close(out.cpu(), ref)
    torch.testing.assert_close(sd.grad.cpu(), sc.grad)
    assert lower.metrics()["graph_fallbacks"] == before  # forward and backward graphs lowered
