"""topk on tied values, and the MoE model whose outputs it changed (issue 26.6).

transformers 5.23's AfmoeForCausalLM zero-initialises its router gate
(`_init_weights`), so a model built from a config scores every expert 0.5 and
`torch.topk` picks among exact ties. Which tied indices topk returns is
unspecified in PyTorch: CPU returns the order of libstdc++'s
std::nth_element/partial_sort (for 6 equal values, k=3: [3, 5, 4]); CUDA's
kernel gathers tied elements in index order. tpu returns the lowest indices
first (the order a stable descending sort gives), deterministically. The
values always equal CPU's; with a router that is not all ties the model
matches CPU.
"""
import copy

import pytest
import torch

import torchtpu  # noqa: F401


@pytest.mark.parametrize("largest", [True, False])
@pytest.mark.parametrize("k", [1, 2, 3])
def test_topk_ties_values_match_cpu_and_indices_are_lowest_first(k, largest):
    x = torch.tensor([[0.5] * 6, [0.5, 0.5, 0.5, 0.5, 0.7, 0.5], [1.0, 2, 2, 2, 1, 1]])
    got = torch.topk(x.to("tpu"), k, largest=largest)
    ref = torch.topk(x, k, largest=largest)
    torch.testing.assert_close(got.values.cpu(), ref.values)
    idx = got.indices.cpu()
    torch.testing.assert_close(x.gather(1, idx), ref.values)  # indices point at those values
    stable = torch.sort(x, dim=1, descending=largest, stable=True).indices[:, :k]
    assert torch.equal(idx, stable), (idx, stable)


def _afmoe(zero_router: bool):
    transformers = pytest.importorskip("transformers")
    if not hasattr(transformers, "AfmoeConfig"):
        pytest.skip("transformers has no Afmoe")
    cfg = transformers.AfmoeConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
                                   num_experts=4, num_experts_per_tok=2, intermediate_size=64,
                                   moe_intermediate_size=32, vocab_size=128, head_dim=8)
    cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    m = transformers.AfmoeForCausalLM(cfg).eval()
    if not zero_router:
        with torch.no_grad():
            for mod in m.modules():
                if type(mod).__name__ == "AfmoeTokenChoiceRouter":
                    mod.gate.weight.normal_(0, 0.5)
    return m


def test_afmoe_matches_cpu_with_a_router_that_is_not_all_ties():
    m = _afmoe(zero_router=False)
    t = copy.deepcopy(m).to("tpu")
    ids = torch.randint(0, 128, (2, 8), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(t(ids.to("tpu")).logits.cpu(), m(ids).logits, atol=1e-5, rtol=1e-4)


def test_afmoe_zero_router_routes_to_the_lowest_experts():
    """A config-built Afmoe ties every expert: tpu routes each token to experts
    0..k-1 (CPU to others), and the layer's output equals CPU's for that routing."""
    m = _afmoe(zero_router=True)
    moe = m.model.layers[1].mlp
    h = torch.randn(1, 8, 32, generator=torch.Generator().manual_seed(1))
    _, scores, experts = copy.deepcopy(moe.router).to("tpu")(h.to("tpu"), moe.expert_bias.to("tpu"))
    assert torch.equal(experts.cpu(), torch.tensor([[0, 1]] * 8))
    with torch.no_grad():
        ref = moe.experts(h[0], experts.cpu(), scores.cpu())
        got = copy.deepcopy(moe.experts).to("tpu")(h[0].to("tpu"), experts, scores)
    torch.testing.assert_close(got.cpu(), ref, atol=1e-6, rtol=1e-5)
