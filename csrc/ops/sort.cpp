// Sort / select: sort (stable, descending; values + indices), topk, kthvalue,
// median / nanmedian, mode, cummax / cummin, searchsorted / bucketize, histc.
// Sorting is one stablehlo.sort over (keys, iota) with is_stable = true and
// a comparator that orders NaN as the largest value (as PyTorch does).
#include <algorithm>
#include <cmath>

#include "registry.h"
#include "sort_util.h"
#include "nn_util.h"

namespace tt::ops {

namespace {

Value IsNan(Builder& b, Value v) { return b.Compare(v, v, "NE"); }
Value And(Builder& b, Value x, Value y) { return b.Binary("and", x, y); }
Value Or(Builder& b, Value x, Value y) { return b.Binary("or", x, y); }
Value Not(Builder& b, Value x) { return b.Unary("not", x); }

std::string PadAttr(int r, int d, int64_t lo, int64_t hi) {
  std::string pad = "dense<[";
  for (int i = 0; i < r; ++i) {
    if (i) pad += ", ";
    pad += i == d ? "[" + std::to_string(lo) + ", " + std::to_string(hi) + "]" : "[0, 0]";
  }
  return pad + "]> : tensor<" + std::to_string(r) + "x2xi64>";
}

}  // namespace

// "a before b" in the requested order; NaN is the largest value.
Value SortBefore(Builder& b, Value a, Value c, bool descending) {
  if (!IsFloat(a.et())) return b.Compare(a, c, descending ? "GT" : "LT");
  Value na = IsNan(b, a), nc = IsNan(b, c);
  if (!descending) return Or(b, b.Compare(a, c, "LT"), And(b, Not(b, na), nc));
  return Or(b, b.Compare(a, c, "GT"), And(b, na, Not(b, nc)));
}

SortResult SortAlong(Builder& b, Value x, int64_t dim, bool descending) {
  Value key = x;
  if (key.et() == ET::PRED) key = b.Convert(key, ET::U8);
  if (hlo::IsComplex(key.et())) throw LowerError("sort: complex tensors are not supported");
  Value idx = b.Iota(x.type.with_et(ET::S64), dim);
  hlo::Region reg;
  Type kt(key.et(), {}), it(ET::S64, {});
  reg.arg_types = {kt, kt, it, it};
  reg.body = [descending](Builder& bb, const std::vector<Value>& a) {
    return std::vector<Value>{SortBefore(bb, a[0], a[1], descending)};
  };
  auto r = b.Op("stablehlo.sort", {key, idx}, {key.type, idx.type},
                "dimension = " + std::to_string(dim) + " : i64, is_stable = true", {reg});
  SortResult s;
  s.values = key.et() == x.et() ? r[0] : b.Convert(r[0], x.et());
  s.indices = r[1];
  return s;
}

// v[..., pos[...], ...] along dim; pos has v's shape with dim of size k.
Value TakeAlong(Builder& b, Value v, Value pos, int64_t dim) {
  int r = v.rank();
  pos = Cast(b, pos, ET::S64);
  Dims cd = pos.dims();
  cd.push_back(1);
  std::vector<Value> parts;
  for (int d = 0; d < r; ++d) {
    Value p = d == dim ? pos : b.Iota(pos.type, d);
    parts.push_back(b.Reshape(p, cd));
  }
  Value coords = b.Concat(parts, r);
  std::string seq = "[";
  for (int i = 0; i < r; ++i) seq += (i ? ", " : "") + std::to_string(i);
  seq += "]";
  return b.Op1("stablehlo.gather", {v, coords}, Type(v.et(), pos.dims()),
               "dimension_numbers = #stablehlo.gather<collapsed_slice_dims = " + seq +
                   ", start_index_map = " + seq + ", index_vector_dim = " + std::to_string(r) +
                   ">, slice_sizes = " + hlo::I64Array(Dims(r, 1)) + ", indices_are_sorted = false");
}

int ArgPos(const LowerCtx& c, const char* name) {
  for (size_t i = 0; i < c.names.size(); ++i)
    if (c.names[i] == name) return (int)i;
  return -1;
}

namespace {

int64_t DimArg(const LowerCtx& c, int rank, int64_t dflt = -1) {
  int p = ArgPos(c, "dim");
  int64_t d = p >= 0 && c.has(p) ? c.i64(p) : dflt;
  return rank == 0 ? 0 : NormDim(d, rank);
}
bool FlagArg(const LowerCtx& c, const char* name, bool dflt = false) {
  int p = ArgPos(c, name);
  return p >= 0 ? c.flag(p, dflt) : dflt;
}

// ---- sort ----
std::vector<Value> Sort(LowerCtx& c) {
  Builder& b = c.b;
  Value x = c.t(0);
  if (x.rank() == 0) return {x, b.Zeros(Type(ET::S64, {}))};
  int64_t dim = DimArg(c, x.rank());
  if (x.type.numel() == 0) return {x, b.Zeros(x.type.with_et(ET::S64))};
  SortResult s = SortAlong(b, x, dim, FlagArg(c, "descending"));
  return {s.values, s.indices};
}
TT_LOWERINGS(({"aten::sort", "aten::sort.values", "aten::sort.stable", "aten::sort.values_stable"}), Sort);

// ---- topk ----
std::vector<Value> TopK(LowerCtx& c) {
  Builder& b = c.b;
  Value x = c.t(0);
  const Type& o = c.out();
  if (o.numel() == 0) return {b.Zeros(o), b.Zeros(c.out(1))};
  if (x.rank() == 0) return {x, b.Zeros(Type(ET::S64, {}))};
  int64_t dim = DimArg(c, x.rank());
  int64_t k = c.i64(1);
  SortResult s = SortAlong(b, x, dim, FlagArg(c, "largest", true));
  return {b.SliceDim(s.values, dim, 0, k), b.SliceDim(s.indices, dim, 0, k)};
}
TT_LOWERINGS(({"aten::topk", "aten::topk.values"}), TopK);

// Picks element `pos` (a per-row s64 position, keepdim shape) of the sorted rows.
std::vector<Value> PickSorted(LowerCtx& c, const SortResult& s, Value pos, int64_t dim) {
  Builder& b = c.b;
  Value v = TakeAlong(b, s.values, pos, dim), i = TakeAlong(b, s.indices, pos, dim);
  return {b.Reshape(v, c.out(0).dims), b.Reshape(i, c.out(1).dims)};
}

Value KeepdimPos(Builder& b, Value x, int64_t dim, Value pos /*0-d or keepdim-shaped*/) {
  Dims kd = x.dims();
  kd[dim] = 1;
  return b.BroadcastTo(pos, kd);
}

std::vector<Value> KthValue(LowerCtx& c) {
  Builder& b = c.b;
  Value x = c.t(0);
  if (x.rank() == 0) return {x, b.Zeros(Type(ET::S64, {}))};
  if (x.type.numel() == 0) return {b.Zeros(c.out(0)), b.Zeros(c.out(1))};
  int64_t dim = DimArg(c, x.rank());
  int64_t k = c.i64(1);
  SortResult s = SortAlong(b, x, dim, false);
  return PickSorted(c, s, KeepdimPos(b, x, dim, b.ScalarConst(ET::S64, (double)(k - 1))), dim);
}
TT_LOWERINGS(({"aten::kthvalue", "aten::kthvalue.values"}), KthValue);

// Median (lower of the two middles). NaN: median propagates it (the first
// NaN in sorted order, i.e. the first by position); nanmedian ignores NaNs.
template <bool IgnoreNan>
std::vector<Value> Median(LowerCtx& c) {
  Builder& b = c.b;
  Value x = c.t(0);
  bool all = c.out(0).rank() == 0 && c.outs.size() == 1;
  if (all) x = b.Reshape(x, {x.type.numel()});
  if (x.rank() == 0) return {x, b.Zeros(Type(ET::S64, {}))};
  if (x.type.numel() == 0) {
    std::vector<Value> r{b.Splat(c.out(0), NAN)};
    if (!all) r.push_back(b.Zeros(c.out(1)));
    return r;
  }
  int64_t dim = all ? 0 : DimArg(c, x.rank());
  int64_t n = x.dims()[dim];
  SortResult s = SortAlong(b, x, dim, false);
  Dims kd = x.dims();
  kd[dim] = 1;
  Value pos;
  if (IsFloat(x.et())) {
    Value valid = SumDims(b, Not(b, IsNan(b, x)), {dim}, true, ET::S64);  // non-NaN count
    if (IgnoreNan) {
      Value m = b.Sub(valid, b.Splat(valid.type, 1));
      m = b.Max(m, b.Zeros(valid.type));
      pos = b.Div(m, b.Splat(valid.type, 2));
    } else {
      Value has_nan = b.Compare(valid, b.Splat(valid.type, (double)n), "LT");
      pos = b.Select(has_nan, valid, b.Splat(valid.type, (double)((n - 1) / 2)));
    }
  } else {
    pos = b.Splat(Type(ET::S64, kd), (double)((n - 1) / 2));
  }
  if (all) return {b.Reshape(TakeAlong(b, s.values, pos, dim), {})};
  return PickSorted(c, s, pos, dim);
}
TT_LOWERINGS(({"aten::median", "aten::median.dim", "aten::median.dim_values", "aten::median.out"}), Median<false>);
TT_LOWERINGS(({"aten::nanmedian", "aten::nanmedian.dim", "aten::nanmedian.dim_values", "aten::nanmedian.out"}),
             Median<true>);

// mode: the most frequent value (the smallest among equally frequent ones)
// and the last index where it occurs, as on CPU. O(n^2) counts along dim.
std::vector<Value> Mode(LowerCtx& c) {
  Builder& b = c.b;
  Value x = c.t(0);
  if (x.rank() == 0) return {x, b.Zeros(Type(ET::S64, {}))};
  if (x.type.numel() == 0) return {b.Zeros(c.out(0)), b.Zeros(c.out(1))};
  int64_t dim = DimArg(c, x.rank());
  int r = x.rank();
  // move dim last: [..., n]
  Dims perm;
  for (int d = 0; d < r; ++d)
    if (d != dim) perm.push_back(d);
  perm.push_back(dim);
  Value xt = b.Transpose(x, perm);
  Dims bd = xt.dims();
  int64_t n = bd.back();
  Dims pd = bd;
  pd.push_back(n);  // [..., n(i), n(j)]
  Dims ai, aj;
  for (int d = 0; d < r - 1; ++d) ai.push_back(d), aj.push_back(d);
  ai.push_back(r - 1);
  aj.push_back(r);
  Value xi = b.Broadcast(xt, pd, ai), xj = b.Broadcast(xt, pd, aj);
  Value eq = b.Compare(xi, xj, "EQ");
  if (IsFloat(x.et())) eq = Or(b, eq, And(b, IsNan(b, xi), IsNan(b, xj)));
  Value cnt = SumDims(b, eq, {(int64_t)r}, false, ET::S64);  // [..., n]
  // best: max count, then smallest value, then largest index
  Value idx = b.Iota(cnt.type, r - 1);
  hlo::Region reg;
  Type ct(ET::S64, {}), vt(xt.et() == ET::PRED ? ET::U8 : xt.et(), {});
  Value key = xt.et() == ET::PRED ? b.Convert(xt, ET::U8) : xt;
  reg.arg_types = {ct, vt, ct, ct, vt, ct};
  reg.body = [](Builder& bb, const std::vector<Value>& a) {
    // a: (cnt0, val0, idx0, cnt1, val1, idx1); take 1 if better
    Value gtc = bb.Compare(a[3], a[0], "GT"), eqc = bb.Compare(a[3], a[0], "EQ");
    Value ltv = SortBefore(bb, a[4], a[1], false);
    Value eqv = Not(bb, Or(bb, ltv, SortBefore(bb, a[1], a[4], false)));
    Value gti = bb.Compare(a[5], a[2], "GT");
    Value take = Or(bb, gtc, And(bb, eqc, Or(bb, ltv, And(bb, eqv, gti))));
    return std::vector<Value>{bb.Select(take, a[3], a[0]), bb.Select(take, a[4], a[1]),
                              bb.Select(take, a[5], a[2])};
  };
  Value init_v = IsFloat(vt.et) ? b.ScalarConst(vt.et, INFINITY) : b.ScalarConst(vt.et, 0);
  auto res = b.Op("stablehlo.reduce",
                  {cnt, key, idx, b.ScalarConst(ET::S64, -1), init_v, b.ScalarConst(ET::S64, -1)},
                  {Type(ET::S64, Dims(bd.begin(), bd.end() - 1)), Type(vt.et, Dims(bd.begin(), bd.end() - 1)),
                   Type(ET::S64, Dims(bd.begin(), bd.end() - 1))},
                  "dimensions = " + hlo::I64Array({(int64_t)r - 1}), {reg});
  Value v = Cast(b, res[1], x.et());
  return {b.Reshape(v, c.out(0).dims), b.Reshape(res[2], c.out(1).dims)};
}
TT_LOWERINGS(({"aten::mode", "aten::mode.values"}), Mode);

// ---- cummax / cummin: reduce_window over (value, index) pairs ----
// Prefix max (min) with NaN above everything; ties go to the later index
// (CPU's `>=` update). Index -1 marks the padding, whose value is ignored.
template <bool Max>
std::vector<Value> CumMaxMin(LowerCtx& c) {
  Builder& b = c.b;
  Value x = c.t(0);
  if (x.rank() == 0) return {x, b.Zeros(Type(ET::S64, {}))};
  int64_t dim = NormDim(c.i64(1), x.rank());
  int64_t n = x.dims()[dim];
  if (x.type.numel() == 0) return {x, b.Zeros(x.type.with_et(ET::S64))};
  Value key = x.et() == ET::PRED ? b.Convert(x, ET::U8) : x;
  Value idx = b.Iota(key.type.with_et(ET::S64), dim);
  if (n == 1) return {x, idx};
  int r = x.rank();
  Dims win(r, 1), str(r, 1);
  win[dim] = n;
  hlo::Region reg;
  Type vt(key.et(), {}), it(ET::S64, {});
  reg.arg_types = {vt, it, vt, it};
  reg.body = [](Builder& bb, const std::vector<Value>& a) {
    Value better;
    if (Max) {
      better = SortBefore(bb, a[0], a[2], false);
    } else {
      Value lt = bb.Compare(a[2], a[0], "LT");
      if (IsFloat(a[0].et())) {
        Value n0 = IsNan(bb, a[0]), n2 = IsNan(bb, a[2]);
        better = And(bb, Not(bb, n0), Or(bb, n2, lt));
      } else {
        better = lt;
      }
    }
    Value same = Not(bb, Or(bb, SortBefore(bb, a[0], a[2], false), SortBefore(bb, a[2], a[0], false)));
    Value m1 = bb.Splat(Type(ET::S64, {}), -1);
    Value e0 = bb.Compare(a[1], m1, "EQ"), e2 = bb.Compare(a[3], m1, "EQ");
    Value take = Or(bb, e0, And(bb, Not(bb, e2), Or(bb, better, And(bb, same, bb.Compare(a[3], a[1], "GT")))));
    return std::vector<Value>{bb.Select(take, a[2], a[0]), bb.Select(take, a[3], a[1])};
  };
  auto res = b.Op("stablehlo.reduce_window", {key, idx, b.ScalarConst(key.et(), 0), b.ScalarConst(ET::S64, -1)},
                  {key.type, idx.type},
                  "window_dimensions = " + hlo::I64Array(win) + ", window_strides = " +
                      hlo::I64Array(str) + ", padding = " + PadAttr(r, (int)dim, n - 1, 0),
                  {reg});
  return {key.et() == x.et() ? res[0] : b.Convert(res[0], x.et()), res[1]};
}
TT_LOWERINGS(({"aten::cummax", "aten::cummax.out"}), CumMaxMin<true>);
TT_LOWERINGS(({"aten::cummin", "aten::cummin.out"}), CumMaxMin<false>);

// ---- searchsorted / bucketize ----
// Counts, per value, the sequence elements before it: lower bound counts
// !(s >= v), upper bound !(s > v) (CPU's binary-search predicates).
Value SearchCount(Builder& b, Value seq, Value v, bool right, ET out_et) {
  // seq [..., N], v [..., M] (same leading dims, or seq 1-D)
  ET ct = PromoteET(seq.et(), v.et());
  seq = Cast(b, seq, ct);
  v = Cast(b, v, ct);
  int64_t N = seq.dims().back();
  Dims vd = v.dims();
  Dims pd = vd;
  pd.push_back(N);
  Dims av, as;
  for (int d = 0; d < v.rank(); ++d) av.push_back(d);
  Value vb = b.Broadcast(v, pd, av);
  if (seq.rank() == 1) {
    as = {(int64_t)pd.size() - 1};
  } else {
    for (int d = 0; d < seq.rank() - 1; ++d) as.push_back(d);
    as.push_back((int64_t)pd.size() - 1);
  }
  Value sb = b.Broadcast(seq, pd, as);
  Value cmp = Not(b, b.Compare(sb, vb, right ? "GT" : "GE"));
  return SumDims(b, cmp, {(int64_t)pd.size() - 1}, false, out_et);
}

std::vector<Value> SearchSorted(LowerCtx& c) {
  Builder& b = c.b;
  const Type& o = c.out();
  Value seq = c.t(0), v = c.t(1);
  bool right = FlagArg(c, "right");
  int ps = ArgPos(c, "side");
  if (ps >= 0 && c.has(ps) && c.arg(ps).s == "right") right = true;
  // Empty outputs or sequences first: the sorter gather cannot index an empty dim.
  if (o.numel() == 0 || seq.dims().back() == 0) return {b.Zeros(o)};
  int pso = ArgPos(c, "sorter");
  if (pso >= 0 && c.has(pso)) seq = TakeAlong(b, seq, c.t(pso), seq.rank() - 1);
  Value vv = v.rank() == 0 ? b.Reshape(v, {1}) : v;
  Value r = SearchCount(b, seq, vv, right, o.et);
  return {b.Reshape(r, o.dims)};
}
TT_LOWERINGS(({"aten::searchsorted.Tensor", "aten::searchsorted.Tensor_out", "aten::searchsorted.Scalar",
               "aten::searchsorted.Scalar_out"}), SearchSorted);

std::vector<Value> Bucketize(LowerCtx& c) {
  Builder& b = c.b;
  const Type& o = c.out();
  Value v = c.t(0), bounds = c.t(1);
  if (o.numel() == 0 || bounds.type.numel() == 0) return {b.Zeros(o)};
  Value vv = b.Reshape(v, {v.type.numel()});
  Value r = SearchCount(b, bounds, vv, FlagArg(c, "right"), o.et);
  return {b.Reshape(r, o.dims)};
}
TT_LOWERINGS(({"aten::bucketize.Tensor", "aten::bucketize.Tensor_out", "aten::bucketize.Scalar",
               "aten::bucketize.Scalar_out"}), Bucketize);

// ---- histc ----
// Float inputs follow CPU's kernel: the range [min, max] (the data's extrema
// when min == max, widened by 1 each way when still equal, in double), then
// bin = int64((x - lo) * bins / (hi - lo)) in the input dtype, the last bin
// closed. Integer inputs (CPU has no kernel) follow CUDA's: the same formula
// in int64. Values outside the range (and NaN) are not counted. All of it is
// computed in the program, so min/max stay program arguments. A non-finite
// float range (CPU raises) gives NaN counts.
std::vector<Value> Histc(LowerCtx& c) {
  Builder& b = c.b;
  const Type& o = c.out();
  const ET et = o.et;
  if (IsBool(et) || IsComplex(et)) c.fail(std::string("not implemented for dtype ") + hlo::ETName(et));
  const bool fp = IsFloat(et);
  const int64_t bins = o.dims[0];
  Value x = b.Reshape(c.t(0), {c.t(0).type.numel()});
  const int64_t n = x.dims()[0];
  // The range: f64 for floats (CPU widens in double), else the input type
  // (CUDA converts min/max to it), computed in int64.
  const ET rt = fp ? ET::F64 : ET::S64;
  Value lo = Cast(b, c.scalar(2, fp ? ET::F64 : et), rt), hi = Cast(b, c.scalar(3, fp ? ET::F64 : et), rt);
  if (n > 0) {
    Value same = b.Compare(lo, hi, "EQ");
    Value dmin = Cast(b, b.Reduce(x, MinMaxInit(b, et, false), {0}, "minimum"), rt);
    Value dmax = Cast(b, b.Reduce(x, MinMaxInit(b, et, true), {0}, "maximum"), rt);
    lo = b.Select(same, dmin, lo);
    hi = b.Select(same, dmax, hi);
  }
  Value widen = b.Compare(lo, hi, "EQ");
  lo = b.Select(widen, b.Sub(lo, b.ScalarConst(rt, 1)), lo);
  hi = b.Select(widen, b.Add(hi, b.ScalarConst(rt, 1)), hi);
  // Per element: the bin, and whether it is counted.
  const ET ct = fp ? et : ET::S64;
  Value xl = Cast(b, x, ct);
  Value l = b.BroadcastTo(Cast(b, lo, ct), {n}), h = b.BroadcastTo(Cast(b, hi, ct), {n});
  Value in = b.Binary("and", b.Compare(xl, l, "GE"), b.Compare(xl, h, "LE"));
  Value pos = b.Div(b.Mul(b.Sub(xl, l), b.Splat(Type(ct, {n}), (double)bins)), b.Sub(h, l));
  pos = Cast(b, pos, ET::S64);
  pos = b.Min(pos, b.Splat(Type(ET::S64, {n}), (double)(bins - 1)));
  // One-hot counts: [n, bins] compare, summed over n.
  Value hit = b.Compare(b.Broadcast(pos, {n, bins}, {0}), b.Iota(Type(ET::S64, {n, bins}), 1), "EQ");
  hit = b.Binary("and", hit, b.Broadcast(in, {n, bins}, {0}));
  Value counts = Cast(b, SumDims(b, hit, {0}, false, ET::S64), et);
  if (fp) {
    auto finite = [&](Value v) { return b.Op1("stablehlo.is_finite", {v}, Type(ET::PRED, {})); };
    Value ok = b.BroadcastTo(b.Binary("and", finite(lo), finite(hi)), {bins});
    counts = b.Select(ok, counts, b.Splat(o, NAN));
  }
  return {counts};
}
TT_LOWERINGS(({"aten::histc", "aten::histc.out"}), Histc);

}  // namespace

Value PrefixSum(Builder& b, Value x, int64_t dim) {
  int r = x.rank();
  int64_t n = x.dims()[dim];
  if (n <= 1) return x;
  Dims win(r, 1), str(r, 1);
  win[dim] = n;
  hlo::Region reg;
  reg.arg_types = {Type(x.et(), {}), Type(x.et(), {})};
  reg.body = [](Builder& bb, const std::vector<Value>& a) { return std::vector<Value>{bb.Add(a[0], a[1])}; };
  return b.Op1("stablehlo.reduce_window", {x, b.ScalarConst(x.et(), 0)}, x.type,
               "window_dimensions = " + hlo::I64Array(win) + ", window_strides = " + hlo::I64Array(str) +
                   ", padding = " + PadAttr(r, (int)dim, n - 1, 0),
               {reg});
}

}  // namespace tt::ops
