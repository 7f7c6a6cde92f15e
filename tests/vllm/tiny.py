"""Tiny models for the vLLM tests, built from configs and saved locally (no hub), and a
driver that runs vLLM's offline ``LLM`` on them in a fresh process.

    python tests/vllm/tiny.py run SPEC.json   # prints one line "RESULT <json>"
"""
from __future__ import annotations

import json
import os
import sys

CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "A tiny language model runs on a tpu device through vLLM.",
    "Paged attention reads keys and values through a block table.",
    "Hello world! Numbers: 0 1 2 3 4 5 6 7 8 9, and punctuation; too.",
    "Continuous batching schedules many requests of different lengths.",
]


CHAT_TEMPLATE = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}assistant:{% endif %}")


def make_tokenizer(out_dir: str, vocab_size: int = 512):
    """A byte-level BPE trained on a few sentences, wrapped in PreTrainedTokenizerFast."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<s>", "</s>", "<pad>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(CORPUS * 4, trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>")
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out_dir)
    return fast


def make_llama(out_dir: str, seed: int = 0, vocab_size: int = 512):
    """Tiny Llama: hidden 64, 2 layers, 4 heads, 2 KV heads (GQA), saved with its tokenizer."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    tok = make_tokenizer(out_dir, vocab_size)
    cfg = LlamaConfig(vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                      bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                      pad_token_id=tok.pad_token_id, tie_word_embeddings=False, torch_dtype="float32")
    torch.manual_seed(seed)
    model = LlamaForCausalLM(cfg).eval()
    # Larger-than-default weights so greedy argmaxes are well separated (random init is ~flat).
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 0.15)
    model.save_pretrained(out_dir)
    return model, tok


def make_eagle(out_dir: str, target_dir: str, seed: int = 1):
    """A tiny EAGLE(-1) draft head for the tiny Llama in ``target_dir``, in the layout vLLM's
    ``EagleLlamaForCausalLM`` loads (vllm/model_executor/models/llama_eagle.py): the target's
    Llama config with one layer, ``fc.weight [H, 2H]`` over (token embedding | target hidden
    state) and ``layers.0.*`` without ``input_layernorm``; no ``embed_tokens`` / ``lm_head``, so
    vLLM shares the target's. Random weights: its drafts are mostly rejected, the output must
    still be the target's."""
    import shutil

    import torch
    from safetensors.torch import save_file
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig.from_pretrained(target_dir)
    cfg.num_hidden_layers = 1
    cfg.architectures = ["LlamaForCausalLM"]
    layer = _random(LlamaForCausalLM, cfg, seed).model.layers[0]
    tensors = {f"layers.0.{k}": v.contiguous() for k, v in layer.state_dict().items()
               if not k.startswith("input_layernorm")}
    g = torch.Generator().manual_seed(seed)
    tensors["fc.weight"] = torch.randn(cfg.hidden_size, 2 * cfg.hidden_size, generator=g) * 0.15
    os.makedirs(out_dir, exist_ok=True)
    cfg.save_pretrained(out_dir)
    save_file(tensors, os.path.join(out_dir, "model.safetensors"), metadata={"format": "pt"})
    for f in os.listdir(target_dir):
        if f.startswith("tokenizer") or f == "chat_template.jinja":
            shutil.copy(os.path.join(target_dir, f), out_dir)
    return out_dir


def _random(model_cls, cfg, seed: int, std: float = 0.15):
    """model_cls(cfg) in eval mode with every matrix drawn from N(0, std): larger-than-default
    weights so greedy argmaxes are well separated (random init is ~flat)."""
    import torch

    torch.manual_seed(seed)
    model = model_cls(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2:
                p.normal_(0.0, std)
    return model


def _save(model_cls, cfg, out_dir: str, tok, seed: int, post=None):
    import torch

    model = _random(model_cls, cfg, seed)
    if post is not None:
        with torch.no_grad():
            post(model)
    model.save_pretrained(out_dir)
    return model, tok


def _save_checkpoint(model, tensors: dict, out_dir: str, quantization_config: dict) -> None:
    """Writes ``tensors`` as the checkpoint of ``model``'s config with ``quantization_config``
    (replacing any weights already in ``out_dir``)."""
    from safetensors.torch import save_file

    for f in os.listdir(out_dir):
        if f.endswith(".safetensors") or f.endswith(".safetensors.index.json"):
            os.remove(os.path.join(out_dir, f))
    model.config.quantization_config = quantization_config
    model.config.architectures = [type(model).__name__]
    model.config.save_pretrained(out_dir)
    save_file(tensors, os.path.join(out_dir, "model.safetensors"), metadata={"format": "pt"})


def save_dequantized(model, tok, out_dir: str) -> None:
    """Saves ``model`` (a maker's dequantized reference) and ``tok`` as a plain checkpoint: the
    same weights without the quantization config."""
    model.config.quantization_config = None
    del model.config.quantization_config
    model.save_pretrained(out_dir)
    tok.save_pretrained(out_dir)


def _llama128(tok, vocab_size: int, seed: int):
    """The quantized makers' Llama: hidden 128, 4 heads of 32 (q, k, v 128 wide: whole 128x128
    blocks), MLP 256, weights N(0, 0.1)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(**{**_common(tok, vocab_size), "hidden_size": 128, "intermediate_size": 256,
                         "num_key_value_heads": 4, "head_dim": 32}, tie_word_embeddings=False)
    return _random(LlamaForCausalLM, cfg, seed, std=0.1)


def _common(tok, vocab_size: int) -> dict:
    return dict(vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                torch_dtype="float32")


def make_llama_long(out_dir: str, seed: int = 0, vocab_size: int = 512):
    """The tiny Llama's shape with 4,096 positions (long-context tests)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    tok = make_tokenizer(out_dir, vocab_size)
    cfg = LlamaConfig(**{**_common(tok, vocab_size), "max_position_embeddings": 4096}, tie_word_embeddings=False)
    return _save(LlamaForCausalLM, cfg, out_dir, tok, seed)


def make_qwen3(out_dir: str, seed: int = 0, vocab_size: int = 512):
    """Tiny Qwen3: per-head q/k RMSNorm, head_dim 16, GQA 4/2, untied embeddings."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    tok = make_tokenizer(out_dir, vocab_size)
    cfg = Qwen3Config(**_common(tok, vocab_size), head_dim=16, tie_word_embeddings=False)
    return _save(Qwen3ForCausalLM, cfg, out_dir, tok, seed)


def make_gemma(out_dir: str, seed: int = 0, vocab_size: int = 512):
    """Tiny Gemma: tied embeddings, embeddings scaled by sqrt(hidden), (1 + w) RMSNorm, GeGLU
    (gelu tanh), head_dim 16, GQA 4/2."""
    from transformers import GemmaConfig, GemmaForCausalLM

    tok = make_tokenizer(out_dir, vocab_size)
    cfg = GemmaConfig(**_common(tok, vocab_size), head_dim=16, hidden_activation="gelu_pytorch_tanh",
                      tie_word_embeddings=True)

    def post(model):
        # Gemma scales embeddings by sqrt(hidden) and ties the LM head to them: with large
        # embeddings every token predicts itself. Small embeddings and a final norm of scale
        # 10 ((1 + w) RMSNorm) keep the logits spread and the tokens varied.
        model.model.embed_tokens.weight.normal_(0.0, 0.02)
        model.model.norm.weight.fill_(9.0)

    return _save(GemmaForCausalLM, cfg, out_dir, tok, seed, post)


def make_qwen3_moe(out_dir: str, seed: int = 0, vocab_size: int = 512):
    """Tiny Qwen3-MoE: 4 experts, top-2 routing (normalised), every layer sparse."""
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    tok = make_tokenizer(out_dir, vocab_size)
    cfg = Qwen3MoeConfig(**_common(tok, vocab_size), head_dim=16, tie_word_embeddings=False,
                         num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                         decoder_sparse_step=1, norm_topk_prob=True, mlp_only_layers=[])
    return _save(Qwen3MoeForCausalLM, cfg, out_dir, tok, seed)


def make_mixtral(out_dir: str, seed: int = 0, vocab_size: int = 512):
    """Tiny Mixtral: 4 experts, top-2 routing."""
    from transformers import MixtralConfig, MixtralForCausalLM

    tok = make_tokenizer(out_dir, vocab_size)
    cfg = MixtralConfig(**_common(tok, vocab_size), num_local_experts=4, num_experts_per_tok=2,
                        tie_word_embeddings=False)
    return _save(MixtralForCausalLM, cfg, out_dir, tok, seed)


def make_gemma2(out_dir: str, seed: int = 0, vocab_size: int = 512):
    """Tiny Gemma2: tied embeddings, attention and final logit soft caps, sliding window on
    alternate layers (window 8, shorter than the prompts), pre/post norms."""
    from transformers import Gemma2Config, Gemma2ForCausalLM

    tok = make_tokenizer(out_dir, vocab_size)
    cfg = Gemma2Config(**_common(tok, vocab_size), head_dim=16, hidden_activation="gelu_pytorch_tanh",
                       tie_word_embeddings=True, sliding_window=8, attn_logit_softcapping=50.0,
                       final_logit_softcapping=30.0, query_pre_attn_scalar=16,
                       attn_implementation="eager")

    def post(model):
        model.model.embed_tokens.weight.normal_(0.0, 0.02)
        model.model.norm.weight.fill_(9.0)

    return _save(Gemma2ForCausalLM, cfg, out_dir, tok, seed, post)


def make_gemma3(out_dir: str, seed: int = 0, vocab_size: int = 512):
    """Tiny Gemma3 (text): tied embeddings, q/k norms, sliding window (8) on all but every 2nd
    layer, local and global RoPE bases."""
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    tok = make_tokenizer(out_dir, vocab_size)
    cfg = Gemma3TextConfig(**_common(tok, vocab_size), head_dim=16, hidden_activation="gelu_pytorch_tanh",
                           tie_word_embeddings=True, sliding_window=8, sliding_window_pattern=2,
                           query_pre_attn_scalar=16, attn_implementation="eager")

    def post(model):
        model.model.embed_tokens.weight.normal_(0.0, 0.02)
        model.model.norm.weight.fill_(9.0)

    return _save(Gemma3ForCausalLM, cfg, out_dir, tok, seed, post)


def make_gpt_oss(out_dir: str, seed: int = 0, vocab_size: int = 512):
    """Tiny gpt-oss: attention sinks, sliding window (8) on alternate layers, attention biases,
    YaRN RoPE, a 4-expert top-2 MoE with expert biases and the clamped SwiGLU (gate/up
    interleaved); hidden and expert width 64 (multiples of MXFP4's 32-blocks)."""
    from transformers import GptOssConfig, GptOssForCausalLM

    tok = make_tokenizer(out_dir, vocab_size)
    cfg = GptOssConfig(**{**_common(tok, vocab_size), "intermediate_size": 64}, head_dim=16,
                       num_local_experts=4, num_experts_per_tok=2, sliding_window=8,
                       layer_types=["sliding_attention", "full_attention"], tie_word_embeddings=False,
                       attn_implementation="eager")

    def post(model):
        for layer in model.model.layers:  # visible sinks (init is ~0: no effect to test)
            layer.self_attn.sinks.normal_(0.0, 1.0)

    return _save(GptOssForCausalLM, cfg, out_dir, tok, seed, post)


def make_lora(out_dir: str, base, seed: int, rank: int = 8, alpha: int = 16,
              targets=("q_proj", "v_proj", "down_proj")):
    """A PEFT LoRA adapter for ``base`` (a model of make_llama) written as PEFT saves one
    (adapter_config.json, adapter_model.safetensors: ``lora_A`` (r, in), ``lora_B`` (out, r)),
    and a copy of ``base`` with the adapter merged (W + alpha / r * B @ A): the reference."""
    import copy
    import json as _json

    import torch
    from safetensors.torch import save_file

    os.makedirs(out_dir, exist_ok=True)
    g = torch.Generator().manual_seed(seed)
    merged = copy.deepcopy(base)
    tensors = {}
    for name, m in merged.named_modules():
        if isinstance(m, torch.nn.Linear) and name.split(".")[-1] in targets:
            a = torch.randn(rank, m.in_features, generator=g) * 0.2
            b = torch.randn(m.out_features, rank, generator=g) * 0.2
            tensors[f"base_model.model.{name}.lora_A.weight"] = a
            tensors[f"base_model.model.{name}.lora_B.weight"] = b
            with torch.no_grad():
                m.weight += (alpha / rank) * b @ a
    save_file(tensors, os.path.join(out_dir, "adapter_model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(out_dir, "adapter_config.json"), "w") as f:
        _json.dump({"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": rank, "lora_alpha": alpha,
                    "target_modules": list(targets), "bias": "none", "lora_dropout": 0.0,
                    "fan_in_fan_out": False, "base_model_name_or_path": None}, f)
    return merged


def quantize_fp8_blocks(w, block=(128, 128)):
    """A float weight (N, K) -> (float8_e4m3fn weight, f32 weight_scale_inv (N/bn, K/bk)) with
    w ~= weight * scale_inv per block: the fine-grained FP8 (DeepSeek) checkpoint layout."""
    import torch

    N, K = w.shape
    bn, bk = block
    blocks = w.float().reshape(N // bn, bn, K // bk, bk)
    scale = (blocks.abs().amax(dim=(1, 3)) / 448.0).clamp(min=1e-12)
    q = (blocks / scale[:, None, :, None]).clamp(-448, 448).to(torch.float8_e4m3fn)
    deq = (q.float() * scale[:, None, :, None]).reshape(N, K)
    return q.reshape(N, K), scale, deq


def make_qwen3_moe_fp8(out_dir: str, seed: int = 0, vocab_size: int = 512, attention: bool = True):
    """Tiny Qwen3-MoE (hidden 128, 4 heads of 32, 4 experts of width 128, top-2) saved as a
    fine-grained FP8 checkpoint (128x128 blocks, as Qwen3-30B-A3B-FP8): attention projections and
    every expert's gate/up/down float8_e4m3fn with ``weight_scale_inv``, per expert under the
    hub's names (``mlp.experts.{e}.gate_proj.weight``); routers (``modules_to_not_convert``),
    norms, embeddings and LM head float32. Returns the dequantized model (the reference), the tokenizer and the fp8 bytes."""
    import torch
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    tok = make_tokenizer(out_dir, vocab_size)
    cfg = Qwen3MoeConfig(**{**_common(tok, vocab_size), "hidden_size": 128, "num_key_value_heads": 4},
                         head_dim=32, tie_word_embeddings=False, num_experts=4, num_experts_per_tok=2,
                         moe_intermediate_size=128, decoder_sparse_step=1, norm_topk_prob=True,
                         mlp_only_layers=[])
    model = _random(Qwen3MoeForCausalLM, cfg, seed, std=0.1)
    tensors, fp8 = {}, 0
    inter = cfg.moe_intermediate_size

    def put(name, w):
        nonlocal fp8
        q, sc, deq = quantize_fp8_blocks(w)
        tensors[name], tensors[name + "_scale_inv"] = q, sc
        fp8 += q.numel()
        return deq

    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("experts.gate_up_proj"):  # [E, 2I, H]: gate rows, then up rows
                base = name[:-len("gate_up_proj")]
                for e in range(p.shape[0]):
                    p[e, :inter] = put(f"{base}{e}.gate_proj.weight", p[e, :inter])
                    p[e, inter:] = put(f"{base}{e}.up_proj.weight", p[e, inter:])
            elif name.endswith("experts.down_proj"):  # [E, H, I]
                base = name[:-len("down_proj")]
                for e in range(p.shape[0]):
                    p[e] = put(f"{base}{e}.down_proj.weight", p[e])
            elif attention and name.startswith("model.layers.") and name.endswith("proj.weight"):
                p.copy_(put(name, p))
            else:
                tensors[name] = p.detach().clone().contiguous()
    # the routers stay unquantized, listed as the hub's FP8 MoE checkpoints list them
    keep = [f"model.layers.{i}.mlp.gate" for i in range(cfg.num_hidden_layers)]
    if not attention:
        keep += [f"model.layers.{i}.self_attn.{m}" for i in range(cfg.num_hidden_layers)
                 for m in ("q_proj", "k_proj", "v_proj", "o_proj", "qkv_proj")]
    _save_checkpoint(model, tensors, out_dir, dict(FP8_CONFIGS["block"], modules_to_not_convert=keep))
    return model, tok, fp8


def quantize_fp8_channels(w):
    """A float weight (N, K) -> (float8_e4m3fn weight, f32 weight_scale (N, 1)), one scale per
    output channel: compressed-tensors' FP8 "channel" strategy."""
    import torch

    scale = (w.float().abs().amax(dim=1, keepdim=True) / 448.0).clamp(min=1e-12)
    q = (w.float() / scale).clamp(-448, 448).to(torch.float8_e4m3fn)
    return q, scale, q.float() * scale


# quantization_config of each FP8 scheme (as the checkpoints on the hub carry it)
FP8_CONFIGS = {
    # fine-grained FP8 (DeepSeek-V3, Qwen3-FP8): transformers' FineGrainedFP8Config
    "block": {"quant_method": "fp8", "activation_scheme": "dynamic", "fmt": "e4m3",
              "weight_block_size": [128, 128]},
    # llm-compressor FP8_DYNAMIC: per-channel weights, dynamic per-token activations
    "channel": {"quant_method": "compressed-tensors", "format": "float-quantized",
                "quantization_status": "compressed", "ignore": ["lm_head"],
                "config_groups": {"group_0": {
                    "targets": ["Linear"],
                    "weights": {"num_bits": 8, "type": "float", "strategy": "channel",
                                "symmetric": True, "dynamic": False},
                    "input_activations": {"num_bits": 8, "type": "float", "strategy": "token",
                                          "symmetric": True, "dynamic": True}}}},
}


def make_llama_fp8(out_dir: str, scheme: str = "block", seed: int = 0, vocab_size: int = 512):
    """Tiny Llama (hidden 128, 4 heads of 32, MLP 256) saved as an FP8 checkpoint of
    ``FP8_CONFIGS[scheme]``: every linear of the decoder layers float8_e4m3fn with its scales
    (``weight_scale_inv`` (N/128, K/128) for "block", ``weight_scale`` (N, 1) for "channel");
    embeddings, norms and the LM head stay float32. Returns the model with each quantized weight
    replaced by its dequantized value (the reference: the same checkpoint dequantized), the
    tokenizer and the checkpoint's bytes as vLLM holds them (fp8 weights, f32 scales, the rest
    in bfloat16)."""
    import torch

    tok = make_tokenizer(out_dir, vocab_size)
    model = _llama128(tok, vocab_size, seed)
    tensors, held = {}, 0
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.startswith("model.layers.") and name.endswith("proj.weight"):
                if scheme == "block":
                    q, s, deq = quantize_fp8_blocks(p)
                    tensors[name], tensors[name + "_scale_inv"] = q, s
                else:
                    q, s, deq = quantize_fp8_channels(p)
                    tensors[name], tensors[name[:-len("weight")] + "weight_scale"] = q, s
                p.copy_(deq)
                held += q.numel() + 4 * s.numel()
            else:
                tensors[name] = p.detach().clone().contiguous()
                held += 2 * p.numel()
    _save_checkpoint(model, tensors, out_dir, FP8_CONFIGS[scheme])
    return model, tok, held


E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)  # FP4 (e2m1) magnitudes by code 0..7


def _e2m1(v):
    """The nearest e2m1 value of each element of ``v`` (already divided by its block's scale):
    (codes uint8, sign in bit 3; the values as float32)."""
    import torch

    table = torch.tensor(E2M1_VALUES)
    mag = (v.abs().unsqueeze(-1) - table).abs().argmin(-1)
    neg = v < 0
    return (mag | torch.where(neg, 8, 0)).to(torch.uint8), table[mag] * torch.where(neg, -1.0, 1.0)


def _pack_pairs(codes):
    """(..., K) e2m1 codes -> (..., K/2) uint8, element 2i in the low nibble."""
    return codes[..., 0::2] | (codes[..., 1::2] << 4)


def quantize_nvfp4_weight(w, g=None):
    """A float weight (N, K) -> NVFP4 as compressed-tensors stores it: ``weight_packed`` uint8
    (N, K/2) (element 2i in the low nibble), ``weight_scale`` float8_e4m3fn (N, K/16) and
    ``weight_global_scale`` f32 (1,) = 448 * 6 / amax (a multiplier: w ~= e2m1 * scale /
    global; ``g`` gives it, e.g. shared by the layers vLLM fuses); also the dequantized weight.
    Written out here, independent of torchtpu.quant."""
    import torch

    N, K = w.shape
    g = torch.as_tensor(448.0 * 6.0 / w.float().abs().amax() if g is None else g, dtype=torch.float32)
    blocks = w.float().reshape(N, K // 16, 16)
    s = (blocks.abs().amax(-1) / 6.0 * g).clamp(max=448.0).to(torch.float8_e4m3fn)
    step = (s.float() / g).unsqueeze(-1)
    scaled = torch.where(step > 0, blocks / step.clamp(min=1e-30), torch.zeros_like(blocks))
    code, value = _e2m1(scaled)
    return _pack_pairs(code.reshape(N, K)), s, g.reshape(1), (value * step).reshape(N, K)


def quantize_mxfp4(w):
    """A float tensor (..., K) -> OCP MXFP4 as gpt-oss checkpoints store it: ``blocks`` uint8
    (..., K/32, 16) (element 2i in the low nibble) and ``scales`` uint8 (..., K/32), the e8m0
    exponent floor(log2(amax of the 32)) - 2 biased by 127; also the dequantized tensor.
    Written out here, independent of torchtpu.quant."""
    import torch

    b = w.float().reshape(*w.shape[:-1], w.shape[-1] // 32, 32)
    amax = b.abs().amax(-1, keepdim=True)
    e = torch.where(amax > 0, torch.floor(torch.log2(amax.clamp(min=2.0 ** -126))) - 2, torch.full_like(amax, -127))
    e = e.clamp(-127, 127)
    v = (b / torch.exp2(e)).clamp(-6, 6)
    code, value = _e2m1(v)
    return _pack_pairs(code), (e.squeeze(-1) + 127).to(torch.uint8), (value * torch.exp2(e)).reshape(w.shape)


def make_gpt_oss_mxfp4(out_dir: str, seed: int = 0, vocab_size: int = 512):
    """The tiny gpt-oss of make_gpt_oss saved as OpenAI's MXFP4 checkpoints are (quant_method
    "mxfp4"): each layer's experts as ``{gate_up,down}_proj_blocks`` / ``_scales`` of the
    transposed weights ([E, 2I, H/32, 16], [E, H, I/32, 16]), biases bfloat16, the rest
    float32 and unquantized. Returns the model with the expert weights dequantized (the
    reference), the tokenizer and the packed expert bytes."""
    import torch

    model, tok = make_gpt_oss(out_dir, seed, vocab_size)
    tensors, packed = {}, 0
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("experts.gate_up_proj") or name.endswith("experts.down_proj"):
                blocks, scales, deq = quantize_mxfp4(p.transpose(1, 2))  # [E, out, in]
                p.copy_(deq.transpose(1, 2))
                tensors[name + "_blocks"], tensors[name + "_scales"] = blocks.contiguous(), scales.contiguous()
                packed += blocks.numel() + scales.numel()
            elif name.endswith("_proj_bias") and ".experts." in name:
                p.copy_(p.to(torch.bfloat16).float())  # stored in bfloat16
                tensors[name] = p.detach().to(torch.bfloat16).contiguous()
            else:
                tensors[name] = p.detach().clone().contiguous()
    _save_checkpoint(model, tensors, out_dir, {
        "quant_method": "mxfp4",
        "modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router",
                                   "model.embed_tokens", "lm_head"]})
    return model, tok, packed


NVFP4_CONFIG = {  # llm-compressor's NVFP4 scheme (W4A4; activations with a calibrated global scale)
    "quant_method": "compressed-tensors", "format": "nvfp4-pack-quantized",
    "quantization_status": "compressed", "ignore": ["lm_head"],
    "config_groups": {"group_0": {
        "targets": ["Linear"],
        "weights": {"num_bits": 4, "type": "float", "strategy": "tensor_group", "group_size": 16,
                    "symmetric": True, "dynamic": False},
        "input_activations": {"num_bits": 4, "type": "float", "strategy": "tensor_group",
                              "group_size": 16, "symmetric": True, "dynamic": "local"}}}}


def make_llama_nvfp4(out_dir: str, seed: int = 0, vocab_size: int = 512):
    """Tiny Llama (as make_llama_fp8) saved as a compressed-tensors NVFP4 checkpoint: every linear
    of the decoder layers packed FP4 with e4m3 block scales (16) and a global scale, plus the
    input global scale calibrated on CORPUS (amax of each linear's input). Returns the
    dequantized model, the tokenizer, the checkpoint's bytes as vLLM holds them and the input
    global scales by module (for activation_reference)."""
    import torch

    tok = make_tokenizer(out_dir, vocab_size)
    model = _llama128(tok, vocab_size, seed)
    quantized = [n for n, m in model.named_modules()
                 if n.startswith("model.layers.") and n.endswith("proj") and isinstance(m, torch.nn.Linear)]
    amax = dict.fromkeys(quantized, 0.0)
    with torch.no_grad():
        hooks = [model.get_submodule(n).register_forward_pre_hook(
            lambda mod, args, n=n: amax.__setitem__(n, max(amax[n], args[0].abs().max().item())))
            for n in quantized]
        for text in CORPUS:
            model(torch.tensor([tok(text)["input_ids"]]))
        for h in hooks:
            h.remove()
    # one weight global scale per group of layers vLLM fuses (q/k/v, gate/up), as llm-compressor
    # writes them: vLLM keeps one per fused layer (the largest) for all its parts
    def fused(mod):
        return mod.rsplit(".", 1)[0] + (".qkv" if mod[-6:] in ("q_proj", "k_proj", "v_proj") else
                                        ".gate_up" if mod[-7:] in ("gate_proj", "up_proj") else mod[-7:])

    wmax: dict[str, float] = {}
    for mod in amax:
        w = model.get_submodule(mod).weight
        wmax[fused(mod)] = max(wmax.get(fused(mod), 0.0), w.abs().max().item())
    tensors, held, input_scales = {}, 0, {}
    with torch.no_grad():
        for name, p in model.named_parameters():
            mod = name[:-len(".weight")]
            if mod in amax:
                packed, s, g, deq = quantize_nvfp4_weight(p, 448.0 * 6.0 / wmax[fused(mod)])
                p.copy_(deq)
                tensors.update({mod + ".weight_packed": packed, mod + ".weight_scale": s,
                                mod + ".weight_global_scale": g,
                                mod + ".input_global_scale": torch.tensor([448.0 * 6.0 / amax[mod]])})
                input_scales[mod] = 448.0 * 6.0 / amax[mod]
                held += packed.numel() + s.numel() + 8
            else:
                tensors[name] = p.detach().clone().contiguous()
                held += 2 * p.numel()
    _save_checkpoint(model, tensors, out_dir, NVFP4_CONFIG)
    return model, tok, held, input_scales


def activation_reference(model, scheme: str, input_scales: dict | None = None):
    """Makes ``model`` (a dequantized checkpoint from make_llama_fp8 / make_llama_nvfp4) also
    quantize each quantized linear's input as the checkpoint prescribes, in float32 on CPU: the
    W8A8 / W4A4 arithmetic vLLM runs, computed independently. "block": fp8 per 1x128 group,
    "channel": fp8 per token (scale amax / 448); "nvfp4": e2m1 per 16 with e4m3 block scales
    under the module's input global scale (``input_scales[name]``, a multiplier)."""
    import torch

    def fp8(x):
        g = x.float().reshape(*x.shape[:-1], -1, 128) if scheme == "block" else x.float().unsqueeze(-2)
        s = (g.abs().amax(-1, keepdim=True) / 448.0).clamp(min=1e-12)
        return ((g / s).clamp(-448, 448).to(torch.float8_e4m3fn).float() * s).reshape(x.shape).to(x.dtype)

    def fp4(x, gs):
        b = x.float().reshape(*x.shape[:-1], -1, 16)
        s = (b.abs().amax(-1, keepdim=True) / 6.0 * gs).clamp(max=448.0).to(torch.float8_e4m3fn).float()
        step = s / gs
        v = torch.where(step > 0, b / step.clamp(min=1e-30), torch.zeros_like(b)).clamp(-6, 6)
        return (_e2m1(v)[1] * step).reshape(x.shape).to(x.dtype)

    for name, m in model.named_modules():
        if name.startswith("model.layers.") and name.endswith("proj") and isinstance(m, torch.nn.Linear):
            if scheme == "nvfp4":
                gs = input_scales[name]
                m.register_forward_pre_hook(lambda mod, args, gs=gs: (fp4(args[0], gs),) + tuple(args[1:]))
            else:
                m.register_forward_pre_hook(lambda mod, args: (fp8(args[0]),) + tuple(args[1:]))
    return model


MODELS = {"qwen3": make_qwen3, "gemma": make_gemma, "qwen3_moe": make_qwen3_moe, "mixtral": make_mixtral,
          "gemma2": make_gemma2, "gemma3": make_gemma3, "gpt_oss": make_gpt_oss}


def hf_greedy(model, tok, prompts: list[str], max_tokens: int) -> list[list[int]]:
    """Hugging Face greedy decoding on CPU, one prompt at a time (no padding), EOS ignored."""
    return [hf_greedy_ids(model, tok(p)["input_ids"], max_tokens, tok.pad_token_id) for p in prompts]


def hf_greedy_ids(model, ids: list[int], max_tokens: int, pad_token_id: int | None = None) -> list[int]:
    """Hugging Face greedy decoding on CPU of one prompt given as token ids, EOS ignored."""
    import torch

    t = torch.tensor([ids])
    with torch.no_grad():
        g = model.generate(t, max_new_tokens=max_tokens, min_new_tokens=max_tokens, do_sample=False,
                           eos_token_id=None,
                           pad_token_id=model.config.pad_token_id if pad_token_id is None else pad_token_id)
    return g[0, len(ids):].tolist()


def _completion(c) -> dict:
    lps = None
    if c.logprobs is not None:  # per generated token: [[token_id, logprob, rank], ...]
        lps = [[[int(t), float(lp.logprob), lp.rank] for t, lp in step.items()] for step in c.logprobs]
    return {"token_ids": list(c.token_ids), "text": c.text, "finish_reason": c.finish_reason,
            "stop_reason": c.stop_reason, "logprobs": lps}


def _piece_programs() -> int:
    """Programs built so far for vLLM's compiled pieces (torchtpu/vllm/compiler.py)."""
    mod = sys.modules.get("torchtpu.vllm.compiler")
    return mod.stats["programs"] if mod is not None else 0


def _sampling_params(d: dict):
    """SamplingParams from JSON; "structured_outputs" as StructuredOutputsParams' fields."""
    from vllm import SamplingParams
    from vllm.sampling_params import StructuredOutputsParams

    d = dict(d)
    if "structured_outputs" in d:
        d["structured_outputs"] = StructuredOutputsParams(**d["structured_outputs"])
    return SamplingParams(**d)


def xgrammar_json_greedy(model, tok, prompt: str, schema: dict, max_tokens: int) -> list[int]:
    """The reference for vLLM's JSON-schema structured output: Hugging Face greedy decoding on
    CPU, each step's logits masked by xgrammar's matcher for the schema, built as vLLM's
    xgrammar backend builds it (v1/structured_output/backend_xgrammar.py: the tokenizer's
    vocabulary without special tokens, EOS the stop token, any whitespace); ends after the
    matcher accepts EOS (included, as vLLM's token ids include it)."""
    import torch
    import xgrammar as xgr

    full = xgr.TokenizerInfo.from_huggingface(tok, vocab_size=model.config.vocab_size)
    special = {i for i, t in getattr(tok, "added_tokens_decoder", {}).items() if t.special}
    enc = [""] * full.vocab_size
    for t, i in tok.get_vocab().items():
        if i < len(enc) and i not in special:
            enc[i] = t
    info = xgr.TokenizerInfo.from_vocab_and_metadata(enc, full.dump_metadata())
    grammar = xgr.GrammarCompiler(info).compile_json_schema(json.dumps(schema), any_whitespace=True)
    matcher = xgr.GrammarMatcher(grammar)
    bitmask = xgr.allocate_token_bitmask(1, info.vocab_size)
    ids, out = tok(prompt)["input_ids"], []
    for _ in range(max_tokens):
        with torch.no_grad():
            logits = model(torch.tensor([ids + out])).logits[0, -1:].float()
        matcher.fill_next_token_bitmask(bitmask)
        xgr.apply_token_bitmask_inplace(logits, bitmask)
        t = int(logits.argmax())
        out.append(t)
        assert matcher.accept_token(t), t
        if matcher.is_terminated():
            break
    return out


def _worker_report(worker) -> dict:
    """Runs in each vLLM worker (``LLM.collective_rpc``): its device, process group backend and
    torchtpu's counters there (the driver's own counters do not see worker processes)."""
    import torch.distributed as dist

    import torchtpu

    m = torchtpu.metrics()
    model = worker.model_runner.get_model()
    by_dtype: dict[str, int] = {}
    for t in list(model.parameters()) + list(model.buffers()):
        by_dtype[str(t.dtype)] = by_dtype.get(str(t.dtype), 0) + t.numel() * t.element_size()
    return {"device": str(worker.device), "rank": dist.get_rank() if dist.is_initialized() else None,
            # torch.tpu.memory_allocated() over the model's load (vLLM's DeviceMemoryProfiler)
            "model_memory": worker.model_runner.model_memory_usage, "weight_bytes_by_dtype": by_dtype,
            # the MoE layers' quantization methods (class names)
            "quant_methods": sorted({type(m.quant_method).__name__ for m in model.modules()
                                     if any(c.__name__ == "RoutedExperts" for c in type(m).__mro__)
                                     and getattr(m, "quant_method", None) is not None}),
            "backend": str(dist.get_backend()) if dist.is_initialized() else None,
            "runner_attrs": sorted(vars(worker.model_runner)),
            "cpu_fallbacks": m["cpu_fallbacks"], "native_executions": m["native_executions"]}


def run(spec: dict) -> dict:
    """Runs vLLM's offline LLM on spec["model"]: each of spec["batches"] (lists of prompts) is one
    ``generate`` call on the same engine; returns token ids, cache hits and torchtpu metrics."""
    from vllm import LLM, SamplingParams

    try:
        llm = LLM(model=spec["model"], **spec.get("llm_kwargs", {}))
        sampling = spec.get("sampling", {})
        # one SamplingParams for all prompts, or a list (one per prompt)
        sp = ([_sampling_params(d) for d in sampling] if isinstance(sampling, list)
              else _sampling_params(sampling))
        import torchtpu

        batches = []
        for prompts in spec["batches"]:
            m0 = torchtpu.metrics()
            comp_stats = sys.modules["torchtpu.vllm.compiler"].stats if "torchtpu.vllm.compiler" in sys.modules else {}
            calls0 = comp_stats.get("calls", 0)
            compiles = m0["compiles"]  # this process's (0 with an engine-core process)
            programs = _piece_programs()
            lora = None
            if spec.get("lora"):  # one LoRARequest (or None) per prompt: [name, id, path]
                from vllm.lora.request import LoRARequest

                lora = [LoRARequest(*x) if x else None for x in spec["lora"]]
            outs = llm.generate(prompts, sp, use_tqdm=False, lora_request=lora)
            m1 = torchtpu.metrics()
            batches.append({
                "compiles": m1["compiles"] - compiles,
                "executions": m1["executions"] - m0["executions"],  # device programs run
                "model_calls": comp_stats.get("calls", 0) - calls0,  # compiled steps: one per step
                "piece_programs": _piece_programs() - programs,  # compiled steps' new programs
                "prompt_token_ids": [list(o.prompt_token_ids) for o in outs],
                "token_ids": [list(o.outputs[0].token_ids) for o in outs],
                "num_cached_tokens": [o.num_cached_tokens or 0 for o in outs],
                # every completion of every request (n > 1), with text, finish reason, logprobs
                "outputs": [[_completion(c) for c in o.outputs] for o in outs],
            })
        workers = llm.collective_rpc(_worker_report) if spec.get("worker_report") else None
        counters = {}
        if spec.get("llm_kwargs", {}).get("disable_log_stats") is False:
            for mt in llm.get_metrics():  # vLLM's own stats (Prometheus-style counters/gauges)
                if hasattr(mt, "value"):
                    counters[mt.name] = counters.get(mt.name, 0) + mt.value
    except BaseException:
        # report before `llm` is collected: its shutdown crashes on "tpu" (docs/vllm.md)
        import traceback

        traceback.print_exc()
        sys.stderr.flush()
        os._exit(1)
    import torchtpu
    from vllm.platforms import current_platform

    m = torchtpu.metrics()
    # `llm` is not deleted: vLLM's engine shutdown calls torch.accelerator.empty_host_cache(),
    # which crashes on "tpu" (no host allocator registered; docs/vllm.md). The driver exits
    # with os._exit right after printing.
    return {
        "batches": batches,
        "workers": workers,
        "counters": counters,
        "platform": type(current_platform).__qualname__,
        "cpu_fallbacks": m["cpu_fallbacks"],
        "vllm_compiler": dict(sys.modules["torchtpu.vllm.compiler"].stats)
        if "torchtpu.vllm.compiler" in sys.modules else None,
        "native_executions": m["native_executions"],
    }


if __name__ == "__main__":
    if sys.argv[1] == "run":
        with open(sys.argv[2]) as f:
            spec = json.load(f)
        try:
            result = run(spec)
        except BaseException:
            import traceback

            traceback.print_exc()
            sys.stdout.flush()
            sys.stderr.flush()
            # not through interpreter teardown: vLLM's engine shutdown calls
            # torch.accelerator.empty_host_cache(), which crashes on "tpu" (docs/vllm.md)
            os._exit(1)
        sys.stdout.flush()
        print("RESULT " + json.dumps(result), flush=True)
        os._exit(0)  # skip interpreter teardown of engine threads
