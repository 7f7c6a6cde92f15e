"""defer_and_fuse generate after warm-up compiles nothing (issue 26.4): the
workload of benchmarks/bench_generate.py (tiny Llama, batches 1 and 16,
12-token prompts, 32 new tokens, a streamer reading each step's tokens),
fresh prompts on every request."""
import pytest
import torch

import torchtpu

transformers = pytest.importorskip("transformers")


class _Streamer:
    def put(self, value):
        value.cpu()

    def end(self):
        pass


@pytest.mark.parametrize("batch", [1, 16])
def test_defer_and_fuse_generate_compiles_nothing_after_warmup(batch):
    cfg = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, vocab_size=128, max_position_embeddings=512,
                                   pad_token_id=0, eos_token_id=None, bos_token_id=None)
    torch.manual_seed(0)
    cpu = transformers.LlamaForCausalLM(cfg).eval()
    tpu = transformers.LlamaForCausalLM(cfg).eval()
    tpu.load_state_dict(cpu.state_dict())
    tpu = tpu.to("tpu")
    g = torch.Generator().manual_seed(batch)

    def request(check=False):
        ids = torch.randint(1, 128, (batch, 12), generator=g)
        torch.tpu.synchronize()
        before = torchtpu.metrics()["compiles"]
        with torchtpu.mode("defer_and_fuse"):
            out = tpu.generate(ids.to("tpu"), max_new_tokens=32, do_sample=False, streamer=_Streamer())
        out = out.cpu()
        torch.tpu.synchronize()
        if check:
            assert torch.equal(out, cpu.generate(ids, max_new_tokens=32, do_sample=False))
        return torchtpu.metrics()["compiles"] - before

    request(check=True)  # warm-up
    assert [request(check=i == 0) for i in range(2)] == [0, 0]
