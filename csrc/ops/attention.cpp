// Attention: scaled_dot_product_attention takes the math path on the tpu
// device (it is CompositeImplicit and decomposes into bmm / _safe_softmax /
// where / native_dropout / sum). Softmax, sum and tril live in their family
// files (nn.cpp, reduce.cpp, shape.cpp); this file adds _safe_softmax.
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
TT_LOWERINGS(({"aten::_safe_softmax"}), SoftmaxL<true>);

}  // namespace
}  // namespace tt::ops
