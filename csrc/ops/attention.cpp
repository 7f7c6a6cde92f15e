// Attention: scaled_dot_product_attention takes the math path on the tpu
// device (it is CompositeImplicit and decomposes into bmm / _safe_softmax /
// where / native_dropout / sum). This file lowers the pieces of that path that
// are not elsewhere: softmax (+ safe variant, backward), sum, tril/triu.
// (sum/tril/softmax may also be lowered by the reductions/shape families; the
// registry keeps one of the equivalent lowerings.)
#include <limits>

#include "registry.h"

namespace tt::ops {
namespace {

Value Softmax(Builder& b, Value x, int64_t dim, bool safe) {
  ET ct = x.et();
  Dims kd = x.dims();
  kd[dim] = 1;
  Value ninf = b.Splat(Type(ct, {}), -std::numeric_limits<double>::infinity());
  Value mx = b.Reshape(b.Reduce(x, ninf, {dim}, "maximum"), kd);
  Value mxb = b.BroadcastTo(mx, x.dims());
  Value finite_mx = b.Select(b.Op1("stablehlo.is_finite", {mxb}, mxb.type.with_et(ET::PRED)), mxb,
                             b.Zeros(mxb.type));
  Value e = b.Unary("exponential", b.Sub(x, finite_mx));
  Value s = b.BroadcastTo(b.Reshape(b.Reduce(e, b.Zeros(Type(ct, {})), {dim}, "add"), kd), x.dims());
  Value y = b.Div(e, s);
  if (safe) {
    Value all_ninf = b.Compare(mxb, b.Splat(mxb.type, -std::numeric_limits<double>::infinity()), "EQ");
    y = b.Select(all_ninf, b.Zeros(y.type), y);
  }
  return y;
}

template <bool Safe>
std::vector<Value> SoftmaxL(LowerCtx& c) {
  const Type& ot = c.out();
  ET ct = ComputeType(ot.et);
  Value x = Cast(c.b, c.t(0), ct);
  if (x.rank() == 0) return {c.b.Splat(ot, 1.0)};
  int64_t dim = NormDim(c.i64(1), x.rank());
  return {Softmax(c.b, x, dim, Safe)};
}
TT_LOWERINGS(({"aten::_softmax", "aten::_softmax.out"}), SoftmaxL<false>);
TT_LOWERINGS(({"aten::_safe_softmax"}), SoftmaxL<true>);

// grad_input = y * (g - sum(g * y, dim))
std::vector<Value> SoftmaxBackward(LowerCtx& c) {
  const Type& ot = c.out();
  ET ct = ComputeType(ot.et);
  Value g = Cast(c.b, c.t(0), ct), y = Cast(c.b, c.t(1), ct);
  if (y.rank() == 0) return {c.b.Zeros(ot)};
  int64_t dim = NormDim(c.i64(2), y.rank());
  Dims kd = y.dims();
  kd[dim] = 1;
  Value s = c.b.Reshape(c.b.Reduce(c.b.Mul(g, y), c.b.Zeros(Type(ct, {})), {dim}, "add"), kd);
  return {c.b.Mul(y, c.b.Sub(g, c.b.BroadcastTo(s, y.dims())))};
}
TT_LOWERINGS(({"aten::_softmax_backward_data", "aten::_softmax_backward_data.out"}), SoftmaxBackward);

// sum(self, dim?, keepdim, dtype)
std::vector<Value> Sum(LowerCtx& c) {
  const Type& ot = c.out();
  ET acc = ot.et == ET::PRED ? ET::S64 : ComputeType(ot.et);
  Value x = c.t(0);
  Dims dims;
  bool keepdim = false;
  bool has_dim = c.args.size() > 1 && c.has(1) && c.arg(1).kind == Arg::IntList;
  if (has_dim && !c.ints(1).empty()) {
    dims = NormDims(c.ints(1), x.rank());
  } else {
    for (int i = 0; i < x.rank(); ++i) dims.push_back(i);
  }
  if (has_dim) keepdim = c.flag(2);
  Value r = SumDims(c.b, x, dims, keepdim, acc);
  return {c.b.Reshape(r, ot.dims)};
}
TT_LOWERINGS(({"aten::sum", "aten::sum.dim_IntList", "aten::sum.IntList_out", "aten::sum.out"}), Sum);

// tril / triu over the last two dims
template <bool Lower>
std::vector<Value> Tri(LowerCtx& c) {
  const Type& ot = c.out();
  Value x = Cast(c.b, c.t(0), ot.et);
  int r = x.rank();
  if (r < 2) c.fail("expected a tensor with at least 2 dimensions");
  int64_t diag = c.i64_or(1, 0);
  Value i = c.b.Iota(Type(ET::S64, x.dims()), r - 2), j = c.b.Iota(Type(ET::S64, x.dims()), r - 1);
  Value d = c.b.Sub(j, i);
  Value keep = c.b.Compare(d, c.b.Splat(d.type, (double)diag), Lower ? "LE" : "GE");
  return {c.b.Select(keep, x, c.b.Zeros(x.type))};
}
TT_LOWERINGS(({"aten::tril", "aten::tril_", "aten::tril.out"}), Tri<true>);
TT_LOWERINGS(({"aten::triu", "aten::triu_", "aten::triu.out"}), Tri<false>);

}  // namespace
}  // namespace tt::ops
