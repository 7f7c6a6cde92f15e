"""Hugging Face on "tpu": transformers, accelerate, peft, diffusers flows as a
CUDA user writes them, each against the same run on CPU. Tiny models are
built from configs (no model hub)."""
import copy
import os

import pytest
import torch

import torchtpu

transformers = pytest.importorskip("transformers")
from transformers import AutoModelForCausalLM, LlamaConfig  # noqa: E402

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def tiny_llama(**kw):
    cfg = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
               num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)
    cfg.update(kw)
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(LlamaConfig(**cfg))


class TokenData(torch.utils.data.Dataset):
    def __init__(self, n=32, t=8, vocab=64):
        g = torch.Generator().manual_seed(1)
        self.x = torch.randint(0, vocab, (n, t), generator=g)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return {"input_ids": self.x[i], "labels": self.x[i]}


def test_not_mistaken_for_torch_xla():
    from accelerate import PartialState
    from accelerate.utils import DistributedType
    from transformers.utils import is_torch_xla_available

    assert not is_torch_xla_available()
    assert torch.accelerator.current_accelerator().type == "tpu"
    state = PartialState()
    assert state.device.type == "tpu"
    assert state.distributed_type == DistributedType.NO


@pytest.mark.parametrize("kw", [dict(device_map="tpu"), dict(device_map="auto"), dict(device_map={"": "tpu"}),
                                dict(device_map="tpu", dtype=torch.bfloat16)], ids=["tpu", "auto", "dict", "bf16"])
def test_from_pretrained_device_map(tmp_path, kw):
    ref = tiny_llama().eval()
    ref.save_pretrained(tmp_path)
    ids = torch.randint(0, 64, (2, 7))
    with torch.no_grad():
        want = ref(ids).logits
    m = AutoModelForCausalLM.from_pretrained(tmp_path, **kw)
    assert m.device.type == "tpu"
    assert all(p.device.type == "tpu" for p in m.parameters())
    assert m.lm_head.weight is m.model.embed_tokens.weight
    with torch.no_grad():
        got = m(ids.to("tpu")).logits.float().cpu()
    tol = dict(rtol=5e-2, atol=5e-2) if kw.get("dtype") == torch.bfloat16 else dict(rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got, want, **tol)
    # save_pretrained of a tpu model round-trips through CPU
    m.save_pretrained(tmp_path / "again")
    back = AutoModelForCausalLM.from_pretrained(tmp_path / "again").to(ref.dtype)
    for (n, a), (_, b) in zip(back.state_dict().items(), m.state_dict().items()):
        assert torch.equal(a, b.cpu().to(a.dtype)), n


def test_device_map_auto_offloads_past_a_memory_limit(tmp_path):
    ref = tiny_llama(num_hidden_layers=4, tie_word_embeddings=False).eval()
    ref.save_pretrained(tmp_path)
    ids = torch.randint(0, 64, (2, 7))
    with torch.no_grad():
        want = ref(ids).logits
    m = AutoModelForCausalLM.from_pretrained(tmp_path, device_map="auto", max_memory={0: "100KB", "cpu": "1GB"})
    placed = set(m.hf_device_map.values())
    assert 0 in placed and "cpu" in placed, m.hf_device_map
    with torch.no_grad():
        got = m(ids.to("tpu")).logits.cpu()
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_from_pretrained_device_map_holds_no_host_copy_of_the_weights(tmp_path):
    """device_map="tpu" moves each tensor from the checkpoint's mmap to the device, a few at a time: beyond
    the loaded weights (with XLA:CPU, device memory is host memory too) loading holds little anonymous host
    memory, far from a second copy of the weights. Measured in a fresh process by benchmarks/bench_load.py
    (~100 MB of fp32 weights in 50 MB shards; docs/hf-suite.md has its figures)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_load", os.path.join(
        os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks", "bench_load.py"))
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    ckpt = bench.save_checkpoint(str(tmp_path), 100, 50)
    r = bench.run_case(str(tmp_path), "tpu")
    assert r["resident"] >= r["model_bytes"] > 0.99 * ckpt, r  # the weights are on the device
    assert r["peak_anon"] - r["resident"] < 0.25 * ckpt, r


@pytest.mark.parametrize("arch", ["mixtral", "qwen2_moe"])
def test_moe_models_forward_and_grads_match_cpu(arch):
    from transformers import AutoConfig

    extra = dict(num_local_experts=4) if arch == "mixtral" else dict(
        num_experts=4, moe_intermediate_size=16, shared_expert_intermediate_size=32)
    cfg = AutoConfig.for_model(arch, vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                               num_attention_heads=4, num_key_value_heads=2, num_experts_per_tok=2, **extra)
    torch.manual_seed(0)
    ref = AutoModelForCausalLM.from_config(cfg)
    m = copy.deepcopy(ref).to("tpu")
    ids = torch.randint(0, 64, (2, 9))
    torchtpu.reset_metrics()
    out = m(ids.to("tpu"), labels=ids.to("tpu"))
    want = ref(ids, labels=ids)
    torch.testing.assert_close(out.logits.cpu(), want.logits, rtol=1e-4, atol=1e-4)
    out.loss.backward()
    want.loss.backward()
    for (n, a), (_, b) in zip(m.named_parameters(), ref.named_parameters()):
        if b.grad is not None:
            torch.testing.assert_close(a.grad.cpu(), b.grad, rtol=1e-3, atol=1e-5, msg=n)
    assert torchtpu.metrics()["cpu_fallbacks"] == {}


def _trainer_run(tmp_path, device, bf16=False, max_steps=4, resume=None):
    from transformers import Trainer, TrainingArguments

    model = tiny_llama()
    args = TrainingArguments(str(tmp_path), per_device_train_batch_size=4, gradient_accumulation_steps=2,
                             max_steps=max_steps, learning_rate=1e-2, logging_steps=1, max_grad_norm=0.5,
                             use_cpu=device == "cpu", bf16=bf16, save_steps=2, report_to=[], seed=0,
                             disable_tqdm=True)
    t = Trainer(model=model, args=args, train_dataset=TokenData())
    t.train(resume_from_checkpoint=resume)
    assert t.args.device.type == device and model.device.type == device
    losses = [h["loss"] for h in t.state.log_history if "loss" in h]
    return losses, model


def test_trainer_matches_cpu_with_accumulation_clipping_and_resume(tmp_path):
    cpu_losses, cpu_model = _trainer_run(tmp_path / "cpu", "cpu")
    tpu_losses, tpu_model = _trainer_run(tmp_path / "tpu", "tpu")
    torch.testing.assert_close(torch.tensor(tpu_losses), torch.tensor(cpu_losses), rtol=1e-5, atol=1e-5)
    for (n, a), (_, b) in zip(tpu_model.state_dict().items(), cpu_model.state_dict().items()):
        torch.testing.assert_close(a.cpu(), b, rtol=1e-4, atol=1e-5, msg=n)
    # Resume from the step-2 checkpoint: the same final weights as the run that went straight through.
    ckpt = tmp_path / "tpu" / "checkpoint-2"
    assert (ckpt / "optimizer.pt").exists()
    resumed_losses, resumed = _trainer_run(tmp_path / "tpu", "tpu", resume=str(ckpt))
    torch.testing.assert_close(torch.tensor(resumed_losses[-2:]), torch.tensor(tpu_losses[-2:]), rtol=1e-5,
                               atol=1e-5)
    for (n, a), (_, b) in zip(resumed.state_dict().items(), tpu_model.state_dict().items()):
        torch.testing.assert_close(a.cpu(), b.cpu(), rtol=1e-5, atol=1e-6, msg=n)


def test_trainer_bf16_autocast_close_to_cpu(tmp_path):
    cpu_losses, _ = _trainer_run(tmp_path / "cpu", "cpu", bf16=True, max_steps=2)
    tpu_losses, _ = _trainer_run(tmp_path / "tpu", "tpu", bf16=True, max_steps=2)
    torch.testing.assert_close(torch.tensor(tpu_losses), torch.tensor(cpu_losses), rtol=2e-3, atol=2e-3)


def _accelerate_loop(device, mixed_precision="no"):
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state(reset_partial_state=True)  # accelerate's own tests do this between runs
    acc = Accelerator(cpu=device == "cpu", gradient_accumulation_steps=2, mixed_precision=mixed_precision)
    model = tiny_llama()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    dl = torch.utils.data.DataLoader(TokenData(16), batch_size=4)
    model, opt, dl = acc.prepare(model, opt, dl)
    assert acc.device.type == device
    losses = []
    for batch in dl:
        with acc.accumulate(model):
            loss = model(**batch).loss
            acc.backward(loss)
            if acc.sync_gradients:
                acc.clip_grad_norm_(model.parameters(), 0.5)
            opt.step()
            opt.zero_grad()
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize("mp", ["no", "bf16"])
def test_accelerate_loop_matches_cpu(mp):
    tol = dict(rtol=1e-5, atol=1e-5) if mp == "no" else dict(rtol=2e-3, atol=2e-3)
    torch.testing.assert_close(torch.tensor(_accelerate_loop("tpu", mp)), torch.tensor(_accelerate_loop("cpu", mp)),
                               **tol)


def test_peft_lora_matches_cpu():
    peft = pytest.importorskip("peft")

    def run(device):
        model = peft.get_peft_model(tiny_llama(tie_word_embeddings=False),
                                    peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"],
                                                    lora_dropout=0.0, init_lora_weights="gaussian"))
        model.to(device)
        opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
        data = TokenData(12).x
        losses = []
        for i in range(3):
            ids = data[4 * i:4 * i + 4].to(device)
            loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            opt.step()
            opt.zero_grad()
            losses.append(loss.item())
        lora = {k: v.detach().cpu() for k, v in model.state_dict().items() if "lora_" in k}
        return losses, lora

    (tl, tw), (cl, cw) = run("tpu"), run("cpu")
    torch.testing.assert_close(torch.tensor(tl), torch.tensor(cl), rtol=1e-5, atol=1e-5)
    assert tw.keys() == cw.keys() and len(tw) == 8
    for k in tw:
        torch.testing.assert_close(tw[k], cw[k], rtol=1e-4, atol=1e-5, msg=k)


def _tiny_unet():
    from diffusers import UNet2DConditionModel

    torch.manual_seed(0)
    return UNet2DConditionModel(block_out_channels=(8, 16), layers_per_block=1, sample_size=8, in_channels=4,
                                out_channels=4, down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
                                up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"), cross_attention_dim=16,
                                attention_head_dim=4, norm_num_groups=4).eval()


def _denoise(unet, device, steps=3, compiled=False):
    from diffusers import DDIMScheduler

    sched = DDIMScheduler(num_train_timesteps=50)
    sched.set_timesteps(steps)
    g = torch.Generator().manual_seed(0)
    latents = torch.randn(1, 4, 8, 8, generator=g).to(device)
    cond = torch.randn(1, 3, 16, generator=g).to(device)
    fn = torch.compile(unet, backend="tpu", dynamic=False) if compiled else unet
    with torch.no_grad():
        for t in sched.timesteps:
            noise = fn(latents, t.to(device), encoder_hidden_states=cond).sample
            latents = sched.step(noise, t, latents).prev_sample
    return latents.cpu()


@pytest.mark.parametrize("mode", ["strict", "defer_and_fuse", "debug", "compiled"])
def test_diffusers_unet_denoising_loop_matches_cpu(mode):
    pytest.importorskip("diffusers")
    want = _denoise(_tiny_unet(), "cpu")
    unet = _tiny_unet().to("tpu")
    if mode == "compiled":
        got = _denoise(unet, "tpu", compiled=True)
    else:
        with torchtpu.mode(mode):
            got = _denoise(unet, "tpu")
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
