// Shape / data movement: cat, stack, arange, tril/triu, flip, roll, repeat,
// constant_pad_nd, unfold_backward. (diag, diag_embed, diagonal, narrow_copy,
// one_hot, meshgrid, *_scatter, select/slice_backward reach native ops
// through decompositions.)
#include "nn_util.h"
#include "registry.h"

namespace tt::ops {
namespace {

std::vector<Value> Cat(LowerCtx& c) {
  Builder& b = c.b;
  const Type& o = c.out();
  std::vector<Value> vs;
  int r = o.rank();
  int64_t dim = NormDim(c.i64_or(1, 0), r);
  for (auto& v : c.tl(0)) {
    // legacy: 1-D empty tensors are skipped
    if (v.rank() == 1 && v.dims()[0] == 0 && r != 1) continue;
    if (v.type.numel() == 0) continue;
    vs.push_back(Cast(b, v, o.et));
  }
  if (vs.empty()) return {b.Zeros(o)};
  return {b.Concat(vs, dim)};
}
TT_LOWERINGS(({"aten::cat", "aten::cat.out"}), Cat);

std::vector<Value> Stack(LowerCtx& c) {
  Builder& b = c.b;
  const Type& o = c.out();
  int64_t dim = NormDim(c.i64_or(1, 0), o.rank());
  std::vector<Value> vs;
  for (auto& v : c.tl(0)) {
    Dims d = v.dims();
    d.insert(d.begin() + dim, 1);
    vs.push_back(b.Reshape(Cast(b, v, o.et), d));
  }
  if (o.numel() == 0) return {b.Zeros(o)};
  return {b.Concat(vs, dim)};
}
TT_LOWERINGS(({"aten::stack", "aten::stack.out"}), Stack);

// start + i * step (computed in f64 / s64, like torch's accumulate type)
std::vector<Value> Arange(LowerCtx& c) {
  Builder& b = c.b;
  const Type& o = c.out();
  ET acc = hlo::IsFloat(o.et) ? ET::F64 : ET::S64;
  if (o.numel() == 0) return {b.Zeros(o)};
  Value i = b.Iota(o.with_et(acc), 0);
  if (c.op == "aten::arange.out" || c.op == "aten::arange") return {i};
  Value start = b.BroadcastTo(Cast(b, c.t(0), acc), o.dims);
  if (c.args.size() < 3 || c.arg(2).kind != Arg::Scalar) return {b.Add(start, i)};  // arange.start
  Value step = b.BroadcastTo(Cast(b, c.t(2), acc), o.dims);
  return {b.Add(start, b.Mul(i, step))};
}
TT_LOWERINGS(({"aten::arange.start_out", "aten::arange.out"}), Arange);
// factory forms in compiled graphs
TT_GRAPH_LOWERINGS(({"aten::arange", "aten::arange.start", "aten::arange.start_step"}), Arange);

template <bool Lower>
std::vector<Value> Tri(LowerCtx& c) {
  Builder& b = c.b;
  const Type& o = c.out();
  Value x = Cast(b, c.t(0), o.et);
  int r = x.rank();
  if (r < 2) c.fail("tril/triu: input tensor must have at least 2 dimensions");
  int64_t k = c.i64_or(1, 0);
  Type it = x.type.with_et(ET::S64);
  Value diff = b.Sub(b.Iota(it, r - 1), b.Iota(it, r - 2));  // col - row
  Value m = b.Compare(diff, b.Splat(it, (double)k), Lower ? "LE" : "GE");
  return {b.Select(m, x, b.Zeros(x.type))};
}
TT_LOWERINGS(({"aten::tril", "aten::tril_", "aten::tril.out"}), Tri<true>);
TT_LOWERINGS(({"aten::triu", "aten::triu_", "aten::triu.out"}), Tri<false>);

std::vector<Value> Flip(LowerCtx& c) {
  Builder& b = c.b;
  Value x = c.t(0);
  Dims dims = NormDims(c.ints(1), x.rank());
  if (dims.empty()) return {x};
  return {b.Op1("stablehlo.reverse", {x}, x.type, "dimensions = " + hlo::I64Array(dims))};
}
TT_LOWERINGS(({"aten::flip", "aten::flip.out"}), Flip);

Value Roll1(Builder& b, Value x, int64_t d, int64_t shift) {
  int64_t n = x.dims()[d];
  if (n == 0) return x;
  int64_t s = ((shift % n) + n) % n;
  if (s == 0) return x;
  int r = x.rank();
  Dims st(r, 0), lim = x.dims(), str(r, 1);
  Dims st2 = st, lim2 = lim;
  st[d] = n - s;         // tail
  lim2[d] = n - s;       // head
  return b.Concat({b.Slice(x, st, lim, str), b.Slice(x, st2, lim2, str)}, d);
}

std::vector<Value> Roll(LowerCtx& c) {
  Builder& b = c.b;
  Value x = c.t(0);
  std::vector<int64_t> shifts = c.ints(1), dims = c.has(2) ? c.ints(2) : std::vector<int64_t>{};
  if (dims.empty()) {
    Value f = b.Reshape(x, {x.type.numel()});
    return {b.Reshape(Roll1(b, f, 0, shifts.at(0)), x.dims())};
  }
  if (shifts.size() != dims.size()) c.fail("shifts and dimensions must align");
  for (size_t i = 0; i < dims.size(); ++i) x = Roll1(b, x, NormDim(dims[i], x.rank()), shifts[i]);
  return {x};
}
TT_LOWERINGS(({"aten::roll", "aten::roll.out"}), Roll);

std::vector<Value> Repeat(LowerCtx& c) {
  Builder& b = c.b;
  const Type& o = c.out();
  Value x = c.t(0);
  std::vector<int64_t> rep = c.ints(1);
  if (o.numel() == 0) return {b.Zeros(o)};
  Dims xd = x.dims();
  xd.insert(xd.begin(), rep.size() - xd.size(), 1);
  x = b.Reshape(x, xd);
  // broadcast to [r0, d0, r1, d1, ...] then merge
  Dims big, bd;
  for (size_t i = 0; i < rep.size(); ++i) {
    big.push_back(rep[i]);
    big.push_back(xd[i]);
    bd.push_back(2 * i + 1);
  }
  return {b.Reshape(b.Broadcast(x, big, bd), o.dims)};
}
TT_LOWERINGS(({"aten::repeat", "aten::repeat.out"}), Repeat);

std::vector<Value> ConstantPad(LowerCtx& c) {
  Builder& b = c.b;
  const Type& o = c.out();
  Value x = Cast(b, c.t(0), o.et);
  std::vector<int64_t> pad = c.ints(1);
  int r = x.rank();
  Dims lo(r, 0), hi(r, 0), in(r, 0);
  for (size_t i = 0; i + 1 < pad.size() + 1 && i / 2 < (size_t)r; i += 2) {
    int d = r - 1 - (int)(i / 2);
    lo[d] = pad[i];
    hi[d] = pad[i + 1];
  }
  if (o.numel() == 0) return {b.Zeros(o)};
  Value pv = c.has(2) ? Cast(b, c.t(2), o.et) : b.ScalarConst(o.et, 0);
  if (x.type.numel() == 0) return {b.BroadcastTo(pv, o.dims)};
  return {b.Pad(x, pv, lo, hi, in)};
}
TT_LOWERINGS(({"aten::constant_pad_nd", "aten::constant_pad_nd.out"}), ConstantPad);


// ---- unfold_backward ----
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
