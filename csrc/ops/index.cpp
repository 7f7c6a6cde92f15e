// Indexing: index_select, index_add, gather, scatter / scatter_add,
// index.Tensor (advanced indexing), index_put / _index_put_impl_, masked_fill.
// Out-of-range indices are not checked on the device (XLA clamps gathers and
// drops out-of-range scatter updates).
#include <algorithm>

#include "nn_util.h"
#include "registry.h"

namespace tt::ops {
namespace {

std::string Seq(int64_t a, int64_t b) {
  std::string s = "[";
  for (int64_t i = a; i < b; ++i) s += (i > a ? ", " : "") + std::to_string(i);
  return s + "]";
}
std::string List(const Dims& d) {
  std::string s = "[";
  for (size_t i = 0; i < d.size(); ++i) s += (i ? ", " : "") + std::to_string(d[i]);
  return s + "]";
}



// operand[coords[..., :]] for full coordinate tuples (index_vector_dim last).
Value PointGather(Builder& b, Value x, Value coords) {
  int r = x.rank();
  Dims bd(coords.dims().begin(), coords.dims().end() - 1);
  return b.Op1("stablehlo.gather", {x, coords}, Type(x.et(), bd),
               "dimension_numbers = #stablehlo.gather<collapsed_slice_dims = " + Seq(0, r) +
                   ", start_index_map = " + Seq(0, r) + ", index_vector_dim = " +
                   std::to_string(bd.size()) + ">, slice_sizes = " + hlo::I64Array(Dims(r, 1)) +
                   ", indices_are_sorted = false");
}

Value PointScatter(Builder& b, Value x, Value coords, Value upd, const std::string& how) {
  int r = x.rank();
  int64_t nb = coords.rank() - 1;
  return b.Op1("stablehlo.scatter", {x, coords, Cast(b, upd, x.et())}, x.type,
               "scatter_dimension_numbers = #stablehlo.scatter<inserted_window_dims = " + Seq(0, r) +
                   ", scatter_dims_to_operand_dims = " + Seq(0, r) + ", index_vector_dim = " +
                   std::to_string(nb) + ">, indices_are_sorted = false, unique_indices = false",
               {ScatterCombiner(x.et(), how)});
}

// Coordinates for gather/scatter along `dim`: [*index.shape, rank].
Value DimCoords(Builder& b, Value index, int64_t dim) {
  int r = index.rank();
  index = Cast(b, index, ET::S64);
  Dims cd = index.dims();
  cd.push_back(1);
  std::vector<Value> parts;
  for (int d = 0; d < r; ++d) {
    Value p = d == dim ? index : b.Iota(index.type, d);
    parts.push_back(b.Reshape(p, cd));
  }
  return b.Concat(parts, r);
}

// ---- index_select / index_add ----
std::vector<Value> IndexSelect(LowerCtx& c) {
  Builder& b = c.b;
  Value x = c.t(0);
  const Type& o = c.out();
  if (x.rank() == 0) return {b.Reshape(x, o.dims)};
  int64_t dim = NormDim(c.i64(1), x.rank());
  Value idx = c.t(2);
  int64_t k = idx.type.numel();
  if (k == 0) return {b.Zeros(o)};
  idx = b.Reshape(WrapIndex(b, idx, x.dims()[dim]), {k, 1});
  Dims offs, slice = x.dims();
  slice[dim] = 1;
  for (int d = 0; d < x.rank(); ++d)
    if (d != dim) offs.push_back(d);
  Dims rd = x.dims();
  rd[dim] = k;
  return {b.Op1("stablehlo.gather", {x, idx}, Type(x.et(), rd),
                "dimension_numbers = #stablehlo.gather<offset_dims = " + List(offs) +
                    ", collapsed_slice_dims = [" + std::to_string(dim) + "], start_index_map = [" +
                    std::to_string(dim) + "], index_vector_dim = 1>, slice_sizes = " +
                    hlo::I64Array(slice) + ", indices_are_sorted = false")};
}
TT_LOWERINGS(({"aten::index_select", "aten::index_select.out"}), IndexSelect);

std::vector<Value> IndexAdd(LowerCtx& c) {
  Builder& b = c.b;
  const Type& o = c.out();
  Value x = Cast(b, c.t(0), o.et);
  Value idx = c.t(2);
  Value src = Cast(b, c.t(3), o.et);
  if (c.has(4) && c.arg(4).kind == Arg::Scalar && c.arg(4).hint() != 1.0)
    src = b.Mul(src, Bcast(b, c.t(4), src.dims(), o.et));
  if (x.rank() == 0) {
    return {b.Add(x, b.Reshape(SumDims(b, src, src.rank() ? Dims{0} : Dims{}, false, o.et), {}))};
  }
  int64_t dim = NormDim(c.i64(1), x.rank());
  int64_t k = idx.type.numel();
  if (k == 0) return {x};
  idx = b.Reshape(WrapIndex(b, idx, x.dims()[dim]), {k, 1});
  Dims sd = x.dims();
  sd[dim] = k;
  src = b.Reshape(src, sd);
  Dims win;
  for (int d = 0; d < x.rank(); ++d)
    if (d != dim) win.push_back(d);
  return {b.Op1("stablehlo.scatter", {x, idx, src}, x.type,
                "scatter_dimension_numbers = #stablehlo.scatter<update_window_dims = " + List(win) +
                    ", inserted_window_dims = [" + std::to_string(dim) +
                    "], scatter_dims_to_operand_dims = [" + std::to_string(dim) +
                    "], index_vector_dim = 1>, indices_are_sorted = false, unique_indices = false",
                {ScatterCombiner(x.et(), "add")})};
}
TT_LOWERINGS(({"aten::index_add", "aten::index_add_", "aten::index_add.out"}), IndexAdd);

// ---- gather / scatter ----
std::vector<Value> Gather(LowerCtx& c) {
  Builder& b = c.b;
  Value x = c.t(0), idx = c.t(2);
  const Type& o = c.out();
  if (idx.type.numel() == 0) return {b.Zeros(o)};
  if (x.rank() == 0) return {b.BroadcastTo(x, o.dims)};
  if (idx.rank() == 0) idx = b.Reshape(idx, Dims(x.rank(), 1));
  int64_t dim = NormDim(c.i64(1), x.rank());
  return {b.Reshape(PointGather(b, x, DimCoords(b, idx, dim)), o.dims)};
}
TT_LOWERINGS(({"aten::gather", "aten::gather.out"}), Gather);

std::string ReduceMode(const LowerCtx& c, const std::string& dflt) {
  for (auto& a : c.args)
    if (a.kind == Arg::String) return a.s == "sum" ? "add" : a.s;
  return dflt;
}

template <bool Add>
std::vector<Value> Scatter(LowerCtx& c) {
  Builder& b = c.b;
  const Type& o = c.out();
  Value x = Cast(b, c.t(0), o.et), idx = c.t(2);
  std::string how = Add ? "add" : ReduceMode(c, "replace");
  if (idx.type.numel() == 0) return {x};
  Dims od = x.dims();
  if (x.rank() == 0) x = b.Reshape(x, {1});
  if (idx.rank() == 0) idx = b.Reshape(idx, Dims(x.rank(), 1));
  int64_t dim = NormDim(c.i64(1), x.rank());
  Value upd;
  const Arg& s = c.arg(3);
  if (c.names[3] == "src") {
    Value src = Cast(b, s.v, o.et);
    if (src.rank() == 0) src = b.Reshape(src, Dims(x.rank(), 1));
    upd = b.Slice(src, Dims(idx.rank(), 0), idx.dims(), Dims(idx.rank(), 1));
  } else {
    upd = b.BroadcastTo(Cast(b, c.t(3), o.et), idx.dims());
  }
  Value r = PointScatter(b, x, DimCoords(b, idx, dim), upd, how);
  return {b.Reshape(r, od)};
}
TT_LOWERINGS(({"aten::scatter.src", "aten::scatter_.src", "aten::scatter.src_out", "aten::scatter.value",
               "aten::scatter_.value", "aten::scatter.value_out", "aten::scatter.reduce",
               "aten::scatter_.reduce", "aten::scatter.reduce_out", "aten::scatter.value_reduce",
               "aten::scatter_.value_reduce", "aten::scatter.value_reduce_out"}), Scatter<false>);
TT_LOWERINGS(({"aten::scatter_add", "aten::scatter_add_", "aten::scatter_add.out"}), Scatter<true>);

// torchtitan::deterministic_scatter_add(out, index, src): out.scatter_add(0, index, src), the
// combine step of torchtitan's MoE token dispatchers (a custom op, opaque in compiled graphs;
// XLA's scatter is deterministic).
std::vector<Value> DeterministicScatterAdd(LowerCtx& c) {
  static const std::vector<std::string> names{"self", "dim", "index", "src"};
  Arg dim;
  dim.kind = Arg::Int;
  dim.i = 0;
  LowerCtx c2{c.b, c.op, {c.arg(0), dim, c.arg(1), c.arg(2)}, names, c.outs, {}};
  return Scatter<true>(c2);
}
TT_GRAPH_LOWERINGS(({"torchtitan::deterministic_scatter_add"}), DeterministicScatterAdd);

// ---- advanced indexing ----
struct Adv {
  Value xt;          // self transposed: indexed dims first
  Dims perm;         // xt = transpose(self, perm)
  Value coords;      // [B..., nD] s64
  Dims B, rest;      // broadcast index shape; remaining dim sizes
  int64_t insert;    // position of the B dims in the result (torch rules)
};

std::vector<Value> Indices(const LowerCtx& c, size_t i) {
  const Arg& a = c.arg(i);
  std::vector<Value> out;
  if (a.kind == Arg::TensorList) {
    for (auto& v : a.vs) out.push_back(v);
    return out;
  }
  if (a.kind != Arg::OptTensorList) c.fail("indices must be a list of tensors");
  for (auto& o : a.ovs) out.push_back(o ? *o : Value());
  return out;
}

Adv AdvSetup(LowerCtx& c, Value x, std::vector<Value> idx) {
  Builder& b = c.b;
  int r = x.rank();
  // bool/uint8 masks would need data-dependent shapes
  for (auto& v : idx)
    if (v.valid() && (v.et() == ET::PRED || v.et() == ET::U8))
      c.fail("boolean mask indices are not supported natively");
  while ((int)idx.size() < r) idx.push_back(Value());
  if ((int)idx.size() > r) c.fail("too many indices");
  Adv a;
  Dims D;
  for (int d = 0; d < r; ++d)
    if (idx[d].valid()) D.push_back(d);
  // broadcast shape
  for (auto d : D) {
    const Dims& s = idx[d].dims();
    if (s.size() > a.B.size()) a.B.insert(a.B.begin(), s.size() - a.B.size(), 1);
    for (size_t k = 0; k < s.size(); ++k) {
      int64_t& t = a.B[a.B.size() - s.size() + k];
      if (t == 1) t = s[k];
    }
  }
  a.perm = D;
  for (int d = 0; d < r; ++d)
    if (!idx[d].valid()) {
      a.perm.push_back(d);
      a.rest.push_back(x.dims()[d]);
    }
  a.xt = b.Transpose(x, a.perm);
  Dims cd = a.B;
  cd.push_back(1);
  std::vector<Value> parts;
  for (auto d : D) parts.push_back(b.Reshape(b.BroadcastTo(WrapIndex(b, idx[d], x.dims()[d]), a.B), cd));
  a.coords = b.Concat(parts, (int64_t)a.B.size());
  bool adjacent = D.back() - D.front() + 1 == (int64_t)D.size();
  a.insert = adjacent ? D.front() : 0;
  return a;
}

// [B..., rest...] -> result layout (B moved to a.insert), and back.
Dims MovePerm(const Adv& a) {
  int64_t nb = a.B.size(), nr = a.rest.size();
  Dims p;
  for (int64_t i = 0; i < a.insert; ++i) p.push_back(nb + i);
  for (int64_t i = 0; i < nb; ++i) p.push_back(i);
  for (int64_t i = a.insert; i < nr; ++i) p.push_back(nb + i);
  return p;
}
Dims Inverse(const Dims& p) {
  Dims q(p.size());
  for (size_t i = 0; i < p.size(); ++i) q[p[i]] = i;
  return q;
}

std::vector<Value> Index(LowerCtx& c) {
  Builder& b = c.b;
  Value x = c.t(0);
  const Type& o = c.out();
  if (o.numel() == 0) return {b.Zeros(o)};
  Adv a = AdvSetup(c, x, Indices(c, 1));
  int64_t nd = a.perm.size() - a.rest.size(), nb = a.B.size();
  Dims slice(nd, 1);
  slice.insert(slice.end(), a.rest.begin(), a.rest.end());
  Dims rd = a.B;
  rd.insert(rd.end(), a.rest.begin(), a.rest.end());
  Value g = b.Op1("stablehlo.gather", {a.xt, a.coords}, Type(x.et(), rd),
                  "dimension_numbers = #stablehlo.gather<offset_dims = " + Seq(nb, nb + a.rest.size()) +
                      ", collapsed_slice_dims = " + Seq(0, nd) + ", start_index_map = " + Seq(0, nd) +
                      ", index_vector_dim = " + std::to_string(nb) + ">, slice_sizes = " +
                      hlo::I64Array(slice) + ", indices_are_sorted = false");
  return {b.Reshape(b.Transpose(g, MovePerm(a)), o.dims)};
}
TT_LOWERINGS(({"aten::index.Tensor", "aten::index.Tensor_out", "aten::index.Tensor_hacked_twin"}), Index);

std::vector<Value> IndexPut(LowerCtx& c) {
  Builder& b = c.b;
  const Type& o = c.out();
  Value x = Cast(b, c.t(0), o.et);
  Value vals = Cast(b, c.t(2), o.et);
  bool acc = c.flag(3);
  std::vector<Value> idx = Indices(c, 1);
  // A single boolean mask over all dims with a one-element value: select.
  if (idx.size() == 1 && idx[0].valid() && (idx[0].et() == ET::PRED || idx[0].et() == ET::U8) &&
      idx[0].dims() == x.dims() && vals.type.numel() == 1) {
    Value m = Cast(b, idx[0], ET::PRED);
    Value v = b.BroadcastTo(b.Reshape(vals, {}), x.dims());
    return {b.Select(m, acc ? b.Add(x, v) : v, x)};
  }
  if (x.type.numel() == 0) return {x};
  Adv a = AdvSetup(c, x, idx);
  int64_t nd = a.perm.size() - a.rest.size(), nb = a.B.size();
  Dims mp = MovePerm(a);
  Dims res;  // shape of x[indices]
  Dims rd = a.B;
  rd.insert(rd.end(), a.rest.begin(), a.rest.end());
  for (auto p : mp) res.push_back(rd[p]);
  for (auto d : res)
    if (d == 0) return {x};
  Value u = b.Transpose(b.BroadcastTo(vals, res), Inverse(mp));
  int64_t windows = 1;
  for (auto d : a.B) windows *= d;
  Value coords = a.coords;
  if (nb > 0) AvoidSingleWindow(b, coords, u, windows, acc ? "add" : "replace");
  Value r = b.Op1("stablehlo.scatter", {a.xt, coords, u}, a.xt.type,
                  "scatter_dimension_numbers = #stablehlo.scatter<update_window_dims = " +
                      Seq(nb, nb + a.rest.size()) + ", inserted_window_dims = " + Seq(0, nd) +
                      ", scatter_dims_to_operand_dims = " + Seq(0, nd) + ", index_vector_dim = " +
                      std::to_string(nb) + ">, indices_are_sorted = false, unique_indices = false",
                  {ScatterCombiner(x.et(), acc ? "add" : "replace")});
  return {b.Transpose(r, Inverse(a.perm))};
}
TT_LOWERINGS(({"aten::index_put", "aten::index_put_", "aten::index_put.out", "aten::index_put.hacked_twin",
               "aten::index_put_.hacked_twin", "aten::_index_put_impl_",
               "aten::_index_put_impl_.hacked_twin"}), IndexPut);

// ---- masked_fill ----
std::vector<Value> MaskedFill(LowerCtx& c) {
  Builder& b = c.b;
  const Type& o = c.out();
  Value m = Bcast(b, c.t(1), o.dims, ET::PRED);
  return {b.Select(m, Bcast(b, c.t(2), o.dims, o.et), Bcast(b, c.t(0), o.dims, o.et))};
}
TT_LOWERINGS(({"aten::masked_fill.Scalar", "aten::masked_fill.Scalar_out", "aten::masked_fill.Tensor",
               "aten::masked_fill.Tensor_out", "aten::masked_fill_.Scalar", "aten::masked_fill_.Tensor"}),
             MaskedFill);

}  // namespace
}  // namespace tt::ops
