// Reductions: sum, mean, amax/amin, max/min(.dim), argmax/argmin, prod,
// var/std, all/any, logsumexp, cumsum/cumprod, norm / linalg_vector_norm.
// Output shapes and dtypes come from the meta kernels; the lowering reduces
// over the normalized dims and reshapes to the meta shape (keepdim).
#include <cmath>
#include <limits>

#include "registry.h"
#include "nn_util.h"

namespace tt::ops {

namespace {

// Dims reduced by argument i (None or [] = all dims).
Dims RedDims(const LowerCtx& c, int i, int rank) {
  if (i < 0 || !c.has(i)) {
    Dims all;
    for (int d = 0; d < rank; ++d) all.push_back(d);
    return all;
  }
  std::vector<int64_t> ds = c.ints(i);
  if (ds.empty() && c.arg(i).kind == Arg::IntList) {
    Dims all;
    for (int d = 0; d < rank; ++d) all.push_back(d);
    return all;
  }
  return NormDims(ds, rank);
}

Dims DimsOf(const LowerCtx& c, int rank) { return RedDims(c, ArgIndex(c, "dim"), rank); }

int64_t Count(const Value& v, const Dims& dims) {
  int64_t n = 1;
  for (auto d : dims) n *= v.dims()[d];
  return n;
}

Value IsNan(Builder& b, Value x) { return b.Compare(x, x, "NE"); }

// NaN-propagating max/min reduction.
Value ReduceMinMax(Builder& b, Value x, const Dims& dims, bool is_max) {
  if (dims.empty()) return x;
  ET et = x.et();
  Value init = MinMaxInit(b, et, is_max);
  if (et == ET::PRED) return b.Reduce(x, init, dims, is_max ? "or" : "and");
  if (!hlo::IsFloat(et)) return b.Reduce(x, init, dims, is_max ? "maximum" : "minimum");
  return b.ReduceMulti({x}, {init}, dims, [is_max](Builder& b, const std::vector<Value>& a) {
    Value r = is_max ? b.Max(a[0], a[1]) : b.Min(a[0], a[1]);
    r = b.Select(IsNan(b, a[0]), a[0], r);
    r = b.Select(IsNan(b, a[1]), a[1], r);
    return std::vector<Value>{r};
  })[0];
}

// (values, int64 indices) of max/min over one dim; NaN wins; first index on ties.
std::pair<Value, Value> ArgReduce(Builder& b, Value x, int64_t dim, bool is_max) {
  ET et = x.et();
  Value idx = b.Iota(x.type.with_et(ET::S64), dim);
  Value init = MinMaxInit(b, et, is_max);
  Value iinit = b.ScalarConst(ET::S64, 0);
  bool fl = hlo::IsFloat(et);
  auto r = b.ReduceMulti({x, idx}, {init, iinit}, {dim},
                         [is_max, fl](Builder& b, const std::vector<Value>& a) {
                           Value av = a[0], ai = a[1], bv = a[2], bi = a[3];
                           Value better = b.Compare(av, bv, is_max ? "GT" : "LT");
                           Value eq = b.Compare(av, bv, "EQ");
                           if (fl) {
                             Value an = IsNan(b, av), bn = IsNan(b, bv);
                             better = b.Binary("or", better,
                                               b.Binary("and", an, b.Unary("not", bn)));
                             eq = b.Binary("or", eq, b.Binary("and", an, bn));
                           }
                           Value pick = b.Binary(
                               "or", better, b.Binary("and", eq, b.Compare(ai, bi, "LT")));
                           return std::vector<Value>{b.Select(pick, av, bv), b.Select(pick, ai, bi)};
                         });
  return {r[0], r[1]};
}

ET AccType(ET out) { return ComputeType(out); }

// ---- sum / mean / prod ----
// One lowering for the plain reductions over `dim` (or all dims): the body
// reduces x over dims, accumulating in acc (out: the output dtype).
using ReduceBody = Value (*)(Builder& b, Value x, const Dims& dims, ET acc, ET out);
template <ReduceBody F>
std::vector<Value> Reduction(LowerCtx& c) {
  const Type& o = c.out();
  Value x = c.t(0);
  Dims dims = DimsOf(c, x.rank());
  return {c.b.Reshape(Cast(c.b, F(c.b, x, dims, AccType(o.et), o.et), o.et), o.dims)};
}

Value SumBody(Builder& b, Value x, const Dims& dims, ET acc, ET out) {
  if (out != ET::PRED) return SumDims(b, x, dims, false, acc);
  Value r = Cast(b, x, ET::PRED);
  return dims.empty() ? r : b.Reduce(r, b.ScalarConst(ET::PRED, 0), dims, "or");
}
Value MeanBody(Builder& b, Value x, const Dims& dims, ET acc, ET) {
  Value r = SumDims(b, x, dims, false, acc);
  return b.Div(r, b.Splat(r.type, (double)Count(x, dims)));
}
Value ProdBody(Builder& b, Value x, const Dims& dims, ET acc, ET) {
  Value r = Cast(b, x, acc);
  if (dims.empty()) return r;
  return acc == ET::PRED ? b.Reduce(r, b.ScalarConst(ET::PRED, 1), dims, "and")
                         : b.Reduce(r, b.ScalarConst(acc, 1), dims, "multiply");
}
template <bool IsMax>
Value MinMaxBody(Builder& b, Value x, const Dims& dims, ET, ET) {
  return ReduceMinMax(b, x, dims, IsMax);
}
TT_LOWERINGS(({"aten::sum", "aten::sum.out", "aten::sum.dim_IntList", "aten::sum.IntList_out"}),
             Reduction<SumBody>);
TT_LOWERINGS(({"aten::mean", "aten::mean.dim", "aten::mean.out", "aten::mean.dtype_out"}), Reduction<MeanBody>);
TT_LOWERINGS(({"aten::prod", "aten::prod.out", "aten::prod.dim_int", "aten::prod.int_out"}), Reduction<ProdBody>);
// ---- amax / amin / max / min ----
TT_LOWERINGS(({"aten::amax", "aten::amax.out", "aten::max", "aten::max.unary_out"}), Reduction<MinMaxBody<true>>);
TT_LOWERINGS(({"aten::amin", "aten::amin.out", "aten::min", "aten::min.unary_out"}), Reduction<MinMaxBody<false>>);

template <bool IsMax>
std::vector<Value> MinMaxDim(LowerCtx& c) {
  Value x = c.t(0);
  if (x.rank() == 0) return {x, c.b.Zeros(c.out(1))};
  int64_t d = NormDim(c.i64(1), x.rank());
  auto [v, i] = ArgReduce(c.b, x, d, IsMax);
  return {c.b.Reshape(v, c.out(0).dims), c.b.Reshape(i, c.out(1).dims)};
}
TT_LOWERINGS(({"aten::max.dim", "aten::max.dim_max"}), MinMaxDim<true>);
TT_LOWERINGS(({"aten::min.dim", "aten::min.dim_min"}), MinMaxDim<false>);

template <bool IsMax>
std::vector<Value> ArgMinMax(LowerCtx& c) {
  Value x = c.t(0);
  const Type& o = c.out();
  if (x.rank() == 0) return {c.b.Zeros(o)};
  int64_t d;
  if (!c.has(1)) {
    x = c.b.Reshape(x, {x.type.numel()});
    d = 0;
  } else {
    d = NormDim(c.i64(1), x.rank());
  }
  return {c.b.Reshape(ArgReduce(c.b, x, d, IsMax).second, o.dims)};
}
TT_LOWERINGS(({"aten::argmax", "aten::argmax.out"}), ArgMinMax<true>);
TT_LOWERINGS(({"aten::argmin", "aten::argmin.out"}), ArgMinMax<false>);

// ---- var / std (and var_mean / std_mean) ----
// Returns (var or std, mean) in the compute type, reduced (not yet reshaped).
std::pair<Value, Value> VarMean(LowerCtx& c, bool std_, ET ct) {
  Value x = Cast(c.b, c.t(0), ct);
  Dims dims = DimsOf(c, x.rank());
  double corr = 1.0;
  int ci = ArgIndex(c, "correction"), ui = ArgIndex(c, "unbiased");
  if (ci >= 0 && c.has(ci)) corr = c.f64(ci);
  else if (ui >= 0 && c.has(ui)) corr = c.flag(ui) ? 1.0 : 0.0;
  int64_t n = Count(x, dims);
  Value mean = SumDims(c.b, x, dims, true, ct);
  mean = c.b.Div(mean, c.b.Splat(mean.type, (double)n));
  Value d = c.b.Sub(x, c.b.BroadcastTo(mean, x.dims()));
  Value s = SumDims(c.b, c.b.Mul(d, d), dims, false, ct);
  double denom = std::max(0.0, (double)n - corr);
  Value r = c.b.Div(s, c.b.Splat(s.type, denom));
  if (std_) r = c.b.Unary("sqrt", r);
  return {r, mean};
}

template <bool Std>
std::vector<Value> VarStd(LowerCtx& c) {
  const Type& o = c.out();
  Value r = VarMean(c, Std, ComputeType(o.et)).first;
  return {c.b.Reshape(Cast(c.b, r, o.et), o.dims)};
}
TT_LOWERINGS(({"aten::var", "aten::var.dim", "aten::var.correction", "aten::var.correction_out",
               "aten::var.out"}), VarStd<false>);
TT_LOWERINGS(({"aten::std", "aten::std.dim", "aten::std.correction", "aten::std.correction_out",
               "aten::std.out"}), VarStd<true>);

template <bool Std>
std::vector<Value> VarStdMean(LowerCtx& c) {
  const Type& o = c.out(0);
  auto [r, m] = VarMean(c, Std, ComputeType(o.et));
  return {c.b.Reshape(Cast(c.b, r, o.et), o.dims), c.b.Reshape(Cast(c.b, m, c.out(1).et), c.out(1).dims)};
}
TT_LOWERINGS(({"aten::var_mean", "aten::var_mean.dim", "aten::var_mean.correction",
               "aten::var_mean.correction_out"}), VarStdMean<false>);
TT_LOWERINGS(({"aten::std_mean", "aten::std_mean.dim", "aten::std_mean.correction",
               "aten::std_mean.correction_out"}), VarStdMean<true>);

// ---- aminmax / nansum / count_nonzero ----
// An optional single `dim` (int?): None = all dims.
Dims OptIntDim(const LowerCtx& c, int rank) {
  int di = ArgIndex(c, "dim");
  if (di < 0 || !c.has(di)) return RedDims(c, -1, rank);
  const Arg& a = c.arg(di);
  int64_t d = a.kind == Arg::Scalar ? (int64_t)a.hint()
              : a.kind == Arg::IntList && !a.ints.empty() ? a.ints[0] : c.i64(di);
  if (rank == 0) {
    if (d != 0 && d != -1) c.fail("dim out of range");
    return {};
  }
  return {NormDim(d, rank)};
}
std::vector<Value> AMinMaxPair(LowerCtx& c) {
  Value x = c.t(0);
  Dims dims = OptIntDim(c, x.rank());
  return {c.b.Reshape(ReduceMinMax(c.b, x, dims, false), c.out(0).dims),
          c.b.Reshape(ReduceMinMax(c.b, x, dims, true), c.out(1).dims)};
}
TT_LOWERINGS(({"aten::aminmax", "aten::aminmax.out"}), AMinMaxPair);

std::vector<Value> NanSum(LowerCtx& c) {
  const Type& o = c.out();
  Value x = c.t(0);
  if (hlo::IsFloat(x.et())) x = c.b.Select(IsNan(c.b, x), c.b.Zeros(x.type), x);
  Dims dims = DimsOf(c, x.rank());
  Value r = SumDims(c.b, x, dims, false, AccType(o.et));
  return {c.b.Reshape(Cast(c.b, r, o.et), o.dims)};
}
TT_LOWERINGS(({"aten::nansum", "aten::nansum.out"}), NanSum);

std::vector<Value> CountNonzero(LowerCtx& c) {
  const Type& o = c.out();
  Value x = c.t(0);
  Value nz = Cast(c.b, c.b.Compare(x, c.b.Zeros(x.type), "NE"), ET::S64);
  int di = ArgIndex(c, "dim");
  Dims dims = di >= 0 && c.has(di) && c.arg(di).kind != Arg::IntList ? OptIntDim(c, x.rank()) : DimsOf(c, x.rank());
  Value r = dims.empty() ? nz : SumDims(c.b, nz, dims, false, ET::S64);
  return {c.b.Reshape(r, o.dims)};
}
TT_LOWERINGS(({"aten::count_nonzero.dim_IntList", "aten::count_nonzero.dim_IntList_out",
               "aten::count_nonzero", "aten::count_nonzero.out"}), CountNonzero);

// ---- all / any ----
template <bool All>
std::vector<Value> AllAny(LowerCtx& c) {
  Value x = Cast(c.b, c.t(0), ET::PRED);
  Dims dims = DimsOf(c, x.rank());
  Value r = dims.empty() ? x
                         : c.b.Reduce(x, c.b.ScalarConst(ET::PRED, All ? 1 : 0), dims, All ? "and" : "or");
  return {c.b.Reshape(r, c.out().dims)};
}
TT_LOWERINGS(({"aten::all", "aten::all.dim", "aten::all.dims", "aten::all.out", "aten::all.dims_out",
               "aten::all.all_out"}), AllAny<true>);
TT_LOWERINGS(({"aten::any", "aten::any.dim", "aten::any.dims", "aten::any.out", "aten::any.dims_out",
               "aten::any.all_out"}), AllAny<false>);

// ---- isin: any(elements[..., None] == flat(test_elements)) ----
// Compared in the promoted dtype (as torch's eq); an empty test set gives
// all False (all True with invert). O(numel * test numel), like CUDA's
// brute-force path, which torch also takes for small test sets.
std::vector<Value> IsIn(LowerCtx& c) {
  ET ct = CommonType(c, {0, 1});
  const Type& o = c.out();
  auto as_flat = [&](size_t i) {
    Value v = c.arg(i).kind == Arg::Tensor ? c.t(i) : c.scalar(i, ct);
    v = Cast(c.b, v, ct);
    return c.b.Reshape(v, {v.type.numel()});
  };
  Value e = as_flat(0), t = as_flat(1);
  int64_t ne = e.dims()[0], nt = t.dims()[0];
  bool invert = c.flag(3);
  Value r;
  if (nt == 0) {
    r = c.b.Splat(Type(ET::PRED, {ne}), invert ? 1 : 0);
  } else {
    Value eq = c.b.Compare(c.b.Broadcast(e, {ne, nt}, {0}), c.b.Broadcast(t, {ne, nt}, {1}), "EQ");
    r = c.b.Reduce(eq, c.b.ScalarConst(ET::PRED, 0), {1}, "or");
    if (invert) r = c.b.Unary("not", r);
  }
  return {c.b.Reshape(r, o.dims)};
}
TT_LOWERINGS(({"aten::isin.Tensor_Tensor", "aten::isin.Tensor_Tensor_out", "aten::isin.Tensor_Scalar",
               "aten::isin.Tensor_Scalar_out", "aten::isin.Scalar_Tensor", "aten::isin.Scalar_Tensor_out"}),
             IsIn);

// ---- logsumexp ----
std::vector<Value> LogSumExp(LowerCtx& c) {
  const Type& o = c.out();
  ET ct = ComputeType(o.et);
  Value x = Cast(c.b, c.t(0), ct);
  Dims dims = DimsOf(c, x.rank());
  if (dims.empty()) return {x};
  Value m = ReduceMinMax(c.b, x, dims, true);
  // infinite max -> shift by 0 (matches torch: avoids inf - inf)
  Value fin = c.b.Op1("stablehlo.is_finite", {m}, m.type.with_et(ET::PRED));
  m = c.b.Select(fin, m, c.b.Zeros(m.type));
  Dims kd = x.dims(), bd;
  for (auto d : dims) kd[d] = 1;
  Value mb = c.b.BroadcastTo(c.b.Reshape(m, kd), x.dims());
  Value s = SumDims(c.b, c.b.Unary("exponential", c.b.Sub(x, mb)), dims, false, ct);
  Value r = c.b.Add(c.b.Unary("log", s), m);
  return {c.b.Reshape(Cast(c.b, r, o.et), o.dims)};
}
TT_LOWERINGS(({"aten::logsumexp", "aten::logsumexp.out"}), LogSumExp);

// ---- cumsum / cumprod (reduce_window over a causal window) ----
template <bool Prod>
std::vector<Value> Cum(LowerCtx& c) {
  const Type& o = c.out();
  ET ct = ComputeType(o.et);
  if (ct == ET::PRED) ct = ET::S64;
  Value x = Cast(c.b, c.t(0), ct);
  if (x.rank() == 0) return {x};
  int64_t d = NormDim(c.i64(1), x.rank());
  int64_t n = x.dims()[d];
  if (n <= 1) return {x};
  int r = x.rank();
  Dims win(r, 1), str(r, 1);
  win[d] = n;
  std::string pad = "dense<[";
  for (int i = 0; i < r; ++i) {
    if (i) pad += ", ";
    pad += i == d ? "[" + std::to_string(n - 1) + ", 0]" : "[0, 0]";
  }
  pad += "]> : tensor<" + std::to_string(r) + "x2xi64>";
  hlo::Region reg;
  reg.arg_types = {Type(ct, {}), Type(ct, {})};
  reg.body = [](Builder& b, const std::vector<Value>& a) {
    return std::vector<Value>{Prod ? b.Mul(a[0], a[1]) : b.Add(a[0], a[1])};
  };
  Value init = c.b.ScalarConst(ct, Prod ? 1 : 0);
  Value y = c.b.Op1("stablehlo.reduce_window", {x, init}, x.type,
                    "window_dimensions = " + hlo::I64Array(win) + ", window_strides = " +
                        hlo::I64Array(str) + ", padding = " + pad,
                    {reg});
  return {y};
}
TT_LOWERINGS(({"aten::cumsum", "aten::cumsum_", "aten::cumsum.out"}), Cum<false>);
TT_LOWERINGS(({"aten::cumprod", "aten::cumprod_", "aten::cumprod.out"}), Cum<true>);

// ---- norm / linalg_vector_norm ----
std::vector<Value> Norm(LowerCtx& c) {
  const Type& o = c.out();
  ET ct = ComputeType(o.et);
  Value x = c.t(0);
  if (hlo::IsComplex(x.et())) c.fail("complex norm is not supported");
  x = Cast(c.b, x, ct);
  double p = 2.0;
  int pi = ArgIndex(c, "ord");
  if (pi < 0) pi = ArgIndex(c, "p");
  if (pi >= 0 && c.has(pi)) p = c.f64(pi);
  Dims dims = DimsOf(c, x.rank());
  Builder& b = c.b;
  Value a = b.Unary("abs", x);
  Value r;
  if (std::isinf(p)) {
    r = ReduceMinMax(b, a, dims, p > 0);
  } else if (p == 0) {
    r = SumDims(b, Cast(b, Cast(b, a, ET::PRED), ct), dims, false, ct);
  } else if (p == 1) {
    r = SumDims(b, a, dims, false, ct);
  } else if (p == 2) {
    r = b.Unary("sqrt", SumDims(b, b.Mul(a, a), dims, false, ct));
  } else {
    Value pw = b.Binary("power", a, b.Splat(a.type, p));
    Value s = SumDims(b, pw, dims, false, ct);
    r = b.Binary("power", s, b.Splat(s.type, 1.0 / p));
  }
  return {b.Reshape(Cast(b, r, o.et), o.dims)};
}
TT_LOWERINGS(({"aten::linalg_vector_norm", "aten::linalg_vector_norm.out", "aten::norm.Scalar",
               "aten::norm.ScalarOpt_dim", "aten::norm.ScalarOpt_dim_dtype", "aten::norm.dtype_out",
               "aten::norm.out", "aten::norm.ScalarOpt_dtype", "aten::norm.ScalarOpt_dtype_out",
               "aten::norm.Scalar_out"}), Norm);

}  // namespace
}  // namespace tt::ops
