// Creation: linspace, logspace, eye, tril_indices / triu_indices.
// (empty/zeros/ones/full are empty + fill_/zero_; arange is in shape.cpp.)
#include <cmath>

#include "registry.h"

namespace tt::ops {
namespace {

// torch's linspace: start + i*step for the first half, end - (n-1-i)*step
// for the second (symmetric rounding), in `acc`.
Value Linspace(Builder& b, Value start, Value end, int64_t steps, ET acc) {
  Type t(acc, {steps});
  start = b.BroadcastTo(Cast(b, start, acc), {steps});
  end = b.BroadcastTo(Cast(b, end, acc), {steps});
  if (steps == 1) return start;
  Value i = b.Iota(t, 0);
  Value step = b.Div(b.Sub(end, start), b.Splat(t, (double)(steps - 1)));
  Value lo = b.Add(start, b.Mul(i, step));
  Value hi = b.Sub(end, b.Mul(b.Sub(b.Splat(t, (double)(steps - 1)), i), step));
  Value first = b.Compare(i, b.Splat(t, (double)(steps / 2)), "LT");
  return b.Select(first, lo, hi);
}

std::vector<Value> LinspaceOut(LowerCtx& c) {
  Builder& b = c.b;
  const Type& o = c.out();
  int64_t steps = c.i64(2);
  if (o.numel() == 0) return {b.Zeros(o)};
  ET acc = IsFloat(o.et) ? ComputeType(o.et) : hlo::IsComplex(o.et) ? o.et : ET::F64;
  Value r = Linspace(b, c.t(0), c.t(1), steps, acc);
  if (!IsFloat(o.et) && !hlo::IsComplex(o.et)) {
    // integer linspace: CPU steps in integer arithmetic from the start
    Type t(ET::F64, {steps});
    Value s = b.BroadcastTo(Cast(b, c.t(0), ET::F64), {steps});
    Value e = b.BroadcastTo(Cast(b, c.t(1), ET::F64), {steps});
    Value st = steps == 1 ? b.Zeros(t) : b.Div(b.Sub(e, s), b.Splat(t, (double)(steps - 1)));
    r = b.Add(s, b.Mul(b.Iota(t, 0), st));
  }
  return {Cast(b, r, o.et)};
}
TT_LOWERINGS(({"aten::linspace.out", "aten::linspace.Tensor_Tensor_out", "aten::linspace.Tensor_Scalar_out",
               "aten::linspace.Scalar_Tensor_out"}), LinspaceOut);

std::vector<Value> LogspaceOut(LowerCtx& c) {
  Builder& b = c.b;
  const Type& o = c.out();
  int64_t steps = c.i64(2);
  if (o.numel() == 0) return {b.Zeros(o)};
  double base = c.f64_or(3, 10.0);
  ET acc = IsFloat(o.et) ? ET::F64 : hlo::IsComplex(o.et) ? o.et : ET::F64;
  Value e = Linspace(b, c.t(0), c.t(1), steps, acc);
  Value r = b.Op1("stablehlo.power", {b.Splat(e.type, base), e}, e.type);
  return {Cast(b, r, o.et)};
}
TT_LOWERINGS(({"aten::logspace.out", "aten::logspace.Tensor_Tensor_out", "aten::logspace.Tensor_Scalar_out",
               "aten::logspace.Scalar_Tensor_out"}), LogspaceOut);

std::vector<Value> EyeOut(LowerCtx& c) {
  Builder& b = c.b;
  const Type& o = c.out();
  if (o.numel() == 0) return {b.Zeros(o)};
  Type it = o.with_et(ET::S64);
  Value m = b.Compare(b.Iota(it, 0), b.Iota(it, 1), "EQ");
  return {Cast(b, m, o.et)};
}
TT_LOWERINGS(({"aten::eye.out", "aten::eye.m_out"}), EyeOut);

// Row/column coordinates of the lower (upper) triangle, row-major: a
// function of the static sizes only, so a constant.
template <bool Lower>
std::vector<Value> TriIndices(LowerCtx& c) {
  Builder& b = c.b;
  const Type& o = c.out();
  int64_t row = c.i64(0), col = c.i64(1), off = c.i64_or(2, 0);
  int64_t n = o.dims[1];
  if (n == 0) return {b.Zeros(o)};
  std::string rs = "[", cs = "[";
  int64_t k = 0;
  for (int64_t i = 0; i < row; ++i)
    for (int64_t j = 0; j < col; ++j) {
      bool in = Lower ? j - i <= off : j - i >= off;
      if (!in) continue;
      if (k++) rs += ", ", cs += ", ";
      rs += std::to_string(i);
      cs += std::to_string(j);
    }
  if (k != n) c.fail("internal: triangle size mismatch");
  Value r = b.Constant(Type(ET::S64, {2, n}), "[" + rs + "], " + cs + "]]");
  return {Cast(b, r, o.et)};
}
TT_LOWERINGS(({"aten::tril_indices", "aten::tril_indices.out"}), TriIndices<true>);
TT_LOWERINGS(({"aten::triu_indices", "aten::triu_indices.out"}), TriIndices<false>);

}  // namespace
}  // namespace tt::ops
