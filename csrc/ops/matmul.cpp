// Matrix products: mm, bmm, addmm, baddbmm, matmul, dot, ...
#include "registry.h"

namespace tt::ops {
namespace {

std::vector<Value> Mm(LowerCtx& c) {
  ET et = c.out().et;
  return {Cast(c.b, Matmul(c.b, c.t(0), c.t(1), ComputeType(et) == ET::F32 && et != ET::F32 ? et : et), et)};
}
TT_LOWERINGS(({"aten::mm", "aten::mm.out", "aten::bmm", "aten::bmm.out", "aten::matmul",
               "aten::matmul.out", "aten::dot", "aten::dot.out", "aten::mv", "aten::mv.out"}), Mm);

// beta * self + alpha * (m1 @ m2)
std::vector<Value> Addmm(LowerCtx& c) {
  ET et = c.out().et;
  const Dims& d = c.out().dims;
  Value p = Matmul(c.b, c.t(1), c.t(2), et);
  Value s = Bcast(c.b, c.t(0), d, et);
  if (c.has(4) && c.arg(4).kind == Arg::Scalar && c.arg(4).scalar_hint != 1.0)
    p = c.b.Mul(p, Bcast(c.b, c.t(4), d, et));
  if (c.has(3) && c.arg(3).kind == Arg::Scalar) {
    if (c.arg(3).scalar_hint == 0.0) return {p};  // beta = 0 ignores self (even NaN)
    if (c.arg(3).scalar_hint != 1.0) s = c.b.Mul(s, Bcast(c.b, c.t(3), d, et));
  }
  return {c.b.Add(s, p)};
}
TT_LOWERINGS(({"aten::addmm", "aten::addmm_", "aten::addmm.out", "aten::baddbmm", "aten::baddbmm_",
               "aten::baddbmm.out", "aten::addmv", "aten::addmv_", "aten::addmv.out"}), Addmm);

}  // namespace
}  // namespace tt::ops
