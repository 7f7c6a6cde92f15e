"""Hugging Face `model.generate` on tpu, against the same model on the CPU.

Tiny Llama and GPT-2 models built from configs (no hub): greedy search with
left-padded batches, logits processors, stopping criteria, beam search, and
sampling (reproducible under a seed; its distribution against the CPU
model's probabilities).
"""
import pytest
import torch

transformers = pytest.importorskip("transformers")

PAD, EOS, BOS = 0, 1, 2


def tiny_llama():
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, vocab_size=128,
                                   max_position_embeddings=256, pad_token_id=PAD, eos_token_id=EOS,
                                   bos_token_id=BOS)
    return transformers.LlamaForCausalLM(cfg).eval()


def tiny_gpt2():
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_embd=64, n_layer=2, n_head=4, vocab_size=128, n_positions=256,
                                  pad_token_id=PAD, eos_token_id=EOS, bos_token_id=BOS)
    return transformers.GPT2LMHeadModel(cfg).eval()


MODELS = {"llama": tiny_llama, "gpt2": tiny_gpt2}


@pytest.fixture(scope="module", params=list(MODELS))
def models(request):
    make = MODELS[request.param]
    return make(), make().to("tpu")


def left_padded(lengths, seed=1):
    """A batch of prompts of the given lengths, left-padded, and its attention mask."""
    g = torch.Generator().manual_seed(seed)
    n = max(lengths)
    ids = torch.full((len(lengths), n), PAD)
    mask = torch.zeros((len(lengths), n), dtype=torch.long)
    for i, k in enumerate(lengths):
        ids[i, n - k:] = torch.randint(3, 128, (k,), generator=g)
        mask[i, n - k:] = 1
    return ids, mask


def both(cpu_model, tpu_model, ids, mask=None, **kw):
    ref = cpu_model.generate(ids, attention_mask=mask, **kw)
    out = tpu_model.generate(ids.to("tpu"), attention_mask=None if mask is None else mask.to("tpu"), **kw)
    return ref, out


def test_greedy_left_padded_batch_matches_cpu(models):
    cpu, tpu = models
    ids, mask = left_padded([3, 7, 5])  # every test: batch 3, width 7 (programs are shared)
    ref, out = both(cpu, tpu, ids, mask, max_new_tokens=8, do_sample=False)
    assert out.device.type == "tpu"
    assert out.shape == (3, 7 + 8)
    assert torch.equal(out.cpu(), ref)
    # padding is honoured: each row equals its prompt generated alone
    alone = tpu.generate(ids[:1, 4:].to("tpu"), max_new_tokens=8, do_sample=False).cpu()
    assert torch.equal(alone[0], out.cpu()[0, 4:])


def test_greedy_scores_and_logits_processors_match_cpu(models):
    cpu, tpu = models
    ids, mask = left_padded([4, 7, 6], seed=2)
    kw = dict(max_new_tokens=6, do_sample=False, repetition_penalty=1.3, no_repeat_ngram_size=2,
              return_dict_in_generate=True, output_scores=True)
    ref, out = both(cpu, tpu, ids, mask, **kw)
    assert torch.equal(out.sequences.cpu(), ref.sequences)
    assert len(out.scores) == len(ref.scores) == 6
    for a, b in zip(out.scores, ref.scores):
        fin = torch.isfinite(b)
        assert torch.equal(torch.isfinite(a.cpu()), fin)  # the same tokens banned
        torch.testing.assert_close(a.cpu()[fin], b[fin], rtol=1e-4, atol=1e-4)


class StopAfter(transformers.StoppingCriteria):
    """A user's criterion on the device's tensors: row i is done after limits[i] new tokens."""

    def __init__(self, limits, prompt_len):
        self.limits, self.prompt_len = torch.tensor(limits), prompt_len

    def __call__(self, input_ids, scores, **kwargs):
        return (input_ids.shape[1] - self.prompt_len) >= self.limits.to(input_ids.device)


def test_stopping_criteria_match_cpu(models):
    cpu, tpu = models
    ids, mask = left_padded([7, 5, 3], seed=3)
    free = cpu.generate(ids, attention_mask=mask, max_new_tokens=10, do_sample=False)
    new = free[:, ids.shape[1]:]
    # an eos that row 0 produces at its 3rd new token: rows end at different lengths
    eos = int(new[0, 2])
    ref, out = both(cpu, tpu, ids, mask, max_new_tokens=10, do_sample=False, eos_token_id=eos)
    assert torch.equal(out.cpu(), ref)
    assert ref.shape[1] <= ids.shape[1] + 10
    assert (ref[0, ids.shape[1] + 3:] == PAD).all()
    # a custom criterion ending the rows after 2, 5 and 4 new tokens: rows finished early get pad
    crit = transformers.StoppingCriteriaList([StopAfter([2, 5, 4], ids.shape[1])])
    ref, out = both(cpu, tpu, ids, mask, max_new_tokens=10, do_sample=False, stopping_criteria=crit)
    assert torch.equal(out.cpu(), ref)
    assert ref.shape[1] == ids.shape[1] + 5 and (ref[0, ids.shape[1] + 2:] == PAD).all()


def test_beam_search_matches_cpu(models):
    cpu, tpu = models
    ids, mask = left_padded([7], seed=4)  # 3 beams: the shapes of a batch of 3
    kw = dict(max_new_tokens=8, num_beams=3, num_return_sequences=2, do_sample=False, length_penalty=0.8,
              return_dict_in_generate=True, output_scores=True)
    ref, out = both(cpu, tpu, ids, mask, **kw)
    assert out.sequences.shape == (2, ids.shape[1] + 8)
    assert torch.equal(out.sequences.cpu(), ref.sequences)
    torch.testing.assert_close(out.sequences_scores.cpu(), ref.sequences_scores, rtol=1e-4, atol=1e-5)


def test_sampling_is_seeded_and_respects_top_k(models):
    cpu, tpu = models
    ids, mask = left_padded([7, 6, 7], seed=5)
    kw = dict(max_new_tokens=8, do_sample=True, top_k=4, temperature=0.9)
    runs = []
    for seed in (0, 0, 1):
        torch.manual_seed(seed)
        runs.append(tpu.generate(ids.to("tpu"), attention_mask=mask.to("tpu"), **kw).cpu())
    assert torch.equal(runs[0], runs[1])
    assert not torch.equal(runs[0], runs[2])
    # every sampled token is among the CPU model's top 4 for its prefix
    seqs = torch.cat([runs[0], runs[2]])
    full = torch.cat([mask, torch.ones(3, 8, dtype=torch.long)], 1).repeat(2, 1)
    pos = (full.cumsum(-1) - 1).clamp(min=0)
    logits = cpu(seqs, attention_mask=full, position_ids=pos).logits[:, ids.shape[1] - 1:-1]
    top = logits.topk(4, dim=-1).indices
    new = seqs[:, ids.shape[1]:]
    after_eos = (new == EOS).long().cumsum(-1) - (new == EOS).long() > 0  # pad after a row's eos
    assert ((top == new.unsqueeze(-1)).any(-1) | after_eos).all()
    assert (new[after_eos] == PAD).all()


def test_sampling_distribution_matches_cpu_probabilities(models):
    cpu, tpu = models
    n, k, temp = 512, 6, 0.8
    prompt = torch.randint(3, 128, (1, 5), generator=torch.Generator().manual_seed(6))
    torch.manual_seed(0)
    out = tpu.generate(prompt.expand(n, 5).contiguous().to("tpu"), max_new_tokens=1, do_sample=True,
                       top_k=k, temperature=temp, top_p=1.0).cpu()[:, -1]
    logits = cpu(prompt).logits[0, -1] / temp
    top = logits.topk(k)
    probs = torch.zeros(128).index_put_((top.indices,), top.values.softmax(-1))
    freq = torch.bincount(out, minlength=128).float() / n
    assert freq[probs == 0].sum() == 0  # nothing outside the top k
    tv = 0.5 * (freq - probs).abs().sum().item()
    assert tv < 0.08, (tv, probs[top.indices], freq[top.indices])


def test_isin_runs_natively_and_matches_cpu(metrics):
    # generate checks its eos/pad tokens with torch.isin
    e = torch.tensor([[1, 5, 7], [2, 2, 9]])
    cases = [(e, torch.tensor([2, 7, 11])), (e, torch.tensor([[9], [1]])), (e, torch.tensor([], dtype=torch.long)),
             (e, torch.tensor([7.0, 2.5])), (e.float() + 0.5, torch.tensor([5, 2])), (e, 9), (7, e),
             (torch.tensor(3), torch.tensor([3, 4]))]
    for a, b in cases:
        for invert in (False, True):
            ref = torch.isin(a, b, invert=invert)
            out = torch.isin(a.to("tpu") if isinstance(a, torch.Tensor) else a,
                             b.to("tpu") if isinstance(b, torch.Tensor) else b, invert=invert)
            assert out.device.type == "tpu" and out.dtype == torch.bool
            assert torch.equal(out.cpu(), ref), (a, b, invert)
    assert not any("isin" in k for k in metrics()["cpu_fallbacks"])


@pytest.mark.slow  # about 100 s: every candidate length compiles new eager programs
def test_assisted_and_prompt_lookup_decoding_equal_greedy():
    # speculative decoding keeps exactly the target model's greedy tokens
    target = tiny_llama()
    torch.manual_seed(0)
    cfg = target.config.to_dict()
    cfg["num_hidden_layers"] = 1
    draft = transformers.LlamaForCausalLM(transformers.LlamaConfig(**cfg)).eval()
    # a plausible draft: the target less its second layer
    draft.load_state_dict({k: v for k, v in target.state_dict().items() if ".layers.1." not in k})
    t_tpu, d_tpu = tiny_llama().to("tpu"), transformers.LlamaForCausalLM(transformers.LlamaConfig(**cfg)).eval()
    d_tpu.load_state_dict(draft.state_dict())
    d_tpu = d_tpu.to("tpu")
    base = torch.randint(3, 128, (1, 6), generator=torch.Generator().manual_seed(7))
    ids = torch.cat([base, base, base], 1)  # repeated text: prompt lookup finds candidates
    ref = target.generate(ids, max_new_tokens=12, do_sample=False, eos_token_id=None)
    calls = []
    hook = t_tpu.register_forward_hook(lambda *a: calls.append(1))
    out = t_tpu.generate(ids.to("tpu"), max_new_tokens=12, do_sample=False, eos_token_id=None,
                         assistant_model=d_tpu).cpu()
    assisted_calls = len(calls)
    calls.clear()
    out2 = t_tpu.generate(ids.to("tpu"), max_new_tokens=12, do_sample=False, eos_token_id=None,
                          prompt_lookup_num_tokens=3).cpu()
    hook.remove()
    assert torch.equal(out, ref)
    assert torch.equal(out2, ref)
    # candidates were accepted: fewer target forwards than new tokens
    print(f"target forwards for 12 tokens: assisted {assisted_calls}, prompt lookup {len(calls)}")
    assert assisted_calls < 12 and len(calls) <= 12


@pytest.mark.slow  # about 50 s of compiles (every scheduled batch shape is new)
def test_continuous_batching_equals_sequential_greedy():
    # transformers' generate_batch (paged attention, requests of different lengths scheduled
    # together) on tpu: each output is the CPU's sequential greedy generation of its prompt.
    # The KV cache is sized explicitly: transformers sizes it from the host's memory for a
    # device it does not know, which is far more than a test should allocate.
    cpu = tiny_llama()
    tpu = tiny_llama().to("tpu")
    g = torch.Generator().manual_seed(8)
    prompts = [torch.randint(3, 128, (n,), generator=g).tolist() for n in (3, 9, 5, 12)]
    refs = [cpu.generate(torch.tensor([p]), max_new_tokens=6, do_sample=False, eos_token_id=None)[0, len(p):].tolist()
            for p in prompts]
    gc = transformers.GenerationConfig(max_new_tokens=6, do_sample=False, pad_token_id=PAD, eos_token_id=None)
    cb = transformers.ContinuousBatchingConfig(num_blocks=16, max_batch_tokens=64, use_cuda_graph=False,
                                               use_async_batching=False)
    res = tpu.generate_batch(prompts, generation_config=gc, continuous_batching_config=cb)
    assert len(res) == len(prompts)
    by_prompt = {tuple(r.prompt_ids): r.generated_tokens for r in res.values()}
    for p, ref in zip(prompts, refs):
        assert by_prompt[tuple(p)] == ref
