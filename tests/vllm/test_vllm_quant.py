"""Quantized checkpoints (FP8, NVFP4, gpt-oss MXFP4) through vLLM on tpu (torchtpu/vllm/quant.py): vLLM's own quantization
methods load the packed tensors; torchtpu's kernels, registered with vLLM's public
``register_linear_kernel``, run them on the device.

Reference: the same checkpoint dequantized, run by Hugging Face transformers on CPU in float32.
vLLM runs bfloat16 and quantizes activations to fp8 as the checkpoint prescribes ("dynamic"):
on these tiny random models that moves logits by up to ~0.45 (their spread is ~1.1; measured on
CPU: the reference with and without tiny.activation_reference), and fp8 rounding amplifies
bf16's differences, so no CPU run reproduces the tokens bit for bit. The end-to-end check is
therefore teacher forcing: each greedy token must be a near-argmax of the reference's logits
for its own prefix, and nearly all must be the exact argmax; a wrong scale layout or kernel
gives logits off by several units. The kernels themselves are checked tightly against the same
arithmetic on CPU (test_kernels_match_cpu). Weights must stay packed on the device: the memory vLLM measures over the load
(torch.tpu.memory_allocated) is the checkpoint's tensors, not their bfloat16 expansion.
"""
import os
import sys

import pytest

pytest.importorskip("vllm.v1.attention.backend", reason="vLLM is not installed (bash tools/install_vllm.sh)")
pytest.importorskip("transformers")

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import tiny  # noqa: E402
from test_vllm_offline import _has_entry_point, run_llm  # noqa: E402

pytestmark = pytest.mark.skipif(not _has_entry_point(), reason="torchtpu's vllm.platform_plugins entry point missing")

PROMPTS = ["The quick brown fox", "Paged attention reads keys", "Hello world! Numbers", "A tiny"]
MAX_TOKENS = 12
LLM_KWARGS = dict(dtype="bfloat16", enforce_eager=True, max_model_len=128, max_num_seqs=4,
                  max_num_batched_tokens=128, gpu_memory_utilization=0.3, seed=0)
GREEDY = dict(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True)


def _teacher_forced_gaps(model, prompt_ids, generated):
    """For each generated token: reference max logit - reference logit of that token."""
    import torch

    gaps = []
    for p_ids, g in zip(prompt_ids, generated):
        assert len(g) == MAX_TOKENS
        with torch.no_grad():
            logits = model(torch.tensor([p_ids + g])).logits[0, len(p_ids) - 1:-1]
        gaps.append((logits.max(-1).values - logits[torch.arange(len(g)), torch.tensor(g)]).tolist())
    return gaps


@pytest.mark.parametrize("scheme", ["block", pytest.param("channel", marks=pytest.mark.slow)])
def test_fp8_checkpoint(tmp_path, scheme):
    """fine-grained FP8 (quant_method fp8, 128x128 blocks) and compressed-tensors FP8 (per-channel
    weights, dynamic per-token activations): vLLM picks torchtpu's kernels, the weights stay
    float8_e4m3fn on the device, and the tokens are the dequantized checkpoint's."""
    d = str(tmp_path / "ckpt")
    model, tok, held = tiny.make_llama_fp8(d, scheme)
    res = run_llm(tmp_path, {"model": d, "batches": [PROMPTS], "llm_kwargs": LLM_KWARGS,
                             "sampling": GREEDY, "worker_report": True})
    b = res["batches"][0]
    gaps = _teacher_forced_gaps(model, b["prompt_token_ids"], b["token_ids"])
    assert max(max(g) for g in gaps) < 0.5, gaps
    # most tokens are the exact argmax (a near-tie may flip under bf16 + fp8 activations)
    exact = sum(x == 0.0 for g in gaps for x in g)
    assert exact >= 0.85 * len(PROMPTS) * MAX_TOKENS, gaps
    (w,) = res["workers"]
    fp8 = w["weight_bytes_by_dtype"].get("torch.float8_e4m3fn", 0)
    # 2 layers x (q, k, v, o: 128x128; gate, up: 256x128; down: 128x256) in one byte each
    assert fp8 == 2 * (4 * 128 * 128 + 3 * 256 * 128), w["weight_bytes_by_dtype"]
    # the load's device memory is the checkpoint's tensors (fp8 + f32 scales + bf16 rest),
    # not the bf16 expansion of the quantized weights (that would be `held` + fp8 bytes)
    assert 0.95 * held <= w["model_memory"] <= 1.05 * held, (w["model_memory"], held)
    assert w["cpu_fallbacks"] == {}, w["cpu_fallbacks"]


def test_nvfp4_checkpoint(tmp_path):
    """compressed-tensors NVFP4 (W4A4: packed e2m1 weights, e4m3 scales per 16, global scales
    shared by fused layers, calibrated input global scales): vLLM's CompressedTensorsW4A4Fp4
    scheme picks torchtpu's kernel; the weights stay packed (one byte per two values) and the
    load's device memory is the checkpoint's tensors.

    Tokens: W4A4 on these tiny random models is chaotic under bfloat16 -- on CPU, the same
    W4A4 arithmetic (tiny.activation_reference) in bfloat16 and in float32 moves logits by up
    to ~1.1 (their spread is ~1.1) -- so no reference fixes the tokens; each greedy token is
    checked to be within twice that noise of the dequantized checkpoint's argmax, and many
    must be its exact argmax (a random token is 1 in 512). The arithmetic itself is checked
    tightly by test_nvfp4_kernel_matches_vllm_emulation."""
    d = str(tmp_path / "ckpt")
    model, tok, held, _ = tiny.make_llama_nvfp4(d)
    res = run_llm(tmp_path, {"model": d, "batches": [PROMPTS, PROMPTS], "llm_kwargs": LLM_KWARGS,
                             "sampling": GREEDY, "worker_report": True})
    b = res["batches"][0]
    assert res["batches"][1]["token_ids"] == b["token_ids"]  # greedy is deterministic
    gaps = _teacher_forced_gaps(model, b["prompt_token_ids"], b["token_ids"])
    assert max(max(g) for g in gaps) < 2.2, gaps
    assert sum(x == 0.0 for g in gaps for x in g) >= 0.4 * len(PROMPTS) * MAX_TOKENS, gaps
    (w,) = res["workers"]
    # 2 layers x (4 x 128x128 + 3 x 256x128) values, two per uint8
    assert w["weight_bytes_by_dtype"].get("torch.uint8", 0) == 2 * (4 * 128 * 128 + 3 * 256 * 128) // 2
    assert 0.95 * held <= w["model_memory"] <= 1.05 * held, (w["model_memory"], held)
    assert w["cpu_fallbacks"] == {}, w["cpu_fallbacks"]


def _against_dequantized(tmp_path, d, model, tok):
    """Serves checkpoint ``d`` and the same weights dequantized (``model``, saved unquantized) on
    the same vLLM; their tokens must be equal, and near-argmaxes of ``model`` on CPU in float32
    (bound 0.6: a router near-tie that bfloat16 flips moves one step's logits by ~0.5; all but
    two gaps must be bfloat16 noise, < 0.05). Returns the checkpoint's and the reference's
    worker reports."""
    plain = str(tmp_path / "dequantized")
    tiny.save_dequantized(model, tok, plain)
    spec = {"batches": [PROMPTS], "llm_kwargs": LLM_KWARGS, "sampling": GREEDY, "worker_report": True}
    res = run_llm(tmp_path, dict(spec, model=d))
    ref = run_llm(tmp_path, dict(spec, model=plain))
    b = res["batches"][0]
    assert b["token_ids"] == ref["batches"][0]["token_ids"]
    gaps = _teacher_forced_gaps(model, b["prompt_token_ids"], b["token_ids"])
    assert max(max(g) for g in gaps) < 0.6, gaps
    assert sum(x < 0.05 for g in gaps for x in g) >= len(PROMPTS) * MAX_TOKENS - 2, gaps
    return res["workers"][0], ref["workers"][0]


def test_gpt_oss_mxfp4_checkpoint(tmp_path):
    """gpt-oss MXFP4 (OpenAI's layout: expert blocks and e8m0 scales, bf16 biases, the rest
    unquantized): vLLM loads it with torchtpu's MoE method (TpuGptOssMxfp4MoEMethod), the
    experts stay packed on the device and run W4A16 on weights dequantized in the step.

    References: (1) the same checkpoint dequantized (transformers' own MXFP4 decoding agrees
    with tiny.quantize_mxfp4) and saved unquantized, served by the same vLLM on tpu in bfloat16:
    the tokens must be equal; (2) that model on CPU in float32 (transformers): teacher forcing,
    each token a near-argmax. Bound 0.6: this tiny model has a router near-tie (layer 0, the
    prompt's first token: 2nd and 3rd expert logits 0.006 apart) that bfloat16 flips; it moves
    one step's logits by ~0.5 (measured); elsewhere the gaps are bfloat16 noise (< 0.05)."""
    d = str(tmp_path / "ckpt")
    model, tok, packed = tiny.make_gpt_oss_mxfp4(d)
    w, ref = _against_dequantized(tmp_path, d, model, tok)
    # the experts' packed blocks and scales, and nothing else, in uint8
    assert w["weight_bytes_by_dtype"].get("torch.uint8", 0) == packed, w["weight_bytes_by_dtype"]
    assert w["quant_methods"] == ["TpuGptOssMxfp4MoEMethod"], w["quant_methods"]
    assert ref["quant_methods"] == ["TpuUnquantizedFusedMoEMethod"]
    # the packed experts (4.25 bits a value) load in less memory than the bf16 ones
    assert w["model_memory"] < ref["model_memory"]
    assert w["cpu_fallbacks"] == {}, w["cpu_fallbacks"]


def test_fp8_moe_checkpoint(tmp_path):
    """Fine-grained FP8 MoE experts (Qwen3-MoE-FP8 layout: per-expert gate/up/down with 128x128
    ``weight_scale_inv``; routers and, here, attention unquantized): vLLM's Fp8Config loads them
    into torchtpu's TpuFp8MoEMethod (vLLM has no FP8 MoE backend out of tree), which dequantizes
    the experts inside the step (W8A16). The tokens equal the dequantized checkpoint served by
    the same engine (both round the same f32 products to bf16), and are near-argmaxes of that
    checkpoint on HF CPU in float32 (bound as the MXFP4 test's: routing near-ties may flip)."""
    d = str(tmp_path / "ckpt")
    model, tok, fp8 = tiny.make_qwen3_moe_fp8(d, attention=False)
    w, ref = _against_dequantized(tmp_path, d, model, tok)
    assert w["weight_bytes_by_dtype"].get("torch.float8_e4m3fn", 0) == fp8, w["weight_bytes_by_dtype"]
    assert w["quant_methods"] == ["TpuFp8MoEMethod"], w["quant_methods"]
    assert w["model_memory"] < ref["model_memory"]
    assert w["cpu_fallbacks"] == {}, w["cpu_fallbacks"]


def _fp8_case(kind, M, N, K, seed=0):
    """(kernel, layer on tpu, reference weight f32 (N, K)) for one FP8 layout, built as vLLM's
    quantization methods build them (the scheme stores per-channel/tensor weights as (K, N))."""
    import torch
    from vllm.model_executor.kernels.linear import FP8ScaledMMLinearLayerConfig
    from vllm.model_executor.layers.quantization.utils import quant_utils as qu

    from torchtpu.vllm.quant import TpuBlockFP8Kernel, TpuFP8ScaledMMKernel

    g = torch.Generator().manual_seed(seed)
    w = torch.randn(N, K, generator=g) * 0.1
    layer = torch.nn.Module()
    if kind == "block":
        q, s, deq = tiny.quantize_fp8_blocks(w)
        act, wk, cls = qu.kFp8Dynamic128Sym, qu.kFp8Static128BlockSym, TpuBlockFP8Kernel
        params = {"weight": q, "weight_scale_inv": s}
    else:
        act = {"token_channel": qu.kFp8DynamicTokenSym, "tensor_tensor": qu.kFp8DynamicTensorSym,
               "tensor_channel": qu.kFp8DynamicTensorSym}[kind]
        if kind.endswith("channel"):
            q, s, deq = tiny.quantize_fp8_channels(w)
            wk = qu.kFp8StaticChannelSym
        else:
            s = (w.abs().amax() / 448.0).reshape(1)
            q = (w / s).clamp(-448, 448).to(torch.float8_e4m3fn)
            deq, wk = q.float() * s, qu.kFp8StaticTensorSym
        cls = TpuFP8ScaledMMKernel
        params = {"weight": q.t(), "weight_scale": s}  # (K, N): as vLLM's FP8 schemes leave it
    cfg = FP8ScaledMMLinearLayerConfig(weight_quant_key=wk, activation_quant_key=act,
                                       input_dtype=torch.float32, out_dtype=torch.float32,
                                       weight_shape=(N, K))
    ok, why = cls.is_supported()
    assert ok, why
    ok, why = cls.can_implement(cfg)
    assert ok, why
    kernel = cls(cfg) if kind == "block" else cls(cfg, ["weight", "weight_scale", "input_scale", "input_scale_ub"])
    for name, t in params.items():
        layer.register_parameter(name, torch.nn.Parameter(t.to("tpu"), requires_grad=False))
    kernel.process_weights_after_loading(layer)
    return kernel, layer, deq


@pytest.mark.parametrize("kind,M,N,K", [("block", 5, 384, 256), ("block", 3, 384, 128),
                                        ("token_channel", 7, 192, 96), ("tensor_tensor", 4, 64, 80),
                                        ("tensor_channel", 1, 48, 32)])
def test_kernels_match_cpu(kind, M, N, K):
    """Each kernel's output on tpu against the same arithmetic on CPU in float64: vLLM's own
    activation quantizer (its native torch code, run on tpu), dequantized operands, one matmul."""
    import torch
    from vllm.platforms import current_platform

    from torchtpu.vllm.platform import TpuPlatform

    if not isinstance(current_platform, TpuPlatform):
        pytest.skip(f"vLLM's current platform here is {type(current_platform).__name__}")
    from vllm.config import VllmConfig, set_current_vllm_config

    x = torch.randn(M, K, generator=torch.Generator().manual_seed(1))
    with set_current_vllm_config(VllmConfig()):  # as vLLM's own kernel tests (default_vllm_config)
        kernel, layer, deq = _fp8_case(kind, M, N, K)
        out = kernel.apply_weights(layer, x.to("tpu")).cpu()
        xq, xs = kernel.quant_fp8(x.to("tpu"))  # the activations apply_weights quantized
    xq, xs = xq.cpu().double(), xs.cpu().double()
    xs = xs.repeat_interleave(128, dim=1)[:, :K] if kind == "block" else xs.reshape(-1, 1)
    want = (xq * xs) @ deq.double().T
    assert out.shape == (M, N) and out.dtype == torch.float32
    torch.testing.assert_close(out.double(), want, rtol=1e-5, atol=1e-5 * want.abs().max().item())


@pytest.mark.parametrize("M,N,K", [(5, 96, 64), (1, 256, 128), (33, 48, 256)])
def test_nvfp4_kernel_matches_vllm_emulation(M, N, K):
    """torchtpu's NVFP4 kernel on tpu (packed operands, torchtpu::block_scaled_mm) against vLLM's
    own NVFP4 emulation (dequantize, f32 matmul) run on CPU with the same layer tensors, as the
    compressed-tensors scheme leaves them after loading. Activations are quantized to fp4 on
    both sides (an element within float rounding of an fp4 boundary could round the other way:
    the bound is on the relative error of the whole output)."""
    import torch
    from vllm.model_executor.layers.quantization.utils.nvfp4_emulation_utils import run_nvfp4_emulations
    from vllm.platforms import current_platform

    from torchtpu.vllm.platform import TpuPlatform
    from torchtpu.vllm.quant import TpuNvFp4Kernel

    if not isinstance(current_platform, TpuPlatform):
        pytest.skip(f"vLLM's current platform here is {type(current_platform).__name__}")
    g = torch.Generator().manual_seed(M + N)
    w = torch.randn(N, K, generator=g) * 0.1
    x = torch.randn(M, K, generator=g)
    packed, s, wgs, _ = tiny.quantize_nvfp4_weight(w)
    igs = torch.tensor(448.0 * 6.0 / x.abs().max().item())  # the checkpoint's input_global_scale
    cpu = {"weight": packed, "weight_scale": s, "weight_global_scale": 1.0 / wgs.reshape(()),
           "input_global_scale": 1.0 / igs, "input_global_scale_inv": igs}
    cpu["alpha"] = cpu["input_global_scale"] * cpu["weight_global_scale"]
    layer = torch.nn.Module()
    for name, t in cpu.items():
        layer.register_parameter(name, torch.nn.Parameter(t.to("tpu"), requires_grad=False))
    kernel = TpuNvFp4Kernel(None)
    kernel.process_weights_after_loading(layer)
    out = kernel.apply_weights(layer, x.to("tpu")).cpu()
    want = run_nvfp4_emulations(x=x, input_global_scale=igs, weight=packed, weight_scale_swizzled=s,
                                weight_global_scale=cpu["weight_global_scale"], swizzle=False)
    assert out.shape == want.shape == (M, N)
    rel = ((out - want).norm() / want.norm()).item()
    assert rel < 1e-4, rel  # measured: ~3e-7
