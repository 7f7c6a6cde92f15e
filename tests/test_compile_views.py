"""torch.compile(backend="tpu") on views and in-place writes into views of
non-contiguous intermediates (issue 39, item 6): functionalization turns a
write into a view into slice/select/diagonal_scatter and views the result back
into its base, so the scatter must keep its input's strides as eager does.
Before the fix Longformer, LED and Funnel failed only compiled with "Cannot
view a tensor with shape ... and strides ...". Every case runs against CPU
eager."""
import pytest
import torch

import torchtpu  # noqa: F401


@pytest.fixture(autouse=True)
def _reset_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _compiled_matches_cpu(fn, *args, atol=1e-5):
    ref = fn(*[a.clone() for a in args])
    got = torch.compile(fn, backend="tpu", fullgraph=True)(*[a.to("tpu") for a in args])
    refs, gots = (ref, got) if isinstance(ref, tuple) else ((ref,), (got,))
    for r, g in zip(refs, gots):
        assert g.device.type == "tpu"
        assert g.shape == r.shape and g.stride() == r.stride()
        torch.testing.assert_close(g.cpu(), r, atol=atol, rtol=1e-5)


def longformer_pattern(x):
    # _sliding_chunks_query_key_matmul + _mask_invalid_locations: writes into
    # slices of a zeros buffer, views it, transposes, then a setitem into a
    # slice of the transposed view
    s = x.new_zeros(8, 4, 4, 9)
    s[:, :-1, :, 4:] = x[:, :, :4, :5]
    s[:, -1, :, 4:] = x[:, -1, 4:, :5]
    s[:, 1:, :, :4] = x[:, :, -5:-1, 5:]
    s[:, 0, 1:4, 1:4] = x[:, 0, :3, -3:]
    s = s.view(2, 4, 16, 9).transpose(2, 1)
    mask = torch.ones(4, 5, device=x.device).tril().flip(dims=[0])[None, :, None, :].expand(2, 4, 4, 5).bool()
    s[:, :4, :, :5] = torch.full_like(s[:, :4, :, :5], -1.0).where(mask, s[:, :4, :, :5])
    return s * 1


def funnel_pattern(q, r, mask):
    # _relative_shift_gather, then an in-place multiply of the gathered view
    pa = torch.einsum("binh,tnh->bnit", q, r)
    pa = torch.reshape(pa, [2, 2, 24, 12])[:, :, 1:, :]
    pa = torch.reshape(pa, [2, 2, 12, 23])[..., :12]
    pa *= mask
    return pa


def select_pattern(x):
    t = (x * 2).transpose(0, 1)  # a non-contiguous intermediate
    t[1] = -t[1]                 # select_scatter
    t[:, 2].zero_()              # select on another dim
    return t.reshape(-1), t.sum(0)


def diagonal_pattern(x):
    t = (x + 1).permute(2, 0, 1)
    t.diagonal(offset=1, dim1=1, dim2=2).mul_(10)
    t.diagonal(offset=-2, dim1=1, dim2=2).fill_(3)
    return t.contiguous().view(-1), t


def strided_slice_pattern(x):
    t = (x - 1).t()
    t[::2, 1::3] = 7.0
    t[-3:, :-1] += 1
    return t.view_as(t), t.sum()


def test_longformer_pattern():
    _compiled_matches_cpu(longformer_pattern, torch.randn(8, 3, 8, 9))


def test_funnel_pattern():
    _compiled_matches_cpu(funnel_pattern, torch.randn(2, 12, 2, 8), torch.randn(24, 2, 8),
                          torch.randn(2, 1, 12, 12))


@pytest.mark.parametrize("fn,shape", [(select_pattern, (4, 5, 3)), (diagonal_pattern, (5, 6, 3)),
                                      (strided_slice_pattern, (7, 10))])
def test_view_scatter_patterns(fn, shape):
    _compiled_matches_cpu(fn, torch.randn(*shape))


@pytest.mark.parametrize("case", [
    ("slice", dict(dim=1, start=1, end=None, step=2)),
    ("slice", dict(dim=0, start=-3, end=-1, step=1)),
    ("slice", dict(dim=2, start=None, end=100, step=3)),
    ("select", dict(dim=1, index=-1)),
    ("select", dict(dim=2, index=0)),
    ("diagonal", dict(offset=0, dim1=0, dim2=1)),
    ("diagonal", dict(offset=2, dim1=2, dim2=1)),
    ("diagonal", dict(offset=-1, dim1=0, dim2=2)),
])
def test_scatter_ops_match_cpu(case):
    kind, kw = case
    torch.manual_seed(0)
    x = torch.randn(4, 6, 5)
    view = {"slice": lambda t: torch.ops.aten.slice(t, kw["dim"], kw["start"], kw["end"], kw["step"]),
            "select": lambda t: t.select(kw["dim"], kw["index"]),
            "diagonal": lambda t: t.diagonal(kw["offset"], kw["dim1"], kw["dim2"])}[kind]
    scatter = {"slice": torch.slice_scatter, "select": torch.select_scatter,
               "diagonal": torch.diagonal_scatter}[kind]
    src = torch.randn(view(x).shape)
    # eager tpu
    torch.testing.assert_close(scatter(x.to("tpu"), src.to("tpu"), **kw).cpu(), scatter(x, src, **kw))
    # compiled, into a non-contiguous intermediate (the result keeps its strides)
    _compiled_matches_cpu(lambda xt, s: scatter(xt.transpose(0, 2) * 1, s, **kw),
                          x.transpose(0, 2).contiguous(), src)


_TINY = {
    "longformer": ("LongformerConfig", "LongformerModel",
                   dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=37,
                        attention_window=[4], vocab_size=99, max_position_embeddings=64)),
    "led": ("LEDConfig", "LEDModel",
            dict(d_model=32, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
                 decoder_attention_heads=2, encoder_ffn_dim=37, decoder_ffn_dim=37, attention_window=[4],
                 vocab_size=99, max_encoder_position_embeddings=64, max_decoder_position_embeddings=64)),
    "funnel": ("FunnelConfig", "FunnelModel",
               dict(d_model=32, n_head=2, d_head=8, d_inner=37, block_sizes=[1, 1], vocab_size=99,
                    num_decoder_layers=1)),
}


@pytest.mark.parametrize("name", sorted(_TINY))
def test_tiny_hf_model_compiled_matches_cpu(name):
    transformers = pytest.importorskip("transformers")
    cfg_cls, model_cls, kw = _TINY[name]
    torch.manual_seed(0)
    model = getattr(transformers, model_cls)(getattr(transformers, cfg_cls)(**kw)).eval()
    ids = torch.randint(0, 99, (2, 16))
    inputs = {"input_ids": ids}
    if name == "led":
        inputs["decoder_input_ids"] = ids[:, :5]
    with torch.no_grad():
        ref = model(**inputs)[0]
        compiled = torch.compile(model.to("tpu"), backend="tpu")
        got = compiled(**{k: v.to("tpu") for k, v in inputs.items()})[0]
    torch.testing.assert_close(got.cpu(), ref, atol=1e-3, rtol=1e-3)
