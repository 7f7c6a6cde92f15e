"""Static KV cache + torch.compile(backend="tpu") + bucketed prompts
(torchtpu.generation.StaticGenerator): the tokens of CPU greedy generation,
and after warm-up zero compiles per new token and per new prompt length
within a bucket."""
import pytest
import torch

import torchtpu
from torchtpu import generation

transformers = pytest.importorskip("transformers")


def llama_pair():
    """A tiny Llama on CPU and the same weights on tpu."""
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, vocab_size=128,
                                   max_position_embeddings=256, pad_token_id=0, eos_token_id=1)
    cpu = transformers.LlamaForCausalLM(cfg).eval()
    tpu = transformers.LlamaForCausalLM(cfg).eval()
    tpu.load_state_dict(cpu.state_dict())
    return cpu, tpu.to("tpu")


@pytest.fixture(scope="module")
def models():
    cpu, tpu = llama_pair()
    torch._dynamo.reset()
    gen = generation.StaticGenerator(tpu, buckets=(8, 16), max_cache_len=32)
    yield cpu, gen
    torch._dynamo.reset()


def prompts(batch, length, seed):
    return torch.randint(3, 128, (batch, length), generator=torch.Generator().manual_seed(seed))


def check(cpu, gen, ids, new):
    ref = cpu.generate(ids, max_new_tokens=new, do_sample=False)
    before = dict(torchtpu.metrics()["compile"])
    torchtpu.reset_metrics()
    out = gen.generate(ids.to("tpu"), max_new_tokens=new, do_sample=False)
    assert torch.equal(out.cpu(), ref)
    m = torchtpu.metrics()
    calls = m["compile"]["graph_calls"] - before["graph_calls"]
    # one prefill program, then one decode program per further token (fewer after an eos)
    assert calls == ref.shape[1] - ids.shape[1]
    return m["compiles"], m["compile"]["graphs_compiled"] - before["graphs_compiled"], calls


def test_bucket_helpers():
    assert [generation.bucket(n, generation.DEFAULT_BUCKETS) for n in (1, 16, 17, 300, 512)] == \
        [16, 16, 32, 512, 512]
    assert len({generation.bucket(n, generation.DEFAULT_BUCKETS) for n in range(1, 513)}) == 6
    assert [generation.batch_bucket(n) for n in (1, 2, 3, 5, 16)] == [1, 2, 4, 8, 16]
    ids, mask, extra, b = generation.pad_prompts(torch.tensor([[5, 6, 7]]), None, 0, (4, 8))
    assert ids.tolist() == [[0, 5, 6, 7]] and mask.tolist() == [[0, 1, 1, 1]] and (extra, b) == (1, 1)
    ids, mask, _, b = generation.pad_prompts(torch.ones(3, 2, dtype=torch.long), None, 0, (4,))
    assert ids.shape == (4, 4) and b == 3
    with pytest.raises(ValueError, match="exceeds the largest bucket"):
        generation.bucket(9, (4, 8))


def test_single_prompts_reuse_programs_within_a_bucket(models):
    cpu, gen = models
    check(cpu, gen, prompts(1, 5, 1), 6)  # warm-up: bucket 8, batch 1
    for length, seed in ((7, 2), (3, 3), (6, 4)):
        compiles, graphs, calls = check(cpu, gen, prompts(1, length, seed), 6)
        assert (compiles, graphs) == (0, 0), length
    compiles, graphs, calls = check(cpu, gen, prompts(1, 4, 5), 3)  # fewer tokens: same programs
    assert (compiles, graphs) == (0, 0)


def test_batches_are_padded_to_a_batch_bucket(models):
    cpu, gen = models
    ids = prompts(3, 12, 6)
    ids[0, :4] = 0  # the user's own left padding, with its mask
    mask = (ids != 0).long()
    ref = cpu.generate(ids, attention_mask=mask, max_new_tokens=5, do_sample=False)
    out = gen.generate(ids.to("tpu"), attention_mask=mask.to("tpu"), max_new_tokens=5, do_sample=False)
    assert torch.equal(out.cpu(), ref)
    torchtpu.reset_metrics()
    compiles, graphs, _ = check(cpu, gen, prompts(4, 10, 7), 5)  # batch 4, bucket 16: warm
    assert (compiles, graphs) == (0, 0)


def test_bad_requests_raise(models):
    _, gen = models
    with pytest.raises(ValueError, match="largest bucket"):
        gen.generate(prompts(1, 17, 8).to("tpu"), max_new_tokens=2)
    with pytest.raises(ValueError, match="max_cache_len"):
        gen.generate(prompts(1, 10, 8).to("tpu"), max_new_tokens=20)
    with pytest.raises(ValueError, match="set by the generator"):
        gen.generate(prompts(1, 4, 8).to("tpu"), max_new_tokens=2, cache_implementation="static")


def test_hf_static_cache_generate_after_warmup_compiles_nothing():
    """transformers' own generate with a static cache and a compiled forward: after
    one request under torchtpu.warmup() an identical request compiles nothing and
    loads nothing (every program comes from memory). Without it the host tier
    compiles the ops seen once per request on the second and third requests."""
    cpu, tpu = llama_pair()
    tpu.generation_config.cache_implementation = "static"
    torch._dynamo.reset()
    tpu.forward = torch.compile(tpu.forward, backend="tpu", dynamic=False)
    ids = prompts(2, 6, 7)
    ref = cpu.generate(ids, max_new_tokens=8, do_sample=False)

    def request():
        m0 = torchtpu.metrics()
        out = tpu.generate(ids.to("tpu"), max_new_tokens=8, do_sample=False)
        torch.tpu.synchronize()
        m1 = torchtpu.metrics()
        assert torch.equal(out.cpu(), ref)
        return m1["compiles"] - m0["compiles"] + m1["disk_cache_hits"] - m0["disk_cache_hits"]

    try:
        with torchtpu.warmup():
            request()
        assert request() == 0
        assert request() == 0
    finally:
        torch._dynamo.reset()
