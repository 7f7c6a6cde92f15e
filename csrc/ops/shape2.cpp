// Shape / data movement extras: unfold_backward.
// (diag, diag_embed, diagonal, narrow_copy, one_hot, meshgrid, *_scatter,
// select/slice_backward already reach native ops through decompositions.)
#include "registry.h"

namespace tt::ops {
namespace {

// grad_in: input dims with `dim` -> W windows, plus a trailing window axis K.
// Element (w, k) came from input position w*step + k: scatter-add.
std::vector<Value> UnfoldBackward(LowerCtx& c) {
  Builder& b = c.b;
  const Type& o = c.out();
  Value g = Cast(b, c.t(0), o.et);
  if (o.numel() == 0 || g.type.numel() == 0) return {b.Zeros(o)};
  int r = o.rank();
  int64_t dim = r == 0 ? 0 : NormDim(c.i64(2), r);
  int64_t step = c.i64(4);
  if (r == 0) return {b.Reshape(g, {})};
  int64_t W = g.dims()[dim], K = g.dims().back();
  // g -> [W, K, rest...]
  Dims perm{dim, (int64_t)r};
  Dims rest;
  for (int d = 0; d < r; ++d)
    if (d != dim) perm.push_back(d), rest.push_back(o.dims[d]);
  Value gt = b.Transpose(g, perm);
  Dims fd{W * K};
  fd.insert(fd.end(), rest.begin(), rest.end());
  gt = b.Reshape(gt, fd);
  Type it(ET::S64, {W, K});
  Value pos = b.Add(b.Mul(b.Iota(it, 0), b.Splat(it, (double)step)), b.Iota(it, 1));
  pos = b.Reshape(pos, {W * K, 1});
  Dims od{o.dims[dim]};
  od.insert(od.end(), rest.begin(), rest.end());
  Value acc = b.Zeros(Type(o.et, od));
  Dims win;
  for (int d = 1; d < r; ++d) win.push_back(d);
  hlo::Region reg;
  reg.arg_types = {Type(o.et, {}), Type(o.et, {})};
  reg.body = [](Builder& bb, const std::vector<Value>& a) { return std::vector<Value>{bb.Add(a[0], a[1])}; };
  Value s = b.Op1("stablehlo.scatter", {acc, pos, gt}, acc.type,
                  "scatter_dimension_numbers = #stablehlo.scatter<update_window_dims = " + hlo::IntList(win) +
                      ", inserted_window_dims = [0], scatter_dims_to_operand_dims = [0], index_vector_dim = 1>, "
                      "indices_are_sorted = false, unique_indices = false",
                  {reg});
  // [N, rest...] -> original order
  Dims back;
  for (int d = 0; d < r; ++d) back.push_back(d < dim ? d + 1 : d == dim ? 0 : d);
  return {b.Transpose(s, back)};
}
TT_LOWERINGS(({"aten::unfold_backward", "aten::unfold_backward.out"}), UnfoldBackward);

}  // namespace
}  // namespace tt::ops
