// Losses and their backward ops: smooth_l1, huber, binary_cross_entropy,
// multi_margin. nll_loss and mse_loss live in nn.cpp; cross_entropy, l1,
// bce_with_logits, kl_div, soft_margin, ... decompose above us into those and
// elementwise ops. Reductions: 0 none, 1 mean, 2 sum. Math in ComputeType(out).
#include <cmath>

#include "registry.h"

namespace tt::ops {
namespace {

Value S(Builder& b, const Value& like, double v) { return b.Splat(like.type, v); }

Dims Iota(int64_t n) {
  Dims d;
  for (int64_t i = 0; i < n; ++i) d.push_back(i);
  return d;
}

// numpy broadcast of two shapes
Dims BShape(const Dims& a, const Dims& c) {
  Dims r = a.size() >= c.size() ? a : c;
  const Dims& o = a.size() >= c.size() ? c : a;
  for (size_t i = 0; i < o.size(); ++i) {
    int64_t& t = r[r.size() - o.size() + i];
    if (t == 1) t = o[i];
  }
  return r;
}

Value Reduce(Builder& b, Value v, int64_t red) {
  if (red == 0) return v;
  Value s = SumDims(b, v, Iota(v.rank()), false, v.et());
  if (red == 1) s = b.Div(s, S(b, s, (double)v.type.numel()));
  return s;
}

// grad_output broadcast to d, scaled by 1/n for mean
Value GradScale(LowerCtx& c, const Dims& d, ET ct, int64_t red) {
  Value g = Bcast(c.b, c.t(0), d, ct);
  if (red == 1) {
    int64_t n = 1;
    for (auto v : d) n *= v;
    g = c.b.Div(g, S(c.b, g, (double)n));
  }
  return g;
}

// ---- smooth_l1 (beta) and huber (delta) ----
template <bool Huber>
std::vector<Value> SmoothL1(LowerCtx& c) {
  Builder& b = c.b;
  ET ct = ComputeType(c.out().et);
  Dims d = BShape(c.t(0).dims(), c.t(1).dims());
  Value x = Bcast(b, c.t(0), d, ct), t = Bcast(b, c.t(1), d, ct);
  int64_t red = c.i64_or(2, 1);
  double beta = c.f64_or(3, 1.0);
  Value z = b.Unary("abs", b.Sub(x, t));
  Value bt = S(b, z, beta);
  Value quad = b.Mul(S(b, z, 0.5), b.Mul(z, z));
  Value l;
  if (Huber) {
    l = b.Select(b.Compare(z, bt, "LT"), quad, b.Mul(bt, b.Sub(z, S(b, z, 0.5 * beta))));
  } else {
    l = b.Select(b.Compare(z, bt, "LT"), b.Div(quad, bt), b.Sub(z, S(b, z, 0.5 * beta)));
  }
  return {Reduce(b, l, red)};
}
TT_LOWERINGS(({"aten::smooth_l1_loss", "aten::smooth_l1_loss.out"}), SmoothL1<false>);
TT_LOWERINGS(({"aten::huber_loss", "aten::huber_loss.out"}), SmoothL1<true>);

template <bool Huber>
std::vector<Value> SmoothL1Backward(LowerCtx& c) {
  Builder& b = c.b;
  ET ct = ComputeType(c.out().et);
  const Dims& d = c.out().dims;
  int64_t red = c.i64(3);
  double beta = c.f64(4);
  Value g = GradScale(c, d, ct, red);
  Value x = Bcast(b, c.t(1), d, ct), t = Bcast(b, c.t(2), d, ct);
  Value df = b.Sub(x, t);
  Value bt = S(b, df, beta), nb = S(b, df, -beta);
  Value r;
  if (Huber) {
    r = b.Select(b.Compare(df, nb, "LT"), b.Mul(g, nb),
                 b.Select(b.Compare(df, bt, "GT"), b.Mul(g, bt), b.Mul(g, df)));
  } else {
    r = b.Select(b.Compare(df, nb, "LE"), b.Unary("negate", g),
                 b.Select(b.Compare(df, bt, "GE"), g, b.Div(b.Mul(g, df), bt)));
  }
  return {r};
}
TT_LOWERINGS(({"aten::smooth_l1_loss_backward", "aten::smooth_l1_loss_backward.grad_input"}),
             SmoothL1Backward<false>);
TT_LOWERINGS(({"aten::huber_loss_backward", "aten::huber_loss_backward.out"}), SmoothL1Backward<true>);

// ---- binary_cross_entropy: -w (t log x + (1-t) log(1-x)), logs clamped at -100 ----
std::vector<Value> Bce(LowerCtx& c) {
  Builder& b = c.b;
  ET ct = ComputeType(c.out().et);
  Dims d = c.t(0).dims();
  Value x = Cast(b, c.t(0), ct), t = Bcast(b, c.t(1), d, ct);
  Value lo = S(b, x, -100);
  Value lx = b.Max(b.Unary("log", x), lo);
  Value l1x = b.Max(b.Unary("log", b.Sub(S(b, x, 1), x)), lo);
  Value l = b.Unary("negate", b.Add(b.Mul(t, lx), b.Mul(b.Sub(S(b, t, 1), t), l1x)));
  if (c.has(2)) l = b.Mul(l, Bcast(b, c.t(2), d, ct));
  return {Reduce(b, l, c.i64_or(3, 1))};
}
TT_LOWERINGS(({"aten::binary_cross_entropy", "aten::binary_cross_entropy.out"}), Bce);

std::vector<Value> BceBackward(LowerCtx& c) {
  Builder& b = c.b;
  ET ct = ComputeType(c.out().et);
  const Dims& d = c.out().dims;
  int64_t red = c.i64_or(4, 1);
  Value g = GradScale(c, d, ct, red);
  Value x = Bcast(b, c.t(1), d, ct), t = Bcast(b, c.t(2), d, ct);
  Value den = b.Max(b.Mul(b.Sub(S(b, x, 1), x), x), S(b, x, 1e-12));
  Value r = b.Div(b.Mul(g, b.Sub(x, t)), den);
  if (c.has(3)) r = b.Mul(r, Bcast(b, c.t(3), d, ct));
  return {r};
}
TT_LOWERINGS(({"aten::binary_cross_entropy_backward", "aten::binary_cross_entropy_backward.grad_input"}),
             BceBackward);

// ---- multi_margin_loss: x (N, C) or (C), target (N) or (), p in {1, 2} ----
struct MarginParts {
  Value x, onehot, z, wy;  // z = margin - x[y] + x[j] (j != y masked out by onehot)
  int64_t C = 1;
};
MarginParts MarginSetup(LowerCtx& c, size_t xi, size_t ti, size_t mi, size_t wi, ET ct) {
  Builder& b = c.b;
  MarginParts m;
  Value x = Cast(b, c.t(xi), ct);
  if (x.rank() <= 1) x = b.Reshape(x, {1, x.rank() == 0 ? 1 : x.dims()[0]});
  int64_t N = x.dims()[0], C = x.dims()[1];
  Value tgt = b.Reshape(Cast(b, c.t(ti), ET::S64), {N});
  Value cls = b.Iota(Type(ET::S64, {N, C}), 1);
  Value onehot = b.Compare(cls, b.Broadcast(tgt, {N, C}, {0}), "EQ");
  Value xy = b.Reduce(b.Select(onehot, x, b.Zeros(x.type)), b.ScalarConst(ct, 0), {1}, "add");
  Value margin = Bcast(b, c.t(mi), {N, C}, ct);
  m.z = b.Add(b.Sub(margin, b.Broadcast(xy, {N, C}, {0})), x);
  if (c.has(wi)) {
    Value w = b.Broadcast(Cast(b, c.t(wi), ct), {N, C}, {1});
    m.wy = b.Reduce(b.Select(onehot, w, b.Zeros(w.type)), b.ScalarConst(ct, 0), {1}, "add");
  } else {
    m.wy = b.Splat(Type(ct, {N}), 1.0);
  }
  m.x = x;
  m.onehot = onehot;
  m.C = C;
  return m;
}

std::vector<Value> MultiMargin(LowerCtx& c) {
  Builder& b = c.b;
  ET ct = ComputeType(c.out().et);
  int64_t p = c.i64(2);
  auto m = MarginSetup(c, 0, 1, 3, 4, ct);
  Value h = b.Max(m.z, b.Zeros(m.z.type));
  if (p == 2) h = b.Mul(h, h);
  h = b.Select(m.onehot, b.Zeros(h.type), h);
  Value li = b.Reduce(h, b.ScalarConst(ct, 0), {1}, "add");
  li = b.Div(b.Mul(li, m.wy), S(b, li, (double)m.C));
  int64_t red = c.i64_or(5, 1);
  if (red == 0) return {b.Reshape(li, c.out().dims)};
  return {Reduce(b, li, red)};
}
TT_LOWERINGS(({"aten::multi_margin_loss", "aten::multi_margin_loss.out"}), MultiMargin);

std::vector<Value> MultiMarginBackward(LowerCtx& c) {
  Builder& b = c.b;
  ET ct = ComputeType(c.out().et);
  int64_t p = c.i64(3);
  auto m = MarginSetup(c, 1, 2, 4, 5, ct);
  int64_t N = m.x.dims()[0], C = m.C;
  int64_t red = c.i64_or(6, 1);
  Value pos = b.Binary("and", b.Compare(m.z, b.Zeros(m.z.type), "GT"), b.Unary("not", m.onehot));
  Value gj = p == 2 ? b.Mul(S(b, m.z, 2), m.z) : S(b, m.z, 1);
  gj = b.Select(pos, gj, b.Zeros(gj.type));
  gj = b.Mul(gj, b.Broadcast(b.Div(m.wy, S(b, m.wy, (double)C)), {N, C}, {0}));
  Value gy = b.Reduce(gj, b.ScalarConst(ct, 0), {1}, "add");
  Value gr = b.Select(m.onehot, b.Unary("negate", b.Broadcast(gy, {N, C}, {0})), gj);
  Value go = Cast(b, c.t(0), ct);
  if (red == 0 && go.rank() > 0) {
    gr = b.Mul(gr, b.Broadcast(b.Reshape(go, {N}), {N, C}, {0}));
  } else {
    Value s = b.Reshape(go, {});
    if (red == 1) s = b.Div(s, b.ScalarConst(ct, (double)N));
    gr = b.Mul(gr, b.BroadcastTo(s, {N, C}));
  }
  return {b.Reshape(gr, c.out().dims)};
}
// No meta kernel exists for multi_margin_loss_backward, so NativeKernel cannot
// serve it eagerly; the lowering serves compiled graphs (never bound eagerly).
TT_GRAPH_LOWERINGS(({"aten::multi_margin_loss_backward"}), MultiMarginBackward);

}  // namespace
}  // namespace tt::ops
