// Lowerings built on index-driven scatters of rows or points (RowScatter,
// PointScatter2 below) and their gathers: take / put_, index_fill,
// index_copy, masked_scatter (+ backward), scatter_reduce, embedding_bag
// (+ backwards), and nonzero_static (the static half of nonzero /
// masked_select / unique, see core/aten/dynamic.cpp). index.cpp has the
// gather/scatter ops of advanced indexing.
#include <algorithm>
#include <cmath>

#include "registry.h"
#include "sort_util.h"

namespace tt::ops {
namespace {



// Scatter of rows: out[idx[i], ...] (op)= upd[i, ...]; idx: [K] s64 along dim 0.
// Out-of-range rows are dropped.
Value RowScatter(Builder& b, Value x, Value idx, Value upd, const std::string& how) {
  int r = x.rank();
  int64_t k = idx.type.numel();
  idx = b.Reshape(Cast(b, idx, ET::S64), {k, 1});
  Dims win;
  for (int d = 1; d < r; ++d) win.push_back(d);
  upd = Cast(b, upd, x.et());
  AvoidSingleWindow(b, idx, upd, k, how);
  return b.Op1("stablehlo.scatter", {x, idx, upd}, x.type,
               "scatter_dimension_numbers = #stablehlo.scatter<update_window_dims = " + hlo::IntList(win) +
                   ", inserted_window_dims = [0], scatter_dims_to_operand_dims = [0], index_vector_dim = 1>, "
                   "indices_are_sorted = false, unique_indices = false",
               {ScatterCombiner(x.et(), how)});
}

Value Flat(Builder& b, Value x) { return b.Reshape(x, {x.type.numel()}); }
Value MoveToFront(Builder& b, Value x, int64_t dim) {
  Dims p{dim};
  for (int d = 0; d < x.rank(); ++d)
    if (d != dim) p.push_back(d);
  return b.Transpose(x, p);
}
Value MoveBack(Builder& b, Value x, int64_t dim) {
  Dims p;
  for (int d = 1; d <= dim; ++d) p.push_back(d);
  p.insert(p.begin() + dim, 0);
  // p maps result dim -> source dim: result d<dim from source d+1, result dim from 0
  Dims q;
  for (int d = 0; d < x.rank(); ++d) q.push_back(d < dim ? d + 1 : d == dim ? 0 : d);
  return b.Transpose(x, q);
}

// ---- nonzero_static: [size, ndim] coordinates of the first `size` nonzeros ----
std::vector<Value> NonzeroStatic(LowerCtx& c) {
  Builder& b = c.b;
  const Type& o = c.out();
  Value x = c.t(0);
  int64_t fill = c.i64_or(2, -1);
  int64_t size = o.dims[0], nd = x.rank();
  if (o.numel() == 0) return {b.Zeros(o)};
  Value out = b.Splat(o, (double)fill);
  int64_t n = x.type.numel();
  if (n == 0) return {out};
  Value m = Flat(b, Cast(b, x, ET::PRED));
  Value cnt = PrefixSum(b, b.Convert(m, ET::S64), 0);
  Type it(ET::S64, {n});
  Value row = b.Select(m, b.Sub(cnt, b.Splat(it, 1)), b.Splat(it, (double)size));
  Value lin = b.Iota(it, 0);
  std::vector<Value> cols;
  int64_t stride = 1;
  Dims strides(nd);
  for (int64_t d = nd - 1; d >= 0; --d) strides[d] = stride, stride *= x.dims()[d];
  for (int64_t d = 0; d < nd; ++d) {
    Value q = b.Div(lin, b.Splat(it, (double)strides[d]));
    q = b.Binary("remainder", q, b.Splat(it, (double)x.dims()[d]));
    cols.push_back(b.Reshape(q, {n, 1}));
  }
  Value coords = b.Concat(cols, 1);  // [n, nd]
  return {RowScatter(b, out, row, coords, "replace")};
}
TT_LOWERINGS(({"aten::nonzero_static", "aten::nonzero_static.out"}), NonzeroStatic);

// ---- take / put_ ----
std::vector<Value> Take(LowerCtx& c) {
  Builder& b = c.b;
  const Type& o = c.out();
  Value x = c.t(0);
  if (o.numel() == 0) return {b.Zeros(o)};
  int64_t n = x.type.numel();
  Value idx = WrapIndex(b, Flat(b, c.t(1)), n);
  return {b.Reshape(RowGather(b, Flat(b, x), idx), o.dims)};
}
TT_LOWERINGS(({"aten::take", "aten::take.out"}), Take);

std::vector<Value> Put(LowerCtx& c) {
  Builder& b = c.b;
  Value x = c.t(0);
  Value idx = c.t(1);
  if (idx.type.numel() == 0 || x.type.numel() == 0) return {x};
  int64_t n = x.type.numel();
  Value src = Flat(b, Cast(b, c.t(2), x.et()));
  Value r = RowScatter(b, Flat(b, x), WrapIndex(b, Flat(b, idx), n), src, c.flag(3) ? "add" : "replace");
  return {b.Reshape(r, x.dims())};
}
TT_LOWERINGS(({"aten::put_", "aten::put", "aten::put.out"}), Put);

// ---- index_fill / index_copy ----
std::vector<Value> IndexFill(LowerCtx& c) {
  Builder& b = c.b;
  const Type& o = c.out();
  Value x = c.t(0);
  if (x.rank() == 0) {
    Value idx = c.t(2);
    if (idx.type.numel() == 0) return {x};
    return {b.Reshape(Cast(b, c.t(3), o.et), {})};
  }
  int64_t dim = NormDim(c.i64(1), x.rank());
  int64_t n = x.dims()[dim];
  Value idx = c.t(2);
  if (idx.type.numel() == 0 || o.numel() == 0) return {x};
  Value mask = b.Splat(Type(ET::PRED, {n}), 0);
  mask = RowScatter(b, mask, WrapIndex(b, Flat(b, idx), n), b.Splat(Type(ET::PRED, {idx.type.numel()}), 1), "replace");
  Value mb = b.Broadcast(mask, x.dims(), {dim});
  Value v = b.BroadcastTo(b.Reshape(Cast(b, c.t(3), o.et), {}), x.dims());
  return {b.Select(mb, v, x)};
}
TT_LOWERINGS(({"aten::index_fill_.int_Scalar", "aten::index_fill_.int_Tensor", "aten::index_fill.int_Scalar",
               "aten::index_fill.int_Tensor", "aten::index_fill.int_Scalar_out", "aten::index_fill.int_Tensor_out"}),
             IndexFill);

std::vector<Value> IndexCopy(LowerCtx& c) {
  Builder& b = c.b;
  const Type& o = c.out();
  Value x = Cast(b, c.t(0), o.et);
  Value idx = c.t(2), src = Cast(b, c.t(3), o.et);
  if (idx.type.numel() == 0 || o.numel() == 0) return {x};
  if (x.rank() == 0) return {b.Reshape(src, {})};
  int64_t dim = NormDim(c.i64(1), x.rank());
  Value xt = MoveToFront(b, x, dim);
  Dims sd = x.dims();
  sd[dim] = idx.type.numel();
  Value st = MoveToFront(b, b.Reshape(src, sd), dim);
  Value r = RowScatter(b, xt, WrapIndex(b, Flat(b, idx), x.dims()[dim]), st, "replace");
  return {MoveBack(b, r, dim)};
}
TT_LOWERINGS(({"aten::index_copy", "aten::index_copy_", "aten::index_copy.out"}), IndexCopy);

// ---- masked_scatter: the k-th masked element takes source[k] ----
std::vector<Value> MaskedScatter(LowerCtx& c) {
  Builder& b = c.b;
  const Type& o = c.out();
  Value x = Cast(b, c.t(0), o.et);
  if (o.numel() == 0) return {x};
  Value m = Flat(b, Bcast(b, c.t(1), o.dims, ET::PRED));
  Value src = Flat(b, Cast(b, c.t(2), o.et));
  int64_t n = o.numel();
  if (src.type.numel() == 0) return {x};
  Value pos = b.Sub(PrefixSum(b, b.Convert(m, ET::S64), 0), b.Splat(Type(ET::S64, {n}), 1));
  pos = b.Max(pos, b.Zeros(pos.type));
  Value g = RowGather(b, src, pos);
  return {b.Reshape(b.Select(m, g, Flat(b, x)), o.dims)};
}
TT_LOWERINGS(({"aten::masked_scatter_", "aten::masked_scatter", "aten::masked_scatter.out"}), MaskedScatter);

// grad of source: masked elements of grad in order, zero-padded to numel(sizes).
std::vector<Value> MaskedScatterBackward(LowerCtx& c) {
  Builder& b = c.b;
  const Type& o = c.out();
  Value g = c.t(0);
  int64_t n = o.numel();
  Value out = b.Zeros(Type(g.et(), {n}));
  if (n == 0 || g.type.numel() == 0) return {b.Reshape(out, o.dims)};
  Value m = Flat(b, Bcast(b, c.t(1), g.dims(), ET::PRED));
  int64_t k = m.type.numel();
  Value pos = b.Sub(PrefixSum(b, b.Convert(m, ET::S64), 0), b.Splat(Type(ET::S64, {k}), 1));
  pos = b.Select(m, pos, b.Splat(pos.type, (double)n));
  return {b.Reshape(RowScatter(b, out, pos, Flat(b, g), "replace"), o.dims)};
}
TT_LOWERINGS(({"aten::masked_scatter_backward"}), MaskedScatterBackward);

// ---- scatter_reduce.two ----
Value DimCoords2(Builder& b, Value index, int64_t dim) {
  int r = index.rank();
  index = Cast(b, index, ET::S64);
  Dims cd = index.dims();
  cd.push_back(1);
  std::vector<Value> parts;
  for (int d = 0; d < r; ++d) parts.push_back(b.Reshape(d == dim ? index : b.Iota(index.type, d), cd));
  return b.Concat(parts, r);
}
Value PointScatter2(Builder& b, Value x, Value coords, Value upd, const std::string& how) {
  int r = x.rank();
  std::string seq = "[";
  for (int i = 0; i < r; ++i) seq += (i ? ", " : "") + std::to_string(i);
  seq += "]";
  return b.Op1("stablehlo.scatter", {x, coords, Cast(b, upd, x.et())}, x.type,
               "scatter_dimension_numbers = #stablehlo.scatter<inserted_window_dims = " + seq +
                   ", scatter_dims_to_operand_dims = " + seq + ", index_vector_dim = " +
                   std::to_string(coords.rank() - 1) + ">, indices_are_sorted = false, unique_indices = false",
               {ScatterCombiner(x.et(), how)});
}

std::vector<Value> ScatterReduce(LowerCtx& c) {
  Builder& b = c.b;
  const Type& o = c.out();
  ET et = o.et;
  Value x = Cast(b, c.t(0), et), idx = c.t(2);
  std::string red = c.arg(4).s;
  bool include_self = c.flag(5, true);
  if (idx.type.numel() == 0 || o.numel() == 0) return {x};
  Dims od = x.dims();
  if (x.rank() == 0) x = b.Reshape(x, {1});
  if (idx.rank() == 0) idx = b.Reshape(idx, Dims(x.rank(), 1));
  int64_t dim = NormDim(c.i64(1), x.rank());
  Value src = Cast(b, c.t(3), et);
  if (src.rank() == 0) src = b.Reshape(src, Dims(x.rank(), 1));
  Value upd = b.Slice(src, Dims(idx.rank(), 0), idx.dims(), Dims(idx.rank(), 1));
  idx = WrapIndex(b, idx, x.dims()[dim]);
  Value coords = DimCoords2(b, idx, dim);
  std::string how = red == "sum" || red == "mean" ? "add" : red == "prod" ? "multiply" : red == "amax" ? "max" : "min";
  Value base = x;
  if (!include_self) {
    double ident = how == "add" ? 0 : how == "multiply" ? 1 : how == "max" ? -INFINITY : INFINITY;
    Value idv;
    if (IsFloat(et)) {
      idv = b.Splat(Type(et, idx.dims()), ident);
    } else if (how == "max" || how == "min") {
      // integer extremes: src's own minimum (maximum) is an identity for max (min)
      Value all = Flat(b, upd);
      Value ext = b.Reduce(all, b.Reshape(b.Slice(all, {0}, {1}, {1}), {}), {0}, how == "max" ? "minimum" : "maximum");
      idv = b.BroadcastTo(ext, idx.dims());
    } else {
      idv = b.Splat(Type(et, idx.dims()), ident);
    }
    base = PointScatter2(b, x, coords, idv, "replace");
  }
  Value r = PointScatter2(b, base, coords, upd, how);
  if (red == "mean") {
    Value ones = b.Splat(Type(et, idx.dims()), 1);
    Value cnt = PointScatter2(b, b.Splat(x.type, include_self ? 1 : 0), coords, ones, "add");
    Value safe = b.Max(cnt, b.Splat(cnt.type, 1));
    Value q = b.Div(r, safe);
    r = b.Select(b.Compare(cnt, b.Zeros(cnt.type), "EQ"), x, q);
  }
  return {b.Reshape(r, od)};
}
TT_LOWERINGS(({"aten::scatter_reduce.two", "aten::scatter_reduce_.two", "aten::scatter_reduce.two_out"}),
             ScatterReduce);


// ---- embedding_bag: modes 0 sum, 1 mean, 2 max ----
// bag of each index position from offsets: #(offsets <= i) - 1
Value BagOf(Builder& b, Value offsets, int64_t nI, int64_t B) {
  offsets = Cast(b, offsets, ET::S64);
  int64_t no = offsets.type.numel();
  Type pt(ET::S64, {nI, no});
  Value pos = b.Iota(pt, 0);
  Value ob = b.Broadcast(offsets, {nI, no}, {1});
  Value cnt = SumDims(b, b.Compare(ob, pos, "LE"), {1}, false, ET::S64);
  Value bag = b.Sub(cnt, b.Splat(cnt.type, 1));
  bag = b.Max(bag, b.Zeros(bag.type));
  return b.Min(bag, b.Splat(bag.type, (double)(B - 1)));
}

Value Valid(Builder& b, Value idx, int64_t padding_idx) {
  if (padding_idx < 0) return b.Splat(idx.type.with_et(ET::PRED), 1);
  return b.Compare(idx, b.Splat(idx.type, (double)padding_idx), "NE");
}

std::vector<Value> EmbeddingBag(LowerCtx& c) {
  Builder& b = c.b;
  Value w = c.t(0), idx = Cast(b, Flat(b, c.t(1)), ET::S64), offsets = c.t(2);
  int64_t mode = c.i64_or(4, 0), padding_idx = c.i64_or(8, -1);
  const Type& o = c.out(0);
  int64_t B = o.dims[0], D = o.dims[1], nI = idx.type.numel();
  ET ct = ComputeType(o.et);
  std::vector<Value> res;
  // offset2bag / bag_size / max_indices in the meta kernel's shapes (bag_size
  // and max_indices have one row per offset with include_last_offset)
  auto fit = [&](Value v, const Type& t) {
    if (t.numel() == 0) return b.Zeros(t);
    if (v.dims() == t.dims) return v;
    Dims lo(v.rank(), 0), hi(v.rank(), 0), in(v.rank(), 0);
    hi[0] = t.dims[0] - v.dims()[0];
    if (hi[0] < 0) return b.Zeros(t);
    return b.Pad(v, b.ScalarConst(v.et(), 0), lo, hi, in);
  };
  auto fill_rest = [&](Value bag, Value bag_size, Value maxi) {
    res.push_back(fit(bag, c.out(1)));
    res.push_back(fit(bag_size, c.out(2)));
    res.push_back(c.out(3).numel() == 0 ? b.Zeros(c.out(3))
                                        : fit(c.out(3).rank() == 1 ? Flat(b, b.Slice(maxi, {0, 0}, {maxi.dims()[0], 1}, {1, 1})) : maxi, c.out(3)));
  };
  if (B == 0 || nI == 0) {
    res.push_back(b.Zeros(o));
    fill_rest(b.Zeros(c.out(1)), b.Zeros(c.out(2)), b.Zeros(c.out(3)));
    return res;
  }
  Value bag = BagOf(b, offsets, nI, B);
  Value valid = Valid(b, idx, padding_idx);
  Value rows = Cast(b, RowGather(b, w, idx), ct);  // [nI, D]
  if (c.has(6) && mode == 0) rows = b.Mul(rows, b.Broadcast(Cast(b, Flat(b, c.t(6)), ct), {nI, D}, {0}));
  Value vb = b.Broadcast(valid, {nI, D}, {0});
  Value cnt = RowScatter(b, b.Zeros(Type(ET::S64, {B})), bag, b.Convert(valid, ET::S64), "add");
  Value out, maxi = b.Zeros(Type(ET::S64, {B, D}));
  Value bag_for = b.Select(valid, bag, b.Splat(bag.type, (double)B));  // invalid rows dropped
  if (mode == 2) {
    Value m = RowScatter(b, b.Splat(Type(ct, {B, D}), -INFINITY), bag_for, rows, "max");
    Value empty = b.Broadcast(b.Compare(cnt, b.Zeros(cnt.type), "EQ"), {B, D}, {0});
    out = b.Select(empty, b.Zeros(m.type), m);
    // first position reaching the max, then its index value
    Value mi = RowGather(b, m, bag);  // [nI, D]
    Value hit = b.Binary("and", b.Compare(rows, mi, "EQ"), vb);
    Value posv = b.Select(hit, b.Iota(Type(ET::S64, {nI, D}), 0), b.Splat(Type(ET::S64, {nI, D}), (double)nI));
    Value first = RowScatter(b, b.Splat(Type(ET::S64, {B, D}), (double)nI), bag, posv, "min");
    Value safe = b.Min(first, b.Splat(first.type, (double)(nI - 1)));
    Value iv = b.Reshape(RowGather(b, idx, Flat(b, safe)), {B, D});
    maxi = b.Select(empty, b.Zeros(iv.type), iv);
  } else {
    out = RowScatter(b, b.Zeros(Type(ct, {B, D})), bag_for, rows, "add");
    if (mode == 1) {
      Value cf = b.Broadcast(b.Convert(b.Max(cnt, b.Splat(cnt.type, 1)), ct), {B, D}, {0});
      out = b.Div(out, cf);
    }
  }
  res.push_back(Cast(b, out, o.et));
  fill_rest(bag, cnt, maxi);
  return res;
}
TT_LOWERINGS(({"aten::_embedding_bag", "aten::_embedding_bag_forward_only"}), EmbeddingBag);

// dense gradient of the weight
Value EmbBagGrad(LowerCtx& c, Value g, Value idx, Value bag, Value maxi, int64_t num_weights, bool scale,
                 int64_t mode, std::optional<Value> psw, int64_t padding_idx, const Type& o) {
  Builder& b = c.b;
  ET ct = ComputeType(o.et);
  int64_t nI = idx.type.numel(), D = o.dims[1], B = g.dims()[0];
  g = Cast(b, g, ct);
  Value acc = b.Zeros(Type(ct, {num_weights, D}));
  if (nI == 0 || B == 0) return acc;
  Value valid = Valid(b, idx, padding_idx);
  if (mode == 2) {
    Value mi = Cast(b, maxi, ET::S64);  // [B, D] index values
    // per (bag, d): grad goes to weight[mi, d]; empty bags (no valid index) skipped via count
    Value cnt = RowScatter(b, b.Zeros(Type(ET::S64, {B})), bag, b.Convert(valid, ET::S64), "add");
    Value ok = b.Broadcast(b.Compare(cnt, b.Zeros(cnt.type), "GT"), {B, D}, {0});
    Value row = b.Select(ok, mi, b.Splat(mi.type, (double)num_weights));
    Value col = b.Iota(Type(ET::S64, {B, D}), 1);
    Value coords = b.Concat({b.Reshape(row, {B, D, 1}), b.Reshape(col, {B, D, 1})}, 2);
    return PointScatter2(b, acc, coords, g, "add");
  }
  Value rows = RowGather(b, g, bag);  // [nI, D]
  Value scalev = b.Splat(Type(ct, {nI}), 1);
  if (mode == 1) {
    Value cnt = RowScatter(b, b.Zeros(Type(ET::S64, {B})), bag, b.Convert(valid, ET::S64), "add");
    Value per = RowGather(b, b.Convert(b.Max(cnt, b.Splat(cnt.type, 1)), ct), bag);
    scalev = b.Div(scalev, per);
  }
  if (psw && mode == 0) scalev = b.Mul(scalev, Cast(b, Flat(b, *psw), ct));
  if (scale) {
    Value freq = RowScatter(b, b.Zeros(Type(ct, {num_weights})), b.Select(valid, idx, b.Splat(idx.type, (double)num_weights)),
                            b.Splat(Type(ct, {nI}), 1), "add");
    scalev = b.Div(scalev, b.Max(RowGather(b, freq, b.Min(idx, b.Splat(idx.type, (double)(num_weights - 1)))),
                                 b.Splat(Type(ct, {nI}), 1)));
  }
  rows = b.Mul(rows, b.Broadcast(scalev, {nI, D}, {0}));
  Value target = b.Select(valid, idx, b.Splat(idx.type, (double)num_weights));
  return RowScatter(b, acc, target, rows, "add");
}

std::vector<Value> EmbeddingBagBackward(LowerCtx& c) {
  Builder& b = c.b;
  if (c.flag(9)) c.fail("sparse gradients are not supported on tpu");
  const Type& o = c.out();
  Value idx = Cast(b, Flat(b, c.t(1)), ET::S64);
  int64_t B = c.t(0).dims()[0];
  Value bag = idx.type.numel() && B ? BagOf(b, c.t(2), idx.type.numel(), B) : idx;
  std::optional<Value> psw;
  if (c.has(10)) psw = c.t(10);
  Value r = EmbBagGrad(c, c.t(0), idx, bag, c.t(5), c.i64(6), c.flag(7), c.i64(8), psw, c.i64_or(11, -1), o);
  return {Cast(b, r, o.et)};
}
TT_LOWERINGS(({"aten::_embedding_bag_backward"}), EmbeddingBagBackward);

std::vector<Value> EmbeddingBagDenseBackward(LowerCtx& c) {
  Builder& b = c.b;
  const Type& o = c.out();
  Value idx = Cast(b, Flat(b, c.t(1)), ET::S64);
  std::optional<Value> psw;
  if (c.has(8)) psw = c.t(8);
  Value r = EmbBagGrad(c, c.t(0), idx, Cast(b, c.t(2), ET::S64), c.t(4), c.i64(5), c.flag(6), c.i64(7), psw,
                       c.i64_or(9, -1), o);
  return {Cast(b, r, o.et)};
}
TT_LOWERINGS(({"aten::_embedding_bag_dense_backward", "aten::_embedding_bag_dense_backward.out"}),
             EmbeddingBagDenseBackward);

// d out[bag(i)] / d psw[i] = weight[indices[i]] (sum mode)
std::vector<Value> EmbeddingBagPswBackward(LowerCtx& c) {
  Builder& b = c.b;
  const Type& o = c.out();
  Value g = c.t(0), w = c.t(1), idx = Cast(b, Flat(b, c.t(2)), ET::S64);
  int64_t nI = idx.type.numel(), B = g.dims()[0];
  if (nI == 0 || B == 0) return {b.Zeros(o)};
  ET ct = ComputeType(o.et);
  Value bag = BagOf(b, c.t(3), nI, B);
  Value prod = b.Mul(Cast(b, RowGather(b, g, bag), ct), Cast(b, RowGather(b, w, idx), ct));
  Value r = SumDims(b, prod, {1}, false, ct);
  r = b.Select(Valid(b, idx, c.i64_or(6, -1)), r, b.Zeros(r.type));
  return {Cast(b, r, o.et)};
}
TT_LOWERINGS(({"aten::_embedding_bag_per_sample_weights_backward"}), EmbeddingBagPswBackward);

}  // namespace
}  // namespace tt::ops
