// Matrix products: mm, bmm, addmm, baddbmm, addbmm, addmv, matmul, dot, vdot,
// _addmm_activation. f16/bf16 products accumulate in f32 and round once
// (operands stay narrow: dot_general with an f32 result type). einsum,
// tensordot, outer, linear, addr decompose above us into these.
#include <cmath>

#include "registry.h"

namespace tt::ops {
namespace {

std::vector<Value> Mm(LowerCtx& c) {
  return {Matmul(c.b, c.t(0), c.t(1), c.out().et)};
}
TT_LOWERINGS(({"aten::mm", "aten::mm.out", "aten::bmm", "aten::bmm.out", "aten::matmul",
               "aten::matmul.out", "aten::dot", "aten::dot.out", "aten::mv", "aten::mv.out"}), Mm);

// vdot: conj(self) . other
std::vector<Value> Vdot(LowerCtx& c) {
  Builder& b = c.b;
  ET et = c.out().et;
  Value x = Cast(b, c.t(0), et);
  if (hlo::IsComplex(et)) {
    Type pt = x.type.with_et(hlo::ComplexPart(et));
    Value re = b.Op1("stablehlo.real", {x}, pt), im = b.Op1("stablehlo.imag", {x}, pt);
    x = b.Op1("stablehlo.complex", {re, b.Unary("negate", im)}, x.type);
  }
  return {Matmul(b, x, c.t(1), et)};
}
TT_LOWERINGS(({"aten::vdot", "aten::vdot.out"}), Vdot);

// beta * self + alpha * p, in the compute type; beta = 0 ignores self (even NaN)
Value AddScaled(LowerCtx& c, Value p, ET ct) {
  Builder& b = c.b;
  const Dims& d = p.dims();
  if (c.has(4) && c.arg(4).kind == Arg::Scalar && c.arg(4).hint() != 1.0)
    p = b.Mul(p, Bcast(b, c.t(4), d, ct));
  if (c.has(3) && c.arg(3).kind == Arg::Scalar) {
    if (c.arg(3).hint() == 0.0) return p;
    Value s = Bcast(b, c.t(0), d, ct);
    if (c.arg(3).hint() != 1.0) s = b.Mul(s, Bcast(b, c.t(3), d, ct));
    return b.Add(s, p);
  }
  return b.Add(Bcast(b, c.t(0), d, ct), p);
}

std::vector<Value> Addmm(LowerCtx& c) {
  ET et = c.out().et;
  ET ct = ComputeType(et);
  Value p = Matmul(c.b, c.t(1), c.t(2), et, /*wide=*/true);
  return {Cast(c.b, AddScaled(c, p, ct), et)};
}
TT_LOWERINGS(({"aten::addmm", "aten::addmm_", "aten::addmm.out", "aten::baddbmm", "aten::baddbmm_",
               "aten::baddbmm.out", "aten::addmv", "aten::addmv_", "aten::addmv.out"}), Addmm);

// addbmm: beta * self + alpha * sum_b (batch1[b] @ batch2[b])
std::vector<Value> Addbmm(LowerCtx& c) {
  Builder& b = c.b;
  ET et = c.out().et;
  ET ct = ComputeType(et);
  Value b1 = Cast(b, c.t(1), et), b2 = Cast(b, c.t(2), et);
  const Dims& d1 = b1.dims();
  const Dims& d2 = b2.dims();
  // contract over the batch and k dims at once
  Value p = b.DotGeneral(b1, b2, {}, {}, {0, 2}, {0, 1}, Type(ct, {d1[1], d2[2]}));
  return {Cast(b, AddScaled(c, p, ct), et)};
}
TT_LOWERINGS(({"aten::addbmm", "aten::addbmm_", "aten::addbmm.out"}), Addbmm);

// addmm followed by relu or gelu
std::vector<Value> AddmmActivation(LowerCtx& c) {
  Builder& b = c.b;
  ET et = c.out().et;
  ET ct = ComputeType(et);
  Value y = AddScaled(c, Matmul(b, c.t(1), c.t(2), et, true), ct);
  bool gelu = c.flag(5);
  if (gelu) {  // CPU applies the exact (erf) gelu
    Value x = y;
    auto S = [&](double v) { return b.Splat(x.type, v); };
    Value erf = b.Op1("chlo.erf", {b.Mul(x, S(0.70710678118654752440))}, x.type);
    y = b.Mul(b.Mul(x, S(0.5)), b.Add(S(1), erf));
  } else {
    y = b.Max(y, b.Zeros(y.type));
  }
  return {Cast(b, y, et)};
}
TT_LOWERINGS(({"aten::_addmm_activation", "aten::_addmm_activation.out"}), AddmmActivation);

}  // namespace
}  // namespace tt::ops

namespace tt::ops {
namespace {

// torch._grouped_mm: products of groups cut by offs (cumulative group ends,
// int32), in every float dtype, f16/bf16 accumulating in f32.
//   2D x 3D: rows of a in group g times b[g]          -> (M, N)
//   3D x 2D: a[g] times columns of b in group g        -> (M, N)
//   2D x 2D: a[:, K in g] @ b[K in g, :] for each g    -> (G, M, N)
//   3D x 3D: bmm (no offs)                             -> (G, M, N)
// Lowered densely: every group's product, then a one-hot select of each
// row's (column's, K's) group, summed over groups. Rows past offs[-1] are 0.
std::vector<Value> GroupedMm(LowerCtx& c) {
  Builder& b = c.b;
  const ET et = c.out().et;
  const ET ct = ComputeType(et);
  Value x = c.t(0), w = c.t(1);
  ET in = x.et();
  if (!c.has(2)) return {Matmul(b, x, w, et)};
  Value offs = Cast(b, c.t(2), ET::S64);
  const int64_t g = offs.dims()[0];
  // Group of each position 0..n-1 along the grouped dimension: #ends <= pos.
  auto group_of = [&](int64_t n) {
    Value pos = b.Iota(Type(ET::S64, {n, g}), 0);
    Value ends = b.Broadcast(offs, {n, g}, {1});
    return SumDims(b, b.Compare(ends, pos, "LE"), {1}, false, ET::S64);  // (n)
  };
  // one-hot (n, g): position n is in group g
  auto onehot = [&](int64_t n) {
    Value gid = b.Broadcast(group_of(n), {n, g}, {0});
    return b.Compare(gid, b.Iota(Type(ET::S64, {n, g}), 1), "EQ");
  };
  auto Dot = [&](Value l, Value r, const Dims& lb, const Dims& rb, const Dims& lc, const Dims& rc, Dims od) {
    return b.DotGeneral(Cast(b, l, in), Cast(b, r, in), lb, rb, lc, rc, Type(ct, std::move(od)));
  };
  const Dims& xd = x.dims();
  const Dims& wd = w.dims();
  Value r;
  if (x.rank() == 2 && w.rank() == 3) {  // (M, K) x (G, K, N)
    int64_t m = xd[0], n = wd[2];
    Value all = Dot(x, w, {}, {}, {1}, {1}, {m, g, n});  // (M, G, N)
    Value mask = b.Broadcast(onehot(m), {m, g, n}, {0, 1});
    r = SumDims(b, b.Select(mask, all, b.Zeros(all.type)), {1}, false, ct);
  } else if (x.rank() == 3 && w.rank() == 2) {  // (G, M, K) x (K, N)
    int64_t m = xd[1], n = wd[1];
    Value all = Dot(x, w, {}, {}, {2}, {0}, {g, m, n});  // (G, M, N)
    Value mask = b.Broadcast(onehot(n), {g, m, n}, {2, 0});
    r = SumDims(b, b.Select(mask, all, b.Zeros(all.type)), {0}, false, ct);
  } else {  // (M, K) x (K, N): K grouped -> (G, M, N)
    int64_t m = xd[0], k = xd[1], n = wd[1];
    Value mask = b.Broadcast(onehot(k), {g, m, k}, {2, 0});
    Value xg = b.Broadcast(x, {g, m, k}, {1, 2});
    xg = b.Select(mask, xg, b.Zeros(xg.type));
    r = Dot(xg, w, {}, {}, {2}, {0}, {g, m, n});
  }
  return {Cast(b, r, et)};
}
TT_LOWERING("aten::_grouped_mm", GroupedMm);

}  // namespace
}  // namespace tt::ops
