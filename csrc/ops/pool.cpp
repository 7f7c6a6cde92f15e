// Pooling (max/avg/adaptive, with backward), upsampling (nearest, nearest-exact,
// bilinear, with backward) and reflection/replication padding (with backward).
// Max-pool indices are flat within each plane, as on CPU.
#include <cmath>
#include <cstdio>
#include <limits>
#include <string>

#include "nn_util.h"
#include "registry.h"

namespace tt::ops {
namespace {


Dims Expand(Dims v, int n, int64_t dflt) {
  if (v.empty()) return Dims(n, dflt);
  if ((int)v.size() == 1 && n > 1) return Dims(n, v[0]);
  return v;
}

std::vector<Value> ReduceWindow(Builder& b, const std::vector<Value>& vs, const std::vector<Value>& inits,
                                const Dims& win, const Dims& str, const Dims& dil, const Dims& lo,
                                const Dims& hi, const Dims& out_dims, const hlo::RegionFn& body) {
  std::vector<Value> ops = vs;
  ops.insert(ops.end(), inits.begin(), inits.end());
  std::vector<Type> rt;
  hlo::Region reg;
  for (auto& v : vs) rt.push_back(Type(v.et(), out_dims));
  for (int k = 0; k < 2; ++k)
    for (auto& v : vs) reg.arg_types.push_back(Type(v.et(), {}));
  reg.body = body;
  return b.Op("stablehlo.reduce_window", ops, rt,
              "padding = " + PadAttr(lo, hi) + ", window_dilations = " + hlo::I64Array(dil) +
                  ", window_dimensions = " + hlo::I64Array(win) + ", window_strides = " + hlo::I64Array(str),
              {reg});
}

// Flat index within the trailing `D` dims, as s64 of x's shape.
Value PlaneIota(Builder& b, const Dims& dims, int D) {
  int r = (int)dims.size();
  Type t(ET::S64, dims);
  Value idx;
  int64_t mul = 1;
  for (int i = r - 1; i >= r - D; --i) {
    Value io = b.Iota(t, i);
    if (mul != 1) io = b.Mul(io, b.Splat(t, (double)mul));
    idx = idx.valid() ? b.Add(idx, io) : io;
    mul *= dims[i];
  }
  return idx;
}

// (value, index) comparator: greater wins, NaN wins, ties -> smaller index.
std::vector<Value> ArgMaxBody(Builder& b, const std::vector<Value>& a) {
  Value av = a[0], ai = a[1], bv = a[2], bi = a[3];
  Value better = b.Compare(av, bv, "GT");
  Value eq = b.Compare(av, bv, "EQ");
  Value an = b.Compare(av, av, "NE"), bn = b.Compare(bv, bv, "NE");
  better = b.Binary("or", better, b.Binary("and", an, b.Unary("not", bn)));
  eq = b.Binary("or", eq, b.Binary("and", an, bn));
  Value pick = b.Binary("or", better, b.Binary("and", eq, b.Compare(ai, bi, "LT")));
  return {b.Select(pick, av, bv), b.Select(pick, ai, bi)};
}

struct Win {
  Dims k, s, p, d, hi;  // per spatial dim
};
// Window geometry for the trailing D dims of `in` producing `out` sizes.
Win Geometry(const LowerCtx& c, int ki, int D, const Dims& in, const Dims& out, bool has_dil) {
  Win w;
  w.k = Expand(c.ints(ki), D, 1);
  w.s = Expand(c.ints(ki + 1), D, 0);
  if (c.ints(ki + 1).empty()) w.s = w.k;
  w.p = Expand(c.ints(ki + 2), D, 0);
  w.d = has_dil ? Expand(c.ints(ki + 3), D, 1) : Dims(D, 1);
  int r = (int)in.size();
  for (int i = 0; i < D; ++i) {
    int64_t I = in[r - D + i], O = out[r - D + i];
    int64_t need = (O - 1) * w.s[i] + w.d[i] * (w.k[i] - 1) + 1 - I - w.p[i];
    w.hi.push_back(std::max<int64_t>(need, 0));
  }
  return w;
}

// Full-rank window attrs and the reduce_window output dims (may exceed `out`).
struct Full {
  Dims win, str, dil, lo, hi, odims;
};
Full FullWin(const Win& w, const Dims& in, int D) {
  Full f;
  int r = (int)in.size(), B = r - D;
  for (int i = 0; i < r; ++i) {
    bool sp = i >= B;
    int j = i - B;
    f.win.push_back(sp ? w.k[j] : 1);
    f.str.push_back(sp ? w.s[j] : 1);
    f.dil.push_back(sp ? w.d[j] : 1);
    f.lo.push_back(sp ? w.p[j] : 0);
    f.hi.push_back(sp ? w.hi[j] : 0);
    int64_t padded = in[i] + f.lo[i] + f.hi[i];
    int64_t eff = (f.win[i] - 1) * f.dil[i] + 1;
    f.odims.push_back((padded - eff) / f.str[i] + 1);
  }
  return f;
}

Value SliceTo(Builder& b, Value v, const Dims& dims) {
  if (v.dims() == dims) return v;
  return b.Slice(v, Dims(dims.size(), 0), dims, Dims(dims.size(), 1));
}

// max_pool{2,3}d_with_indices(self, kernel_size, stride, padding, dilation, ceil_mode)
template <int D>
std::vector<Value> MaxPool(LowerCtx& c) {
  Builder& b = c.b;
  Value x = c.t(0);
  const Dims& od = c.out(0).dims;
  Win w = Geometry(c, 1, D, x.dims(), od, true);
  Full f = FullWin(w, x.dims(), D);
  Value idx = PlaneIota(b, x.dims(), D);
  auto r = ReduceWindow(b, {x, idx}, {MinMaxInit(b, x.et(), true), b.ScalarConst(ET::S64, (double)INT64_MAX)},
                        f.win, f.str, f.dil, f.lo, f.hi, f.odims, ArgMaxBody);
  return {SliceTo(b, r[0], od), Cast(b, SliceTo(b, r[1], od), c.out(1).et)};
}
TT_LOWERINGS(({"aten::max_pool2d_with_indices", "aten::max_pool2d_with_indices.out"}), MaxPool<2>);
TT_LOWERINGS(({"aten::max_pool3d_with_indices", "aten::max_pool3d_with_indices.out"}), MaxPool<3>);

// Scatter-add grad (..., O...) into the input planes at flat plane indices.
Value ScatterPlanes(Builder& b, Value g, Value ind, const Type& xt, int D, ET ct) {
  int r = xt.rank();
  int64_t plane = 1;
  for (int i = r - D; i < r; ++i) plane *= xt.dims[i];
  int64_t P = xt.numel() / std::max<int64_t>(plane, 1);
  int64_t n = g.type.numel();
  Dims pd = g.dims();
  Type it(ET::S64, pd);
  // plane id of every grad element: flat index over the leading dims
  Value pid;
  int64_t mul = 1;
  for (int i = r - D - 1; i >= 0; --i) {
    Value io = b.Iota(it, i);
    if (mul != 1) io = b.Mul(io, b.Splat(it, (double)mul));
    pid = pid.valid() ? b.Add(pid, io) : io;
    mul *= pd[i];
  }
  Value gi = Cast(b, ind, ET::S64);
  if (pid.valid()) gi = b.Add(gi, b.Mul(pid, b.Splat(it, (double)plane)));
  gi = b.Reshape(gi, {n, 1});
  Value upd = b.Reshape(Cast(b, g, ct), {n});
  hlo::Region reg;
  reg.arg_types = {Type(ct, {}), Type(ct, {})};
  reg.body = [](Builder& b, const std::vector<Value>& a) { return std::vector<Value>{b.Add(a[0], a[1])}; };
  Value base = b.Zeros(Type(ct, {P * plane}));
  Value s = b.Op1("stablehlo.scatter", {base, gi, upd}, base.type,
                  "scatter_dimension_numbers = #stablehlo.scatter<update_window_dims = [], "
                  "inserted_window_dims = [0], scatter_dims_to_operand_dims = [0], index_vector_dim = 1>, "
                  "indices_are_sorted = false, unique_indices = false",
                  {reg});
  return b.Reshape(s, xt.dims);
}

// max_pool2d_with_indices_backward(grad_output, self, kernel_size, stride, padding, dilation, ceil_mode, indices)
template <int D>
std::vector<Value> MaxPoolBackward(LowerCtx& c) {
  const Type& o = c.out();
  ET ct = ComputeType(o.et);
  return {Cast(c.b, ScatterPlanes(c.b, c.t(0), c.t(7), c.t(1).type, D, ct), o.et)};
}
TT_LOWERINGS(({"aten::max_pool2d_with_indices_backward", "aten::max_pool2d_with_indices_backward.grad_input"}),
             MaxPoolBackward<2>);
TT_LOWERINGS(({"aten::max_pool3d_with_indices_backward", "aten::max_pool3d_with_indices_backward.grad_input"}),
             MaxPoolBackward<3>);

// adaptive_max_pool2d_backward(grad_output, self, indices)
template <int D>
std::vector<Value> AdaptiveMaxPoolBackward(LowerCtx& c) {
  const Type& o = c.out();
  ET ct = ComputeType(o.et);
  return {Cast(c.b, ScatterPlanes(c.b, c.t(0), c.t(2), c.t(1).type, D, ct), o.et)};
}
TT_LOWERINGS(({"aten::adaptive_max_pool2d_backward", "aten::adaptive_max_pool2d_backward.grad_input"}),
             AdaptiveMaxPoolBackward<2>);
TT_LOWERINGS(({"aten::adaptive_max_pool3d_backward", "aten::adaptive_max_pool3d_backward.grad_input"}),
             AdaptiveMaxPoolBackward<3>);

// Per-window element counts along one spatial dim (s64, length O).
Value AvgCount(Builder& b, int64_t O, int64_t I, int64_t k, int64_t s, int64_t p, bool include_pad) {
  Type t(ET::S64, {O});
  Value start = b.Sub(b.Mul(b.Iota(t, 0), b.Splat(t, (double)s)), b.Splat(t, (double)p));
  Value end = b.Min(b.Add(start, b.Splat(t, (double)k)), b.Splat(t, (double)(I + p)));
  if (!include_pad) {
    start = b.Max(start, b.Zeros(t));
    end = b.Min(end, b.Splat(t, (double)I));
  }
  return b.Sub(end, start);
}

// Divisor for every output element of avg pooling (ct, output dims).
Value AvgDivisor(LowerCtx& c, int D, const Win& w, const Dims& in, const Dims& od, int ci, int di, ET ct) {
  Builder& b = c.b;
  Type t(ct, od);
  if (c.has(di)) return b.Splat(t, (double)c.i64(di));
  bool include = c.flag(ci, true);
  int r = (int)od.size();
  Value div;
  for (int i = 0; i < D; ++i) {
    int dim = r - D + i;
    Value cnt = Cast(b, AvgCount(b, od[dim], in[dim], w.k[i], w.s[i], w.p[i], include), ct);
    Value bc = b.Broadcast(cnt, od, {dim});
    div = div.valid() ? b.Mul(div, bc) : bc;
  }
  return div;
}

// avg_pool{2,3}d(self, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override?)
template <int D>
std::vector<Value> AvgPool(LowerCtx& c) {
  Builder& b = c.b;
  const Type& o = c.out();
  ET ct = ComputeType(o.et);
  Value x = Cast(b, c.t(0), ct);
  Win w = Geometry(c, 1, D, x.dims(), o.dims, false);
  Full f = FullWin(w, x.dims(), D);
  Value s = ReduceWindow(b, {x}, {b.ScalarConst(ct, 0)}, f.win, f.str, f.dil, f.lo, f.hi, f.odims,
                         [](Builder& b, const std::vector<Value>& a) {
                           return std::vector<Value>{b.Add(a[0], a[1])};
                         })[0];
  s = SliceTo(b, s, o.dims);
  return {Cast(b, b.Div(s, AvgDivisor(c, D, w, x.dims(), o.dims, 5, 6, ct)), o.et)};
}
TT_LOWERINGS(({"aten::avg_pool2d", "aten::avg_pool2d.out"}), AvgPool<2>);
TT_LOWERINGS(({"aten::avg_pool3d", "aten::avg_pool3d.out"}), AvgPool<3>);

// avg_pool{2,3}d_backward(grad_output, self, kernel_size, stride, padding, ceil_mode, count_include_pad,
//   divisor_override?)
template <int D>
std::vector<Value> AvgPoolBackward(LowerCtx& c) {
  Builder& b = c.b;
  const Type& o = c.out();
  ET ct = ComputeType(o.et);
  const Dims& in = o.dims;
  Value g = Cast(b, c.t(0), ct);
  const Dims& gd = g.dims();
  Win w = Geometry(c, 2, D, in, gd, false);
  g = b.Div(g, AvgDivisor(c, D, w, in, gd, 6, 7, ct));
  // Spread each gradient over its window: a stride-dilated full correlation
  // with a ones kernel, on (planes, 1, O...).
  int r = (int)in.size();
  int64_t P = 1;
  for (int i = 0; i < r - D; ++i) P *= in[i];
  Dims g3{P, 1}, k3{1, 1}, padded{P, 1};
  std::string sp;
  Dims lo, hi, lhs_dil, ones;
  for (int i = 0; i < D; ++i) {
    int64_t I = in[r - D + i], O = gd[r - D + i];
    int64_t Ip = I + w.p[i] + w.hi[i];
    g3.push_back(O);
    k3.push_back(w.k[i]);
    padded.push_back(Ip);
    lo.push_back(w.k[i] - 1);
    hi.push_back(Ip - (O - 1) * w.s[i] - 1);
    lhs_dil.push_back(w.s[i]);
    ones.push_back(1);
    sp += ", " + std::to_string(i);
  }
  Value g4 = b.Reshape(g, g3);
  Value k = b.Splat(Type(ct, k3), 1.0);
  Value full = b.Op1("stablehlo.convolution", {g4, k}, Type(ct, padded),
                     "batch_group_count = 1 : i64, dimension_numbers = #stablehlo.conv<[b, f" + sp + "]x[o, i" +
                         sp + "]->[b, f" + sp + "]>, feature_group_count = 1 : i64, lhs_dilation = " +
                         hlo::I64Array(lhs_dil) + ", padding = " + PadAttr(lo, hi) +
                         ", rhs_dilation = " + hlo::I64Array(ones) + ", window_strides = " + hlo::I64Array(ones) +
                         b.PrecisionAttr(ct, ct, Builder::Prec::kExact));
  Dims st(D + 2, 0), lim = padded;
  for (int i = 0; i < D; ++i) {
    st[2 + i] = w.p[i];
    lim[2 + i] = w.p[i] + in[r - D + i];
  }
  Value gx = b.Slice(full, st, lim, Dims(D + 2, 1));
  return {Cast(b, b.Reshape(gx, in), o.et)};
}
TT_LOWERINGS(({"aten::avg_pool2d_backward", "aten::avg_pool2d_backward.grad_input"}), AvgPoolBackward<2>);
TT_LOWERINGS(({"aten::avg_pool3d_backward", "aten::avg_pool3d_backward.grad_input"}), AvgPoolBackward<3>);

// ---- adaptive pooling ----
// Window bounds: start = floor(o*I/O), end = ceil((o+1)*I/O); as (O, I) masks.
Value AdaptiveMask(Builder& b, int64_t O, int64_t I) {
  Type t(ET::S64, {O, I});
  Value o = b.Iota(t, 0), i = b.Iota(t, 1);
  Value start = b.Div(b.Mul(o, b.Splat(t, (double)I)), b.Splat(t, (double)O));
  Value end = b.Div(b.Add(b.Mul(b.Add(o, b.Splat(t, 1)), b.Splat(t, (double)I)), b.Splat(t, (double)(O - 1))),
                    b.Splat(t, (double)O));
  return b.Binary("and", b.Compare(start, i, "LE"), b.Compare(i, end, "LT"));
}
Value AdaptiveAvgMatrix(Builder& b, int64_t O, int64_t I, ET ct) {
  Value m = AdaptiveMask(b, O, I);
  Type t(ct, {O, I});
  Value one = b.Select(m, b.Splat(t, 1.0), b.Zeros(t));
  Value cnt = b.Reduce(one, b.ScalarConst(ct, 0), {1}, "add");
  return b.Div(one, b.Broadcast(cnt, {O, I}, {0}));
}

// Contracts dim `dim` of x with m's dim `mdim`; the other dim of m takes its place.
Value ApplyDim(Builder& b, Value x, int dim, Value m, int mdim) {
  int r = x.rank();
  Dims rd;
  for (int i = 0; i < r; ++i)
    if (i != dim) rd.push_back(x.dims()[i]);
  int64_t nsz = m.dims()[1 - mdim];
  rd.push_back(nsz);
  Value y = b.DotGeneral(x, m, {}, {}, {dim}, {mdim}, Type(x.et(), rd), Builder::Prec::kExact);
  Dims perm;
  for (int i = 0; i < r - 1; ++i) perm.push_back(i);
  perm.insert(perm.begin() + dim, r - 1);
  return b.Transpose(y, perm);
}

template <int D>
std::vector<Value> AdaptiveAvgPool(LowerCtx& c) {
  Builder& b = c.b;
  const Type& o = c.out();
  ET ct = ComputeType(o.et);
  Value x = Cast(b, c.t(0), ct);
  int r = x.rank();
  for (int i = r - D; i < r; ++i)
    x = ApplyDim(b, x, i, AdaptiveAvgMatrix(b, o.dims[i], x.dims()[i], ct), 1);
  return {Cast(b, x, o.et)};
}
TT_LOWERINGS(({"aten::_adaptive_avg_pool2d", "aten::_adaptive_avg_pool2d.out"}), AdaptiveAvgPool<2>);
TT_LOWERINGS(({"aten::_adaptive_avg_pool3d", "aten::_adaptive_avg_pool3d.out"}), AdaptiveAvgPool<3>);

// _adaptive_avg_pool2d_backward(grad_output, self)
template <int D>
std::vector<Value> AdaptiveAvgPoolBackward(LowerCtx& c) {
  Builder& b = c.b;
  const Type& o = c.out();
  ET ct = ComputeType(o.et);
  Value g = Cast(b, c.t(0), ct);
  int r = g.rank();
  for (int i = r - D; i < r; ++i)
    g = ApplyDim(b, g, i, AdaptiveAvgMatrix(b, g.dims()[i], o.dims[i], ct), 0);
  return {Cast(b, g, o.et)};
}
TT_LOWERINGS(({"aten::_adaptive_avg_pool2d_backward", "aten::_adaptive_avg_pool2d_backward.out"}),
             AdaptiveAvgPoolBackward<2>);
TT_LOWERINGS(({"aten::_adaptive_avg_pool3d_backward", "aten::_adaptive_avg_pool3d_backward.out"}),
             AdaptiveAvgPoolBackward<3>);

// adaptive_max_pool{2,3}d(self, output_size) -> (out, indices): every output
// cell's window masked over the whole plane, then an arg-max reduction.
template <int D>
std::vector<Value> AdaptiveMaxPool(LowerCtx& c) {
  Builder& b = c.b;
  const Type& o = c.out(0);
  Value x = c.t(0);
  int r = x.rank(), B = r - D;
  // expanded shape: (lead..., O1..OD, I1..ID)
  Dims ed(x.dims().begin(), x.dims().begin() + B);
  for (int i = 0; i < D; ++i) ed.push_back(o.dims[B + i]);
  for (int i = 0; i < D; ++i) ed.push_back(x.dims()[B + i]);
  Dims xmap;
  for (int i = 0; i < B; ++i) xmap.push_back(i);
  for (int i = 0; i < D; ++i) xmap.push_back(B + D + i);
  Value xe = b.Broadcast(x, ed, xmap);
  Value mask;
  for (int i = 0; i < D; ++i) {
    Value m = b.Broadcast(AdaptiveMask(b, o.dims[B + i], x.dims()[B + i]), ed, {B + i, B + D + i});
    mask = mask.valid() ? b.Binary("and", mask, m) : m;
  }
  Value init = MinMaxInit(b, x.et(), true);
  Value xv = b.Select(mask, xe, b.BroadcastTo(init, ed));
  Value idx = b.Broadcast(PlaneIota(b, x.dims(), D), ed, xmap);
  Dims red;
  for (int i = 0; i < D; ++i) red.push_back(B + D + i);
  auto res = b.ReduceMulti({xv, idx}, {init, b.ScalarConst(ET::S64, (double)INT64_MAX)}, red, ArgMaxBody);
  return {res[0], Cast(b, res[1], c.out(1).et)};
}
TT_LOWERINGS(({"aten::adaptive_max_pool2d", "aten::adaptive_max_pool2d.out"}), AdaptiveMaxPool<2>);
TT_LOWERINGS(({"aten::adaptive_max_pool3d", "aten::adaptive_max_pool3d.out"}), AdaptiveMaxPool<3>);

// ---- index maps (upsampling, padding) ----
std::string F32Lit(double v) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.9e", v);
  return buf;
}
// (O, I) matrix constant from row-major values.
Value MatConst(Builder& b, ET ct, int64_t O, int64_t I, const std::vector<double>& v) {
  std::string s = "[";
  for (int64_t o = 0; o < O; ++o) {
    s += o ? ", [" : "[";
    for (int64_t i = 0; i < I; ++i) s += (i ? ", " : "") + F32Lit(v[o * I + i]);
    s += "]";
  }
  s += "]";
  return b.Constant(Type(ct, {O, I}), s);
}
// One-hot (O, I) matrix of a source-index map.
Value OneHot(Builder& b, ET ct, int64_t I, const std::vector<int64_t>& src) {
  int64_t O = (int64_t)src.size();
  std::vector<double> v(O * I, 0.0);
  for (int64_t o = 0; o < O; ++o) v[o * I + src[o]] = 1.0;
  return MatConst(b, ct, O, I, v);
}
// x gathered along `dim` at constant indices src.
Value GatherDim(Builder& b, Value x, int dim, const std::vector<int64_t>& src) {
  int64_t O = (int64_t)src.size();
  std::string lit = "[";
  for (int64_t o = 0; o < O; ++o) lit += (o ? ", [" : "[") + std::to_string(src[o]) + "]";
  lit += "]";
  Value ind = b.Constant(Type(ET::S64, {O, 1}), lit);
  int r = x.rank();
  Dims offs, ss = x.dims(), od = x.dims();
  for (int i = 0; i < r; ++i)
    if (i != dim) offs.push_back(i);
  ss[dim] = 1;
  od[dim] = O;
  return b.Op1("stablehlo.gather", {x, ind}, Type(x.et(), od),
               "dimension_numbers = #stablehlo.gather<offset_dims = " + hlo::IntList(offs) +
                   ", collapsed_slice_dims = [" + std::to_string(dim) + "], start_index_map = [" +
                   std::to_string(dim) + "], index_vector_dim = 1>, slice_sizes = " + hlo::I64Array(ss) +
                   ", indices_are_sorted = false");
}

// CPU's area_pixel_compute_scale (float).
float AreaScale(int64_t I, int64_t O, bool align, const std::optional<double>& scale) {
  if (align) return O > 1 ? (float)(I - 1) / (float)(O - 1) : 0.f;
  if (scale && *scale > 0) return (float)(1.0 / *scale);
  return (float)I / (float)O;
}
std::optional<double> OptScale(const LowerCtx& c, size_t i) {
  if (!c.has(i)) return std::nullopt;
  return c.f64(i);
}

std::vector<int64_t> NearestMap(int64_t I, int64_t O, const std::optional<double>& sc, bool exact) {
  float scale = AreaScale(I, O, false, sc);
  std::vector<int64_t> m(O);
  for (int64_t o = 0; o < O; ++o) {
    int64_t s = exact ? (int64_t)std::floor((o + 0.5f) * scale) : (int64_t)std::floor(o * scale);
    m[o] = std::min(s, I - 1);
  }
  return m;
}

// upsample_nearest{1,2,3}d(self, output_size, scales...) and _upsample_nearest_exact*
template <int D, bool Exact>
std::vector<Value> UpsampleNearest(LowerCtx& c) {
  Builder& b = c.b;
  const Type& o = c.out();
  Value x = c.t(0);
  int r = x.rank();
  for (int i = 0; i < D; ++i) {
    int dim = r - D + i;
    x = GatherDim(b, x, dim, NearestMap(x.dims()[dim], o.dims[dim], OptScale(c, 2 + i), Exact));
  }
  return {x};
}
// backward(grad_output, output_size, input_size, scales...)
template <int D, bool Exact>
std::vector<Value> UpsampleNearestBackward(LowerCtx& c) {
  Builder& b = c.b;
  const Type& o = c.out();
  ET ct = ComputeType(o.et);
  Value g = Cast(b, c.t(0), ct);
  int r = g.rank();
  for (int i = 0; i < D; ++i) {
    int dim = r - D + i;
    int64_t I = o.dims[dim];
    g = ApplyDim(b, g, dim, OneHot(b, ct, I, NearestMap(I, g.dims()[dim], OptScale(c, 3 + i), Exact)), 0);
  }
  return {Cast(b, g, o.et)};
}
TT_LOWERINGS(({"aten::upsample_nearest1d", "aten::upsample_nearest1d.out"}), (UpsampleNearest<1, false>));
TT_LOWERINGS(({"aten::upsample_nearest2d", "aten::upsample_nearest2d.out"}), (UpsampleNearest<2, false>));
TT_LOWERINGS(({"aten::upsample_nearest3d", "aten::upsample_nearest3d.out"}), (UpsampleNearest<3, false>));
TT_LOWERINGS(({"aten::_upsample_nearest_exact1d", "aten::_upsample_nearest_exact1d.out"}),
             (UpsampleNearest<1, true>));
TT_LOWERINGS(({"aten::_upsample_nearest_exact2d", "aten::_upsample_nearest_exact2d.out"}),
             (UpsampleNearest<2, true>));
TT_LOWERINGS(({"aten::_upsample_nearest_exact3d", "aten::_upsample_nearest_exact3d.out"}),
             (UpsampleNearest<3, true>));
TT_LOWERINGS(({"aten::upsample_nearest1d_backward", "aten::upsample_nearest1d_backward.grad_input"}),
             (UpsampleNearestBackward<1, false>));
TT_LOWERINGS(({"aten::upsample_nearest2d_backward", "aten::upsample_nearest2d_backward.grad_input"}),
             (UpsampleNearestBackward<2, false>));
TT_LOWERINGS(({"aten::upsample_nearest3d_backward", "aten::upsample_nearest3d_backward.grad_input"}),
             (UpsampleNearestBackward<3, false>));
TT_LOWERINGS(({"aten::_upsample_nearest_exact1d_backward", "aten::_upsample_nearest_exact1d_backward.grad_input"}),
             (UpsampleNearestBackward<1, true>));
TT_LOWERINGS(({"aten::_upsample_nearest_exact2d_backward", "aten::_upsample_nearest_exact2d_backward.grad_input"}),
             (UpsampleNearestBackward<2, true>));
TT_LOWERINGS(({"aten::_upsample_nearest_exact3d_backward", "aten::_upsample_nearest_exact3d_backward.grad_input"}),
             (UpsampleNearestBackward<3, true>));

// Linear interpolation weights (O, I), as CPU computes them in float.
std::vector<double> LinearWeights(int64_t I, int64_t O, bool align, const std::optional<double>& sc) {
  float scale = AreaScale(I, O, align, sc);
  std::vector<double> v(O * I, 0.0);
  for (int64_t o = 0; o < O; ++o) {
    float src = align ? scale * (float)o : std::max(scale * ((float)o + 0.5f) - 0.5f, 0.f);
    int64_t i0 = std::min((int64_t)src, I - 1);
    int64_t i1 = i0 + (i0 < I - 1 ? 1 : 0);
    float l1 = std::min(std::max(src - (float)i0, 0.f), 1.f), l0 = 1.f - l1;
    v[o * I + i0] += l0;
    v[o * I + i1] += l1;
  }
  return v;
}

// upsample_bilinear2d(self, output_size, align_corners, scales_h?, scales_w?)
std::vector<Value> UpsampleBilinear(LowerCtx& c) {
  Builder& b = c.b;
  const Type& o = c.out();
  ET ct = ComputeType(o.et);
  Value x = Cast(b, c.t(0), ct);
  bool align = c.flag(2);
  int r = x.rank();
  for (int i = 0; i < 2; ++i) {
    int dim = r - 2 + i;
    int64_t I = x.dims()[dim], O = o.dims[dim];
    x = ApplyDim(b, x, dim, MatConst(b, ct, O, I, LinearWeights(I, O, align, OptScale(c, 3 + i))), 1);
  }
  return {Cast(b, x, o.et)};
}
TT_LOWERINGS(({"aten::upsample_bilinear2d", "aten::upsample_bilinear2d.out"}), UpsampleBilinear);

// upsample_bilinear2d_backward(grad_output, output_size, input_size, align_corners, scales_h?, scales_w?)
std::vector<Value> UpsampleBilinearBackward(LowerCtx& c) {
  Builder& b = c.b;
  const Type& o = c.out();
  ET ct = ComputeType(o.et);
  Value g = Cast(b, c.t(0), ct);
  bool align = c.flag(3);
  int r = g.rank();
  for (int i = 0; i < 2; ++i) {
    int dim = r - 2 + i;
    int64_t I = o.dims[dim], O = g.dims()[dim];
    g = ApplyDim(b, g, dim, MatConst(b, ct, O, I, LinearWeights(I, O, align, OptScale(c, 4 + i))), 0);
  }
  return {Cast(b, g, o.et)};
}
TT_LOWERINGS(({"aten::upsample_bilinear2d_backward", "aten::upsample_bilinear2d_backward.grad_input"}),
             UpsampleBilinearBackward);

// ---- reflection / replication padding ----
std::vector<int64_t> PadMap(int64_t I, int64_t lo, int64_t hi, bool reflect) {
  std::vector<int64_t> m;
  for (int64_t o = 0; o < I + lo + hi; ++o) {
    int64_t j = o - lo;
    if (reflect) {
      if (j < 0) j = -j;
      if (j >= I) j = 2 * (I - 1) - j;
    } else {
      j = std::min(std::max<int64_t>(j, 0), I - 1);
    }
    m.push_back(j);
  }
  return m;
}
// padding = [last_lo, last_hi, prev_lo, prev_hi, ...]
template <bool Reflect>
std::vector<Value> PadND(LowerCtx& c) {
  Builder& b = c.b;
  Value x = c.t(0);
  Dims p = c.ints(1);
  int r = x.rank(), D = (int)p.size() / 2;
  for (int i = 0; i < D; ++i) {
    int dim = r - 1 - i;
    x = GatherDim(b, x, dim, PadMap(x.dims()[dim], p[2 * i], p[2 * i + 1], Reflect));
  }
  return {x};
}
// backward(grad_output, self, padding)
template <bool Reflect>
std::vector<Value> PadNDBackward(LowerCtx& c) {
  Builder& b = c.b;
  const Type& o = c.out();
  ET ct = ComputeType(o.et);
  Value g = Cast(b, c.t(0), ct);
  Dims p = c.ints(2);
  int r = g.rank(), D = (int)p.size() / 2;
  for (int i = 0; i < D; ++i) {
    int dim = r - 1 - i;
    int64_t I = o.dims[dim];
    g = ApplyDim(b, g, dim, OneHot(b, ct, I, PadMap(I, p[2 * i], p[2 * i + 1], Reflect)), 0);
  }
  return {Cast(b, g, o.et)};
}
TT_LOWERINGS(({"aten::reflection_pad1d", "aten::reflection_pad1d.out", "aten::reflection_pad2d",
               "aten::reflection_pad2d.out", "aten::reflection_pad3d", "aten::reflection_pad3d.out"}),
             PadND<true>);
TT_LOWERINGS(({"aten::replication_pad1d", "aten::replication_pad1d.out", "aten::replication_pad2d",
               "aten::replication_pad2d.out", "aten::replication_pad3d", "aten::replication_pad3d.out"}),
             PadND<false>);
TT_LOWERINGS(({"aten::reflection_pad1d_backward", "aten::reflection_pad1d_backward.grad_input",
               "aten::reflection_pad2d_backward", "aten::reflection_pad2d_backward.grad_input",
               "aten::reflection_pad3d_backward", "aten::reflection_pad3d_backward.grad_input"}),
             PadNDBackward<true>);
TT_LOWERINGS(({"aten::replication_pad1d_backward", "aten::replication_pad1d_backward.grad_input",
               "aten::replication_pad2d_backward", "aten::replication_pad2d_backward.grad_input",
               "aten::replication_pad3d_backward", "aten::replication_pad3d_backward.grad_input"}),
             PadNDBackward<false>);

}  // namespace
}  // namespace tt::ops
