"""Module.to / param.data across cpu and tpu keep Parameter identity, as on CUDA.

Tied weights (an embedding shared with the output projection: GPT-2, BERT,
T5, Gemma, small Llama/Qwen) rely on `nn.Module._apply` rebinding each
Parameter's data in place (`param.data = moved`), which it does only when
`torch._has_compatible_shallow_copy_type(cpu, tpu)` holds. Without it each
module gets its own new Parameter and the embedding silently trains on its
own gradient only.
"""
import copy

import pytest
import torch
import torch.nn as nn


class TiedLM(nn.Module):
    def __init__(self, vocab=11, dim=8):
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.mid = nn.Linear(dim, dim)
        self.head = nn.Linear(dim, vocab, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, ids):
        return self.head(torch.tanh(self.mid(self.emb(ids))))


def _train(model, device, steps=3):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(0)
    losses = []
    for _ in range(steps):
        ids = torch.randint(0, 11, (4, 5), generator=g)
        logits = model(ids.to(device))
        loss = nn.functional.cross_entropy(logits.reshape(-1, 11), ids.to(device).reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def test_shallow_copy_compatible_with_cpu():
    cpu, tpu = torch.zeros(2), torch.zeros(2, device="tpu")
    assert torch._has_compatible_shallow_copy_type(cpu, tpu)
    assert torch._has_compatible_shallow_copy_type(tpu, cpu)
    assert torch._has_compatible_shallow_copy_type(tpu, tpu)
    # Not for layouts or devices CUDA would refuse either.
    assert not torch._has_compatible_shallow_copy_type(torch.zeros(2, device="meta"), tpu)
    assert not torch._has_compatible_shallow_copy_type(torch.zeros(2).to_sparse(), tpu)


def test_tied_weights_stay_tied_and_train_like_cpu():
    torch.manual_seed(0)
    ref = TiedLM()
    m = copy.deepcopy(ref)
    assert m.head.weight is m.emb.weight
    m.to("tpu")
    assert m.head.weight is m.emb.weight
    assert m.emb.weight.device.type == "tpu"
    assert len(list(m.parameters())) == len(list(ref.parameters())) == 3
    got, want = _train(m, "tpu"), _train(ref, "cpu")
    torch.testing.assert_close(torch.tensor(got), torch.tensor(want), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(m.emb.weight.cpu(), ref.emb.weight, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(m.emb.weight.grad.cpu(), ref.emb.weight.grad, rtol=1e-5, atol=1e-5)
    # And back to the CPU: still one Parameter.
    m.to("cpu")
    assert m.head.weight is m.emb.weight and m.emb.weight.device.type == "cpu"


def test_param_data_assignment_and_grad_follow():
    p = nn.Parameter(torch.randn(3, 4))
    alias = p
    p.data = torch.ones(3, 4, device="tpu")
    assert alias.device.type == "tpu" and alias.requires_grad and alias.is_leaf
    (alias * 2).sum().backward()
    assert p.grad.device.type == "tpu"
    torch.testing.assert_close(p.grad.cpu(), torch.full((3, 4), 2.0))
    # Module.to moves an existing .grad with its parameter (set_data path).
    lin = nn.Linear(4, 2)
    lin(torch.randn(3, 4)).sum().backward()
    w, g = lin.weight, lin.weight.grad.clone()
    lin.to("tpu")
    assert lin.weight is w and lin.weight.grad.device.type == "tpu"
    torch.testing.assert_close(lin.weight.grad.cpu(), g)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_module_to_dtype_and_device_keeps_ties(dtype):
    m = TiedLM().to("tpu", dtype)
    assert m.head.weight is m.emb.weight and m.emb.weight.dtype == dtype
