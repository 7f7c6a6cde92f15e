"""transformers fine-grained FP8 checkpoints (weight + 128x128 f32
weight_scale_inv, DeepSeek's layout) made locally from a tiny Llama config:
loaded on tpu with the weights packed, generating the tokens of the model
transformers dequantizes on CPU."""
import json
import os

import pytest
import torch

import torchtpu
from torchtpu import quant as Q

# transformers' import and model building take seconds: the slow tier
pytestmark = pytest.mark.slow
transformers = pytest.importorskip("transformers")
safetensors_torch = pytest.importorskip("safetensors.torch")


def _quantize_fp8_blocks(v):
    """(N, K) -> float8_e4m3fn weight and (ceil(N/128), ceil(K/128)) f32 weight_scale_inv."""
    N, K = v.shape
    nb, kb = -(-N // 128), -(-K // 128)
    pad = torch.zeros(nb * 128, kb * 128)
    pad[:N, :K] = v.float()
    s = (pad.view(nb, 128, kb, 128).abs().amax((1, 3)) / 448).clamp(min=1e-12)
    se = s.repeat_interleave(128, 0)[:N].repeat_interleave(128, 1)[:, :K]
    return (v.float() / se).clamp(-448, 448).to(torch.float8_e4m3fn), s


def _write_fp8_checkpoint(path, cfg, tensors, quantized):
    """`tensors` (name -> bf16) saved with those `quantized(name, tensor)`
    picks as fp8 + 128x128 weight_scale_inv, and cfg with transformers'
    fine-grained FP8 quantization_config; returns the saved tensors."""
    sd = {}
    for k, v in tensors.items():
        if quantized(k, v):
            sd[k], sd[k[:-len("weight")] + "weight_scale_inv"] = _quantize_fp8_blocks(v)
        else:
            sd[k] = v.contiguous()
    os.makedirs(path, exist_ok=True)
    safetensors_torch.save_file(sd, os.path.join(path, "model.safetensors"), metadata={"format": "pt"})
    d = cfg.to_dict()
    d.update(architectures=cfg.architectures, torch_dtype="bfloat16",
             quantization_config={"quant_method": "fp8", "activation_scheme": "dynamic",
                                  "weight_block_size": [128, 128]})
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(d, f)
    return sd


def make_fp8_checkpoint(path):
    cfg = transformers.LlamaConfig(vocab_size=512, hidden_size=256, intermediate_size=384,
                                   num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                   max_position_embeddings=128, architectures=["LlamaForCausalLM"])
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg).to(torch.bfloat16)
    tensors = {k: v for k, v in model.state_dict().items() if k != "lm_head.weight" or not cfg.tie_word_embeddings}
    return _write_fp8_checkpoint(path, cfg, tensors, lambda k, v: k.endswith(".weight") and v.dim() == 2
                                 and "embed" not in k and "lm_head" not in k)


def make_fp8_moe_checkpoint(path, tmp):
    """A tiny Qwen3-MoE in transformers' FP8 layout: per-expert
    `mlp.experts.{e}.{gate,up,down}_proj.weight` + `weight_scale_inv` (what
    FineGrainedFP8Config saves; it quantizes only on CUDA/XPU), the router
    kept bf16. (Block-aligned shapes: transformers' dequantization takes the
    blocks as rows // scale_rows, not weight_block_size.)"""
    cfg = transformers.Qwen3MoeConfig(
        vocab_size=512, hidden_size=256, intermediate_size=384, moe_intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=64, num_experts=4, num_experts_per_tok=2,
        max_position_embeddings=128, architectures=["Qwen3MoeForCausalLM"])
    torch.manual_seed(0)
    transformers.Qwen3MoeForCausalLM(cfg).to(torch.bfloat16).save_pretrained(str(tmp))  # per-expert names
    tensors = safetensors_torch.load_file(os.path.join(str(tmp), "model.safetensors"))
    return _write_fp8_checkpoint(path, cfg, tensors, lambda k, v: k.endswith("proj.weight"))


@pytest.fixture(scope="module")
def fp8_moe_checkpoint(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("fp8moeck"))
    sd = make_fp8_moe_checkpoint(path, tmp_path_factory.mktemp("fp8moe_bf16"))
    ref = transformers.AutoModelForCausalLM.from_pretrained(path).eval()  # dequantized on CPU
    return path, sd, ref


@pytest.fixture(scope="module")
def fp8_checkpoint(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("fp8ck"))
    sd = make_fp8_checkpoint(path)
    ref = transformers.AutoModelForCausalLM.from_pretrained(path).eval()  # dequantized on CPU
    return path, sd, ref


IDS = torch.tensor([[1, 17, 42, 99, 3]])


def test_fp8_checkpoint_loads_packed(fp8_checkpoint):
    path, sd, ref = fp8_checkpoint
    model = Q.load_fp8_checkpoint(path)
    packed = [m for m in model.modules() if isinstance(m, Q.BlockFP8Linear)]
    assert len(packed) == 14
    for m in packed:
        assert m.weight.device.type == "tpu" and m.weight.dtype == torch.float8_e4m3fn
    fp8_bytes = sum(m.weight.nbytes + m.weight_scale_inv.nbytes for m in packed)
    bf16_bytes = sum(2 * m.weight.numel() for m in packed)
    assert fp8_bytes < 0.51 * bf16_bytes
    up = model.model.layers[0].mlp.up_proj
    assert torch.equal(up.weight.cpu().view(torch.uint8),
                       sd["model.layers.0.mlp.up_proj.weight"].view(torch.uint8))
    torchtpu.reset_metrics()
    with torch.no_grad():
        got = model(IDS.to("tpu")).logits.float().cpu()
        want = ref(IDS).logits.float()
    assert torchtpu.metrics()["cpu_fallbacks"] == {}
    torch.testing.assert_close(got, want, rtol=0.02, atol=0.02 * want.abs().max().item())
    assert torch.equal(got.argmax(-1), want.argmax(-1))


def test_fp8_checkpoint_generates_like_dequantized_cpu(fp8_checkpoint):
    path, _, ref = fp8_checkpoint
    want = ref.generate(IDS, max_new_tokens=8, do_sample=False)
    model = Q.load_fp8_checkpoint(path)
    got = model.generate(IDS.to("tpu"), max_new_tokens=8, do_sample=False).cpu()
    assert got.tolist() == want.tolist()
    # W8A8: activations in fp8 per 1x128 group, one blockwise _scaled_mm per linear
    model8 = Q.load_fp8_checkpoint(path, activations="fp8")
    with torch.no_grad():
        l16 = model(IDS.to("tpu")).logits.float().cpu()
        l8 = model8(IDS.to("tpu")).logits.float().cpu()
    assert (l16 - l8).abs().max() < 0.1 * l16.abs().max()


def test_fp8_checkpoint_rejects_other_formats(tmp_path):
    cfg = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
                                   num_hidden_layers=1, num_attention_heads=2)
    cfg.save_pretrained(str(tmp_path))
    with pytest.raises(ValueError, match="not a fp8 checkpoint"):
        Q.load_fp8_checkpoint(str(tmp_path))


def make_mxfp4_checkpoint(path):
    """A tiny gpt-oss with its experts in the MXFP4 checkpoint format."""
    cfg = transformers.GptOssConfig(
        vocab_size=256, hidden_size=64, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, num_local_experts=4, num_experts_per_tok=2,
        max_position_embeddings=64, layer_types=["sliding_attention", "full_attention"], sliding_window=16)
    torch.manual_seed(0)
    model = transformers.GptOssForCausalLM(cfg).to(torch.bfloat16)
    sd = {}
    for k, v in model.state_dict().items():
        if k.endswith(("experts.gate_up_proj", "experts.down_proj")):
            w = v.float().transpose(1, 2)  # (E, R, K): quantized along K
            E, R, K = w.shape
            xb = w.reshape(E, R, K // 32, 32)
            # plain-PyTorch MXFP4 (OCP FLOOR scale, e2m1 round-to-nearest-even, saturating)
            exp = torch.floor(torch.log2(xb.abs().amax(-1))) - 2
            scaled = xb / torch.exp2(exp)[..., None]
            grid = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
            mag = scaled.abs().clamp(max=6.0)
            d = (mag[..., None] - grid).abs()
            code = d.argmin(-1)  # ties: the even (lower) code ...
            tie = (d.min(-1).values[..., None] == d).sum(-1) > 1
            code = torch.where(tie & (code % 2 == 1), code + 1, code)  # ... round half to even
            code = code + 8 * (scaled < 0)
            code = code.reshape(E, R, K).to(torch.uint8)
            sd[k + "_blocks"] = (code[..., ::2] | (code[..., 1::2] << 4)).reshape(E, R, K // 32, 16)
            sd[k + "_scales"] = (exp + 127).to(torch.uint8)
        else:
            sd[k] = v.contiguous()
    os.makedirs(path, exist_ok=True)
    safetensors_torch.save_file(sd, os.path.join(path, "model.safetensors"), metadata={"format": "pt"})
    d = cfg.to_dict()
    d.update(architectures=["GptOssForCausalLM"], torch_dtype="bfloat16",
             quantization_config={"quant_method": "mxfp4", "modules_to_not_convert": [
                 "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]})
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(d, f)
    return sd


@pytest.fixture(scope="module")
def mxfp4_checkpoint(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("mxfp4ck"))
    sd = make_mxfp4_checkpoint(path)
    ref = transformers.AutoModelForCausalLM.from_pretrained(path).eval()  # dequantized on CPU
    ref.set_experts_implementation("eager")
    return path, sd, ref


def test_mxfp4_checkpoint_loads_packed_and_generates(mxfp4_checkpoint):
    path, sd, ref = mxfp4_checkpoint
    model = Q.load_mxfp4_checkpoint(path)
    experts = model.model.layers[0].mlp.experts
    for proj in ("gate_up_proj", "down_proj"):
        p = getattr(experts, proj)
        assert isinstance(p, Q.PackedMXFP4Experts) and p.blocks.device.type == "tpu"
        assert p.blocks.dtype == torch.float4_e2m1fn_x2 and p.scales.dtype == torch.float8_e8m0fnu
        raw = sd[f"model.layers.0.mlp.experts.{proj}_blocks"]
        assert torch.equal(p.blocks.cpu().view(torch.uint8), raw.reshape(raw.shape[0], raw.shape[1], -1))
        want = getattr(ref.model.layers[0].mlp.experts, proj)
        assert torch.equal(torch.stack([p[e].cpu() for e in range(4)]), want.detach())
    torchtpu.reset_metrics()
    with torch.no_grad():
        torch.testing.assert_close(model(IDS.to("tpu")).logits.float().cpu(), ref(IDS).logits.float(),
                                   rtol=1e-2, atol=1e-2)
    assert torchtpu.metrics()["cpu_fallbacks"] == {}
    want = ref.generate(IDS, max_new_tokens=6, do_sample=False)
    got = model.generate(IDS.to("tpu"), max_new_tokens=6, do_sample=False).cpu()
    assert got.tolist() == want.tolist()


# ------------------------------------------------ AutoModelForCausalLM.from_pretrained(device_map="tpu")
def _from_pretrained_packed(path, **kwargs):
    """from_pretrained with torchtpu's packed quantizers; the bytes it allocates on tpu."""
    before = torch.tpu.memory_allocated()
    model = transformers.AutoModelForCausalLM.from_pretrained(
        path, config=Q.packed_config(path, **kwargs), device_map="tpu").eval()
    return model, torch.tpu.memory_allocated() - before


def _tensor_bytes(model):
    return sum({id(t): t.nbytes for t in [*model.parameters(), *model.buffers()]}.values())


def _assert_saves_checkpoint(model, path, tmp_path):
    model.save_pretrained(str(tmp_path / "saved"))
    a = safetensors_torch.load_file(os.path.join(path, "model.safetensors"))
    b = safetensors_torch.load_file(str(tmp_path / "saved" / "model.safetensors"))
    assert sorted(a) == sorted(b)
    for k in a:
        assert a[k].dtype == b[k].dtype and torch.equal(a[k].view(torch.uint8), b[k].view(torch.uint8)), k
    with open(tmp_path / "saved" / "config.json") as f:
        saved = json.load(f)["quantization_config"]
    with open(os.path.join(path, "config.json")) as f:
        assert saved == json.load(f)["quantization_config"]


def test_from_pretrained_fp8_stays_packed(fp8_checkpoint, tmp_path):
    path, sd, ref = fp8_checkpoint
    model, allocated = _from_pretrained_packed(path)
    packed = [m for m in model.modules() if isinstance(m, Q.BlockFP8Linear)]
    assert len(packed) == 14 and not any(type(m) is torch.nn.Linear for m in model.model.modules())
    for name, m in model.named_modules():
        if isinstance(m, Q.BlockFP8Linear):
            assert m.weight.device.type == "tpu" and m.weight.dtype == torch.float8_e4m3fn
            assert torch.equal(m.weight.cpu().view(torch.uint8), sd[f"{name}.weight"].view(torch.uint8))
            assert torch.equal(m.weight_scale_inv.cpu(), sd[f"{name}.weight_scale_inv"])
    # all tpu memory is the model's tensors: the fp8 weights and their scales, no bf16 copies
    assert allocated == _tensor_bytes(model)
    fp8_bytes = sum(m.weight.nbytes + m.weight_scale_inv.nbytes for m in packed)
    assert fp8_bytes < 0.51 * sum(2 * m.weight.numel() for m in packed)
    assert model.config.quantization_config.to_dict()["quant_method"] == "fp8"
    want = ref.generate(IDS, max_new_tokens=8, do_sample=False)
    torchtpu.reset_metrics()
    got = model.generate(IDS.to("tpu"), max_new_tokens=8, do_sample=False).cpu()
    assert got.tolist() == want.tolist()
    assert torchtpu.metrics()["cpu_fallbacks"] == {}
    _assert_saves_checkpoint(model, path, tmp_path)  # a standard fp8 checkpoint again


def test_from_pretrained_mxfp4_stays_packed(mxfp4_checkpoint, tmp_path):
    path, sd, ref = mxfp4_checkpoint
    model, allocated = _from_pretrained_packed(path)
    for i, layer in enumerate(model.model.layers):
        for proj in ("gate_up_proj", "down_proj"):
            p = getattr(layer.mlp.experts, proj)
            assert isinstance(p, Q.PackedMXFP4Experts) and p.blocks.device.type == "tpu"
            assert p.blocks.dtype == torch.float4_e2m1fn_x2 and p.scales.dtype == torch.float8_e8m0fnu
            raw = sd[f"model.layers.{i}.mlp.experts.{proj}_blocks"]
            assert torch.equal(p.blocks.cpu().view(torch.uint8), raw.reshape(*raw.shape[:2], -1))
    assert allocated == _tensor_bytes(model)
    experts = [m for m in model.modules() if isinstance(m, Q.PackedMXFP4Experts)]
    fp4_bytes = sum(m.blocks.nbytes + m.scales.nbytes for m in experts)
    assert fp4_bytes < 0.27 * sum(2 * m.shape.numel() for m in experts)
    want = ref.generate(IDS, max_new_tokens=6, do_sample=False)
    torchtpu.reset_metrics()
    got = model.generate(IDS.to("tpu"), max_new_tokens=6, do_sample=False).cpu()
    assert got.tolist() == want.tolist()
    assert torchtpu.metrics()["cpu_fallbacks"] == {}
    _assert_saves_checkpoint(model, path, tmp_path)


def test_packed_config_checks(fp8_checkpoint, tmp_path):
    path = fp8_checkpoint[0]
    model, _ = _from_pretrained_packed(path, activations="fp8")  # W8A8
    assert {m.activations for m in model.modules() if isinstance(m, Q.BlockFP8Linear)} == {"fp8"}
    with pytest.raises(ValueError, match="device_map='tpu'"):
        transformers.AutoModelForCausalLM.from_pretrained(path, config=Q.packed_config(path), device_map="cpu")
    transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
                             num_hidden_layers=1, num_attention_heads=2).save_pretrained(str(tmp_path))
    with pytest.raises(ValueError, match="not a fp8 or mxfp4 checkpoint"):
        Q.packed_config(str(tmp_path))
    # a quantized lm_head, which the default skip list keeps plain: refused, not loaded without its scales
    sd = safetensors_torch.load_file(os.path.join(path, "model.safetensors"))
    sd["lm_head.weight"] = sd["lm_head.weight"].float().to(torch.float8_e4m3fn)
    sd["lm_head.weight_scale_inv"] = torch.ones(4, 2)
    lm = tmp_path / "lm_head_fp8"
    lm.mkdir()
    safetensors_torch.save_file(sd, str(lm / "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(path, "config.json")) as f, open(lm / "config.json", "w") as g:
        g.write(f.read())
    with pytest.raises(ValueError, match=r"only in the checkpoint \['lm_head'\]"):
        _from_pretrained_packed(str(lm))


def test_from_pretrained_fp8_moe_stays_packed(fp8_moe_checkpoint, tmp_path):
    path, sd, ref = fp8_moe_checkpoint
    model, allocated = _from_pretrained_packed(path)
    experts = [m for m in model.modules() if isinstance(m, Q.PackedFP8Experts)]
    assert len(experts) == 2 and len([m for m in model.modules() if isinstance(m, Q.BlockFP8Linear)]) == 8
    for i, layer in enumerate(model.model.layers):
        e = layer.mlp.experts
        assert isinstance(e, Q.PackedFP8Experts)
        pre = f"model.layers.{i}.mlp.experts"
        for t in (e.gate_up_proj, e.down_proj, e.gate_up_proj_scale_inv, e.down_proj_scale_inv):
            assert t.device.type == "tpu"
        assert e.gate_up_proj.dtype == e.down_proj.dtype == torch.float8_e4m3fn
        # the checkpoint's per-expert bytes and scales, stacked (gate then up)
        for name, parts in (("gate_up_proj", ("gate_proj", "up_proj")), ("down_proj", ("down_proj",))):
            for suffix, got in (("weight", getattr(e, name)), ("weight_scale_inv", getattr(e, name + "_scale_inv"))):
                want = torch.stack([torch.cat([sd[f"{pre}.{x}.{p}.{suffix}"] for p in parts]) for x in range(4)])
                assert torch.equal(got.cpu().view(torch.uint8), want.view(torch.uint8)), (i, name, suffix)
        # dequantized, the weights the CPU model (dequantized by transformers) multiplies by
        want = ref.model.layers[i].mlp.experts
        assert torch.equal(e.weights("up").cpu(), want.gate_up_proj.detach())
        assert torch.equal(e.weights("down").cpu(), want.down_proj.detach())
    # all tpu memory is the model's tensors: fp8 experts and their scales, no bf16 copies
    assert allocated == _tensor_bytes(model)
    fp8_bytes = sum(t.nbytes for m in experts for t in m.parameters())
    bf16_bytes = sum(2 * t.numel() for m in experts for t in (m.gate_up_proj, m.down_proj))
    assert fp8_bytes < 0.51 * bf16_bytes
    torchtpu.reset_metrics()
    with torch.no_grad():  # prefill: 10 (token, expert) pairs > 4 experts, grouped; decoding: 2 pairs, gathered
        got = model(IDS.to("tpu")).logits.float().cpu()
        want = ref(IDS).logits.float()
    torch.testing.assert_close(got, want, rtol=0.02, atol=0.02 * want.abs().max().item())
    # this tiny model repeats one token: the decoding steps' logits are compared too
    kw = dict(max_new_tokens=8, do_sample=False, output_logits=True, return_dict_in_generate=True)
    want = ref.generate(IDS, **kw)
    got = model.generate(IDS.to("tpu"), **kw)
    assert got.sequences.cpu().tolist() == want.sequences.tolist()
    for g, w in zip(got.logits, want.logits, strict=True):
        torch.testing.assert_close(g.float().cpu(), w.float(), rtol=0.02, atol=0.02 * w.abs().max().item())
    assert torchtpu.metrics()["cpu_fallbacks"] == {}
    _assert_saves_checkpoint(model, path, tmp_path)  # per-expert fp8 tensors again
    # experts the skip list keeps plain while the checkpoint's are quantized: refused, not loaded without scales
    config = Q.packed_config(path)
    config.quantization_config["modules_to_not_convert"] = ["lm_head", "model.layers.1.mlp.experts"]
    with pytest.raises(ValueError, match=r"only in the checkpoint \['model.layers.1.mlp.experts.0.down_proj'"):
        transformers.AutoModelForCausalLM.from_pretrained(path, config=config, device_map="tpu")
