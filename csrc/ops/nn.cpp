// NN ops: softmax / log_softmax (+backward), layer norm (+backward), gelu,
// activation backwards, nll_loss (1d and 2d), mse_loss, embedding backward.
// Math runs in ComputeType(out) (f16/bf16 upcast to f32).
#include <cmath>

#include "nn_util.h"
#include "registry.h"

namespace tt::ops {
namespace {

Dims Iota(int64_t a, int64_t b) {
  Dims d;
  for (int64_t i = a; i < b; ++i) d.push_back(i);
  return d;
}

// Reduce over `dims` keeping them, then broadcast back to v's shape.
Value SumKeep(Builder& b, Value v, const Dims& dims) {
  return b.BroadcastTo(SumDims(b, v, dims, true, v.et()), v.dims());
}
Value MaxKeep(Builder& b, Value v, const Dims& dims) {
  Value m = b.Reduce(v, MinMaxInit(b, v.et(), true), dims, "maximum");
  Dims kd = v.dims();
  for (auto d : dims) kd[d] = 1;
  return b.BroadcastTo(b.Reshape(m, kd), v.dims());
}
Value S(Builder& b, const Value& like, double v) { return b.Splat(like.type, v); }

// ---- softmax family ----
template <bool Log>
std::vector<Value> Softmax(LowerCtx& c) {
  ET ct = ComputeType(c.out().et);
  Value x = Cast(c.b, c.t(0), ct);
  if (x.rank() == 0) return {Log ? c.b.Zeros(x.type) : S(c.b, x, 1.0)};
  int64_t d = NormDim(c.i64(1), x.rank());
  Value m = MaxKeep(c.b, x, {d});
  // rows that are all -inf: keep NaN like torch (x - (-inf) -> nan)
  Value sh = c.b.Sub(x, m);
  Value e = c.b.Unary("exponential", sh);
  Value s = SumKeep(c.b, e, {d});
  if (Log) return {c.b.Sub(sh, c.b.Unary("log", s))};
  return {c.b.Div(e, s)};
}
TT_LOWERINGS(({"aten::_softmax", "aten::_softmax.out"}), Softmax<false>);
TT_LOWERINGS(({"aten::_log_softmax", "aten::_log_softmax.out"}), Softmax<true>);

template <bool Log>
std::vector<Value> SoftmaxBackward(LowerCtx& c) {
  ET ct = ComputeType(c.out().et);
  Value g = Cast(c.b, c.t(0), ct), y = Cast(c.b, c.t(1), ct);
  if (g.rank() == 0) return {Log ? g : c.b.Zeros(g.type)};
  int64_t d = NormDim(c.i64(2), g.rank());
  if (Log) return {c.b.Sub(g, c.b.Mul(c.b.Unary("exponential", y), SumKeep(c.b, g, {d})))};
  Value gy = c.b.Mul(g, y);
  return {c.b.Sub(gy, c.b.Mul(y, SumKeep(c.b, gy, {d})))};
}
TT_LOWERINGS(({"aten::_softmax_backward_data", "aten::_softmax_backward_data.out"}),
             SoftmaxBackward<false>);
TT_LOWERINGS(({"aten::_log_softmax_backward_data", "aten::_log_softmax_backward_data.out"}),
             SoftmaxBackward<true>);

// ---- layer norm ----
std::vector<Value> LayerNorm(LowerCtx& c) {
  ET et = c.out(0).et;
  ET ct = ComputeType(et);
  Builder& b = c.b;
  Value x = Cast(b, c.t(0), ct);
  int64_t k = (int64_t)c.ints(1).size();
  int r = x.rank();
  Dims red = Iota(r - k, r);
  int64_t n = 1;
  for (auto d : red) n *= x.dims()[d];
  double eps = c.f64(4);
  Value mean = b.Div(SumKeep(b, x, red), S(b, x, (double)n));
  Value xc = b.Sub(x, mean);
  Value var = b.Div(SumKeep(b, b.Mul(xc, xc), red), S(b, x, (double)n));
  Value rstd = b.Unary("rsqrt", b.Add(var, S(b, x, eps)));
  Value y = b.Mul(xc, rstd);
  if (c.has(2)) y = b.Mul(y, Bcast(b, c.t(2), x.dims(), ct));
  if (c.has(3)) y = b.Add(y, Bcast(b, c.t(3), x.dims(), ct));
  // mean/rstd outputs: the reduced dims kept as size 1
  Dims kd = x.dims();
  for (auto d : red) kd[d] = 1;
  Dims start(r, 0), stride(r, 1);
  Value m1 = b.Slice(mean, start, kd, stride), r1 = b.Slice(rstd, start, kd, stride);
  return {y, b.Reshape(m1, c.out(1).dims), b.Reshape(r1, c.out(2).dims)};
}
TT_LOWERINGS(({"aten::native_layer_norm", "aten::native_layer_norm.out"}), LayerNorm);

std::vector<Value> LayerNormBackward(LowerCtx& c) {
  Builder& b = c.b;
  ET ct = ComputeType(c.t(1).et());
  Value go = Cast(b, c.t(0), ct), x = Cast(b, c.t(1), ct);
  int64_t k = (int64_t)c.ints(2).size();
  int r = x.rank();
  Dims red = Iota(r - k, r), batch = Iota(0, r - k);
  int64_t n = 1;
  for (auto d : red) n *= x.dims()[d];
  Dims kd = x.dims();
  for (auto d : red) kd[d] = 1;
  Value mean = b.BroadcastTo(b.Reshape(Cast(b, c.t(3), ct), kd), x.dims());
  Value rstd = b.BroadcastTo(b.Reshape(Cast(b, c.t(4), ct), kd), x.dims());
  Value xhat = b.Mul(b.Sub(x, mean), rstd);
  std::vector<bool> mask = c.arg(7).bools;
  std::vector<Value> res;
  if (mask.size() > 0 && mask[0]) {
    Value g = go;
    if (c.has(5)) g = b.Mul(g, Bcast(b, c.t(5), x.dims(), ct));
    Value inv_n = S(b, x, 1.0 / (double)n);
    Value mg = b.Mul(SumKeep(b, g, red), inv_n);
    Value mgx = b.Mul(SumKeep(b, b.Mul(g, xhat), red), inv_n);
    Value dx = b.Mul(rstd, b.Sub(b.Sub(g, mg), b.Mul(xhat, mgx)));
    res.push_back(dx);
  }
  auto param_grad = [&](Value v, size_t oi) {
    Value s = SumDims(b, v, batch, false, ct);
    return b.Reshape(s, c.out(oi).dims);
  };
  if (mask.size() > 1 && mask[1]) res.push_back(param_grad(b.Mul(go, xhat), res.size()));
  if (mask.size() > 2 && mask[2]) res.push_back(param_grad(go, res.size()));
  return res;
}
TT_LOWERINGS(({"aten::native_layer_norm_backward", "aten::native_layer_norm_backward.out"}),
             LayerNormBackward);

// ---- gelu ----
constexpr double kSqrt2 = 1.41421356237309504880, kSqrt2OverPi = 0.79788456080286535588,
                 kInvSqrt2Pi = 0.39894228040143267794, kKappa = 0.044715;

std::string Approx(const LowerCtx& c) {
  for (auto& a : c.args)
    if (a.kind == Arg::String) return a.s;
  return "none";
}

std::vector<Value> Gelu(LowerCtx& c) {
  Builder& b = c.b;
  Value x = Cast(b, c.t(0), ComputeType(c.out().et));
  Value half_x = b.Mul(x, S(b, x, 0.5));
  if (Approx(c) == "tanh") {
    Value inner = b.Mul(S(b, x, kSqrt2OverPi), b.Add(x, b.Mul(S(b, x, kKappa), b.Mul(x, b.Mul(x, x)))));
    return {b.Mul(half_x, b.Add(S(b, x, 1), b.Unary("tanh", inner)))};
  }
  Value erf = b.Op1("chlo.erf", {b.Div(x, S(b, x, kSqrt2))}, x.type);
  return {b.Mul(half_x, b.Add(S(b, x, 1), erf))};
}
TT_LOWERINGS(({"aten::gelu", "aten::gelu_", "aten::gelu.out"}), Gelu);

std::vector<Value> GeluBackward(LowerCtx& c) {
  Builder& b = c.b;
  ET ct = ComputeType(c.out().et);
  const Dims& d = c.out().dims;
  Value g = Bcast(b, c.t(0), d, ct), x = Bcast(b, c.t(1), d, ct);
  if (Approx(c) == "tanh") {
    Value x2 = b.Mul(x, x);
    Value inner = b.Mul(S(b, x, kSqrt2OverPi), b.Add(x, b.Mul(S(b, x, kKappa), b.Mul(x2, x))));
    Value t = b.Unary("tanh", inner);
    Value left = b.Mul(S(b, x, 0.5), x);
    Value right = b.Add(S(b, x, 1), t);
    Value ld = b.Mul(S(b, x, 0.5), right);
    Value rd = b.Mul(b.Mul(left, b.Sub(S(b, x, 1), b.Mul(t, t))),
                     b.Mul(S(b, x, kSqrt2OverPi), b.Add(S(b, x, 1), b.Mul(S(b, x, 3 * kKappa), x2))));
    return {b.Mul(g, b.Add(ld, rd))};
  }
  Value cdf = b.Mul(S(b, x, 0.5),
                    b.Add(S(b, x, 1), b.Op1("chlo.erf", {b.Div(x, S(b, x, kSqrt2))}, x.type)));
  Value pdf = b.Mul(S(b, x, kInvSqrt2Pi), b.Unary("exponential", b.Mul(S(b, x, -0.5), b.Mul(x, x))));
  return {b.Mul(g, b.Add(cdf, b.Mul(x, pdf)))};
}
TT_LOWERINGS(({"aten::gelu_backward", "aten::gelu_backward.grad_input"}), GeluBackward);

// ---- activation backwards ----
std::vector<Value> SiluBackward(LowerCtx& c) {
  Builder& b = c.b;
  ET ct = ComputeType(c.out().et);
  const Dims& d = c.out().dims;
  Value g = Bcast(b, c.t(0), d, ct), x = Bcast(b, c.t(1), d, ct);
  Value s = b.Unary("logistic", x);
  return {b.Mul(g, b.Mul(s, b.Add(S(b, x, 1), b.Mul(x, b.Sub(S(b, x, 1), s)))))};
}
TT_LOWERINGS(({"aten::silu_backward", "aten::silu_backward.grad_input"}), SiluBackward);

std::vector<Value> ThresholdBackward(LowerCtx& c) {
  Builder& b = c.b;
  ET et = c.out().et;
  ET ct = ComputeType(et);
  const Dims& d = c.out().dims;
  ET xt = PromoteET(c.t(1).et(), ct);
  Value g = Bcast(b, c.t(0), d, ct), x = Bcast(b, c.t(1), d, xt);
  Value th = Bcast(b, c.t(2), d, xt);
  return {b.Select(b.Compare(x, th, "LE"), b.Zeros(g.type), g)};
}
TT_LOWERINGS(({"aten::threshold_backward", "aten::threshold_backward.grad_input"}), ThresholdBackward);

// The derivative of tanh (1 - y^2) or of the sigmoid (y (1 - y)) from its output y.
Value DerivFromOut(Builder& b, const Value& y, bool tanh) {
  return tanh ? b.Sub(S(b, y, 1), b.Mul(y, y)) : b.Mul(b.Sub(S(b, y, 1), y), y);
}

template <bool Tanh>
std::vector<Value> OutBackward(LowerCtx& c) {
  Builder& b = c.b;
  ET ct = ComputeType(c.out().et);
  const Dims& d = c.out().dims;
  Value g = Bcast(b, c.t(0), d, ct), y = Bcast(b, c.t(1), d, ct);
  return {b.Mul(g, DerivFromOut(b, y, Tanh))};
}
TT_LOWERINGS(({"aten::sigmoid_backward", "aten::sigmoid_backward.grad_input"}), OutBackward<false>);
TT_LOWERINGS(({"aten::tanh_backward", "aten::tanh_backward.grad_input"}), OutBackward<true>);

// ---- nll_loss (class dim 1, or 0 for unbatched input) ----
struct NllParts {
  Value onehot;   // pred, input shape
  Value w;        // per-target weight (0 where ignored), target shape, ct
};
NllParts NllSetup(LowerCtx& c, Value x, Value tgt, int wi, int64_t ignore, ET ct) {
  Builder& b = c.b;
  int r = x.rank();
  int cd = r == 1 ? 0 : 1;
  Dims bd;
  for (int i = 0; i < r; ++i)
    if (i != cd) bd.push_back(i);
  tgt = Cast(b, tgt, ET::S64);
  Value cls = b.Iota(x.type.with_et(ET::S64), cd);
  Value tb = b.Broadcast(b.Reshape(tgt, [&] {
                           Dims td;
                           for (auto i : bd) td.push_back(x.dims()[i]);
                           return td;
                         }()),
                         x.dims(), bd);
  Value onehot = b.Compare(cls, tb, "EQ");
  Value valid = b.Compare(tgt, b.Splat(tgt.type, (double)ignore), "NE");
  Value w;
  if (wi >= 0 && c.has(wi)) {
    Value wt = b.Broadcast(Cast(b, c.t(wi), ct), x.dims().empty() ? Dims{} : x.dims(), {cd});
    Value sel = b.Select(onehot, wt, b.Zeros(wt.type));
    w = b.Reduce(sel, b.ScalarConst(ct, 0), {cd}, "add");
    w = b.Reshape(w, tgt.dims());
  } else {
    w = b.Splat(tgt.type.with_et(ct), 1.0);
  }
  w = b.Select(valid, w, b.Zeros(w.type));
  return {onehot, w};
}

std::vector<Value> NllForward(LowerCtx& c) {
  Builder& b = c.b;
  ET ct = ComputeType(c.out(0).et);
  Value x = Cast(b, c.t(0), ct);
  int64_t red = c.i64(3), ignore = c.i64(4);
  auto p = NllSetup(c, x, c.t(1), 2, ignore, ct);
  int cd = x.rank() == 1 ? 0 : 1;
  Value picked = b.Reduce(b.Select(p.onehot, x, b.Zeros(x.type)), b.ScalarConst(ct, 0), {cd}, "add");
  picked = b.Reshape(picked, p.w.dims());
  Value loss = b.Mul(b.Unary("negate", picked), p.w);
  Value tw = SumDims(b, p.w, Iota(0, p.w.rank()), false, ct);
  Value out;
  if (red == 0) {
    out = loss;
  } else {
    out = SumDims(b, loss, Iota(0, loss.rank()), false, ct);
    if (red == 1) out = b.Div(out, tw);
  }
  return {b.Reshape(out, c.out(0).dims), b.Reshape(tw, c.out(1).dims)};
}
TT_LOWERINGS(({"aten::nll_loss_forward", "aten::nll_loss_forward.output", "aten::nll_loss2d_forward",
               "aten::nll_loss2d_forward.output"}), NllForward);

std::vector<Value> NllBackward(LowerCtx& c) {
  Builder& b = c.b;
  ET ct = ComputeType(c.out().et);
  Value x = c.t(1);
  Type xt = x.type.with_et(ct);
  int64_t red = c.i64(4), ignore = c.i64(5);
  auto p = NllSetup(c, b.Zeros(xt), c.t(2), 3, ignore, ct);
  Value go = Cast(b, c.t(0), ct);
  Value scale;  // target shape
  if (red == 0) {
    scale = b.Mul(b.Reshape(go, p.w.dims()), p.w);
  } else {
    Value gs = b.Reshape(go, {});
    if (red == 1) gs = b.Div(gs, b.Reshape(Cast(b, c.t(6), ct), {}));
    scale = b.Mul(b.BroadcastTo(gs, p.w.dims()), p.w);
  }
  int r = xt.rank();
  int cd = r == 1 ? 0 : 1;
  Dims bd;
  for (int i = 0; i < r; ++i)
    if (i != cd) bd.push_back(i);
  Value sb = b.Broadcast(scale, xt.dims, bd);
  return {b.Select(p.onehot, b.Unary("negate", sb), b.Zeros(xt))};
}
TT_LOWERINGS(({"aten::nll_loss_backward", "aten::nll_loss_backward.grad_input",
               "aten::nll_loss2d_backward", "aten::nll_loss2d_backward.grad_input"}), NllBackward);

// ---- mse_loss ----
std::vector<Value> MseLoss(LowerCtx& c) {
  Builder& b = c.b;
  ET ct = ComputeType(c.out().et);
  Value x = c.t(0), t = c.t(1);
  Dims d = x.dims();
  if (t.rank() > x.rank()) d = t.dims();
  // broadcast both to the common shape
  Dims bd = d;
  for (int i = 0; i < x.rank(); ++i) {
    int j = (int)bd.size() - x.rank() + i;
    if (bd[j] == 1) bd[j] = x.dims()[i];
  }
  for (int i = 0; i < t.rank(); ++i) {
    int j = (int)bd.size() - t.rank() + i;
    if (bd[j] == 1) bd[j] = t.dims()[i];
  }
  Value diff = b.Sub(Bcast(b, x, bd, ct), Bcast(b, t, bd, ct));
  Value sq = b.Mul(diff, diff);
  int64_t red = c.has(2) ? c.i64(2) : 1;
  if (red == 0) return {sq};
  Value s = SumDims(b, sq, Iota(0, sq.rank()), false, ct);
  if (red == 1) s = b.Div(s, b.Splat(s.type, (double)sq.type.numel()));
  return {s};
}
TT_LOWERINGS(({"aten::mse_loss", "aten::mse_loss.out"}), MseLoss);

std::vector<Value> MseLossBackward(LowerCtx& c) {
  Builder& b = c.b;
  ET ct = ComputeType(c.out().et);
  const Dims& d = c.out().dims;
  Value g = Bcast(b, c.t(0), d, ct), x = Bcast(b, c.t(1), d, ct), t = Bcast(b, c.t(2), d, ct);
  Value r = b.Mul(b.Mul(S(b, g, 2.0), b.Sub(x, t)), g);
  if (c.i64(3) == 1) {
    int64_t n = 1;
    for (auto v : d) n *= v;
    r = b.Div(r, S(b, r, (double)n));
  }
  return {r};
}
TT_LOWERINGS(({"aten::mse_loss_backward", "aten::mse_loss_backward.grad_input"}), MseLossBackward);

// ---- embedding backward: scatter-add rows of grad into (num_weights, D) ----
std::vector<Value> EmbeddingDenseBackward(LowerCtx& c) {
  Builder& b = c.b;
  const Type& o = c.out();
  ET ct = ComputeType(o.et);
  Value g = Cast(b, c.t(0), ct);
  Value idx = Cast(b, c.t(1), ET::S64);
  int64_t nw = o.dims[0], D = o.dims[1];
  int64_t pad = c.i64(3);
  bool scale = c.flag(4);
  int64_t n = idx.type.numel();
  idx = b.Reshape(idx, {n});
  g = b.Reshape(g, {n, D});
  Value valid = b.Compare(idx, b.Splat(idx.type, (double)pad), "NE");
  g = b.Select(b.Broadcast(valid, {n, D}, {0}), g, b.Zeros(g.type));
  Value sidx = b.Reshape(idx, {n, 1});
  auto scatter_add = [&](Value base, Value upd, bool rows) {
    hlo::Region reg;
    reg.arg_types = {Type(base.et(), {}), Type(base.et(), {})};
    reg.body = [](Builder& b, const std::vector<Value>& a) { return std::vector<Value>{b.Add(a[0], a[1])}; };
    return b.Op1("stablehlo.scatter", {base, sidx, upd}, base.type,
                 std::string("scatter_dimension_numbers = #stablehlo.scatter<update_window_dims = ") +
                     (rows ? "[1]" : "[]") +
                     ", inserted_window_dims = [0], scatter_dims_to_operand_dims = [0], "
                     "index_vector_dim = 1>, indices_are_sorted = false, unique_indices = false",
                 {reg});
  };
  if (scale) {
    Value cnt = scatter_add(b.Zeros(Type(ct, {nw})), b.Splat(Type(ct, {n}), 1.0), false);
    Value gather = b.Op1("stablehlo.gather", {cnt, sidx}, Type(ct, {n}),
                         "dimension_numbers = #stablehlo.gather<collapsed_slice_dims = [0], "
                         "start_index_map = [0], index_vector_dim = 1>, slice_sizes = array<i64: 1>, "
                         "indices_are_sorted = false");
    g = b.Div(g, b.Broadcast(gather, {n, D}, {0}));
  }
  return {scatter_add(b.Zeros(Type(ct, {nw, D})), g, true)};
}
TT_LOWERINGS(({"aten::embedding_dense_backward", "aten::embedding_dense_backward.out"}),
             EmbeddingDenseBackward);

// ---- fused RNN cells: PyTorch's LSTM/GRU run these on PrivateUse1 devices
// (as on CUDA). The workspace holds what the backward needs; only these
// lowerings read it.
// Gate k of a [B, n*h] value.
Value Chunk(Builder& b, const Value& v, int64_t k, int64_t h) { return b.SliceDim(v, 1, k * h, (k + 1) * h); }

// _thnn_fused_lstm_cell(input_gates, hidden_gates, cx, input_bias?, hidden_bias?)
//   -> (hy, cy, workspace = activated gates [i, f, g, o])
std::vector<Value> FusedLstmCell(LowerCtx& c) {
  Builder& b = c.b;
  ET ct = ComputeType(c.out(0).et);
  Value gates = b.Add(Cast(b, c.t(0), ct), Cast(b, c.t(1), ct));
  for (size_t i : {3, 4})
    if (c.has(i)) gates = b.Add(gates, Bcast(b, c.t(i), gates.dims(), ct));
  int64_t h = gates.dims()[1] / 4;
  Value i = b.Unary("logistic", Chunk(b, gates, 0, h)), f = b.Unary("logistic", Chunk(b, gates, 1, h));
  Value g = b.Unary("tanh", Chunk(b, gates, 2, h)), o = b.Unary("logistic", Chunk(b, gates, 3, h));
  Value cy = b.Add(b.Mul(f, Cast(b, c.t(2), ct)), b.Mul(i, g));
  Value hy = b.Mul(o, b.Unary("tanh", cy));
  return {hy, cy, b.Concat({i, f, g, o}, 1)};
}
TT_LOWERINGS(({"aten::_thnn_fused_lstm_cell"}), FusedLstmCell);

// _thnn_fused_lstm_cell_backward_impl(grad_hy?, grad_cy?, cx, cy, workspace, has_bias)
//   -> (grad_gates, grad_cx, grad_bias)
std::vector<Value> FusedLstmCellBackward(LowerCtx& c) {
  Builder& b = c.b;
  ET ct = ComputeType(c.out(0).et);
  Value ws = Cast(b, c.t(4), ct), cx = Cast(b, c.t(2), ct), cy = Cast(b, c.t(3), ct);
  int64_t h = cx.dims()[1];
  Value i = Chunk(b, ws, 0, h), f = Chunk(b, ws, 1, h), g = Chunk(b, ws, 2, h), o = Chunk(b, ws, 3, h);
  Value ghy = c.has(0) ? Cast(b, c.t(0), ct) : b.Zeros(cx.type);
  Value gcy = c.has(1) ? Cast(b, c.t(1), ct) : b.Zeros(cx.type);
  Value tcy = b.Unary("tanh", cy);
  Value gc = b.Add(b.Mul(b.Mul(ghy, o), DerivFromOut(b, tcy, true)), gcy);  // d cy in total
  Value gi = b.Mul(b.Mul(gc, g), DerivFromOut(b, i, false));
  Value gf = b.Mul(b.Mul(gc, cx), DerivFromOut(b, f, false));
  Value gg = b.Mul(b.Mul(gc, i), DerivFromOut(b, g, true));
  Value go = b.Mul(b.Mul(ghy, tcy), DerivFromOut(b, o, false));
  Value gates = b.Concat({gi, gf, gg, go}, 1);
  std::vector<Value> out = {gates, b.Mul(gc, f)};
  if (c.outs.size() > 2) out.push_back(SumDims(b, gates, {0}, false, ct));
  return out;
}
TT_LOWERINGS(({"aten::_thnn_fused_lstm_cell_backward_impl"}), FusedLstmCellBackward);

// _thnn_fused_gru_cell(input_gates, hidden_gates, hx, input_bias?, hidden_bias?)
//   -> (hy, workspace = [r, z, n, hx, hn])
std::vector<Value> FusedGruCell(LowerCtx& c) {
  Builder& b = c.b;
  ET ct = ComputeType(c.out(0).et);
  Value ig = Cast(b, c.t(0), ct), hg = Cast(b, c.t(1), ct), hx = Cast(b, c.t(2), ct);
  if (c.has(3)) ig = b.Add(ig, Bcast(b, c.t(3), ig.dims(), ct));
  if (c.has(4)) hg = b.Add(hg, Bcast(b, c.t(4), hg.dims(), ct));
  int64_t h = hx.dims()[1];
  Value r = b.Unary("logistic", b.Add(Chunk(b, ig, 0, h), Chunk(b, hg, 0, h)));
  Value z = b.Unary("logistic", b.Add(Chunk(b, ig, 1, h), Chunk(b, hg, 1, h)));
  Value hn = Chunk(b, hg, 2, h);
  Value n = b.Unary("tanh", b.Add(Chunk(b, ig, 2, h), b.Mul(r, hn)));
  Value hy = b.Add(n, b.Mul(z, b.Sub(hx, n)));
  return {hy, b.Concat({r, z, n, hx, hn}, 1)};
}
TT_LOWERINGS(({"aten::_thnn_fused_gru_cell"}), FusedGruCell);

// _thnn_fused_gru_cell_backward(grad_hy, workspace, has_bias)
//   -> (grad_input_gates, grad_hidden_gates, grad_hx, grad_input_bias, grad_hidden_bias)
std::vector<Value> FusedGruCellBackward(LowerCtx& c) {
  Builder& b = c.b;
  ET ct = ComputeType(c.out(0).et);
  Value gh = Cast(b, c.t(0), ct), ws = Cast(b, c.t(1), ct);
  int64_t h = gh.dims()[1];
  Value r = Chunk(b, ws, 0, h), z = Chunk(b, ws, 1, h), n = Chunk(b, ws, 2, h), hx = Chunk(b, ws, 3, h),
        hn = Chunk(b, ws, 4, h);
  Value dn = b.Mul(b.Mul(gh, b.Sub(S(b, z, 1), z)), DerivFromOut(b, n, true));
  Value dz = b.Mul(b.Mul(gh, b.Sub(hx, n)), DerivFromOut(b, z, false));
  Value dr = b.Mul(b.Mul(dn, hn), DerivFromOut(b, r, false));
  Value gi = b.Concat({dr, dz, dn}, 1), ghid = b.Concat({dr, dz, b.Mul(dn, r)}, 1);
  return {gi, ghid, b.Mul(gh, z), SumDims(b, gi, {0}, false, ct), SumDims(b, ghid, {0}, false, ct)};
}
TT_LOWERINGS(({"aten::_thnn_fused_gru_cell_backward"}), FusedGruCellBackward);

// ---- im2col / col2im (F.unfold / F.fold): one strided slice (im2col) or
// one interior-padded placement (col2im) per kernel offset.
struct Im2ColGeom {
  int64_t kh, kw, dh, dw, ph, pw, sh, sw;
  Im2ColGeom(const LowerCtx& c, size_t k) {
    auto two = [&](size_t i) {
      std::vector<int64_t> v = c.ints(i);
      if (v.size() != 2) c.fail("expected two values for '" + c.names.at(i) + "'");
      return v;
    };
    auto ks = two(k), di = two(k + 1), pa = two(k + 2), st = two(k + 3);
    kh = ks[0], kw = ks[1], dh = di[0], dw = di[1], ph = pa[0], pw = pa[1], sh = st[0], sw = st[1];
  }
  int64_t out(int64_t size, int64_t k, int64_t d, int64_t p, int64_t s) const {
    return (size + 2 * p - d * (k - 1) - 1) / s + 1;
  }
};

std::vector<Value> Im2Col(LowerCtx& c) {
  Builder& b = c.b;
  Value x = c.t(0);
  bool batched = x.rank() == 4;
  if (!batched) x = b.Reshape(x, {1, x.dims()[0], x.dims()[1], x.dims()[2]});
  Im2ColGeom g(c, 1);
  int64_t n = x.dims()[0], ch = x.dims()[1], h = x.dims()[2], w = x.dims()[3];
  int64_t oh = g.out(h, g.kh, g.dh, g.ph, g.sh), ow = g.out(w, g.kw, g.dw, g.pw, g.sw);
  Value xp = b.Pad(x, b.Zeros(Type(x.et(), {})), {0, 0, g.ph, g.pw}, {0, 0, g.ph, g.pw}, {0, 0, 0, 0});
  std::vector<Value> cols;
  for (int64_t i = 0; i < g.kh; ++i)
    for (int64_t j = 0; j < g.kw; ++j) {
      Value s = b.Slice(xp, {0, 0, i * g.dh, j * g.dw},
                        {n, ch, i * g.dh + g.sh * (oh - 1) + 1, j * g.dw + g.sw * (ow - 1) + 1}, {1, 1, g.sh, g.sw});
      cols.push_back(b.Reshape(s, {n, ch, 1, oh * ow}));
    }
  Value r = b.Reshape(b.Concat(cols, 2), {n, ch * g.kh * g.kw, oh * ow});
  return {b.Reshape(r, c.out().dims)};
}
TT_LOWERINGS(({"aten::im2col", "aten::im2col.out"}), Im2Col);

std::vector<Value> Col2Im(LowerCtx& c) {
  Builder& b = c.b;
  Value x = c.t(0);
  if (x.rank() == 2) x = b.Reshape(x, {1, x.dims()[0], x.dims()[1]});
  std::vector<int64_t> os = c.ints(1);
  if (os.size() != 2) c.fail("expected two values for 'output_size'");
  Im2ColGeom g(c, 2);
  int64_t n = x.dims()[0], h = os[0], w = os[1];
  int64_t oh = g.out(h, g.kh, g.dh, g.ph, g.sh), ow = g.out(w, g.kw, g.dw, g.pw, g.sw);
  if (x.dims()[1] % (g.kh * g.kw) != 0 || x.dims()[2] != oh * ow)
    c.fail("input of shape " + x.type.str() + " does not match the kernel and output_size");
  int64_t ch = x.dims()[1] / (g.kh * g.kw), hp = h + 2 * g.ph, wp = w + 2 * g.pw;
  ET ct = ComputeType(x.et());
  Value cols = b.Reshape(Cast(b, x, ct), {n, ch, g.kh * g.kw, oh, ow});
  Value zero = b.Zeros(Type(ct, {}));
  Value acc;
  for (int64_t i = 0; i < g.kh; ++i)
    for (int64_t j = 0; j < g.kw; ++j) {
      int64_t k = i * g.kw + j;
      Value s = b.Reshape(b.Slice(cols, {0, 0, k, 0, 0}, {n, ch, k + 1, oh, ow}, {1, 1, 1, 1, 1}), {n, ch, oh, ow});
      int64_t lo_h = i * g.dh, lo_w = j * g.dw;
      Value placed = b.Pad(s, zero, {0, 0, lo_h, lo_w},
                           {0, 0, hp - lo_h - ((oh - 1) * g.sh + 1), wp - lo_w - ((ow - 1) * g.sw + 1)},
                           {0, 0, g.sh - 1, g.sw - 1});
      acc = acc.valid() ? b.Add(acc, placed) : placed;
    }
  Value r = b.Slice(acc, {0, 0, g.ph, g.pw}, {n, ch, g.ph + h, g.pw + w}, {1, 1, 1, 1});
  return {b.Reshape(Cast(b, r, c.out().et), c.out().dims)};
}
TT_LOWERINGS(({"aten::col2im", "aten::col2im.out"}), Col2Im);

}  // namespace
}  // namespace tt::ops
