// Convolution (1d/2d/3d; strided, padded, dilated, grouped, transposed) and
// its backward, as stablehlo.convolution. PrivateUse1 reaches
// convolution_overrideable / convolution_backward_overrideable; the same
// lowering serves aten::convolution / convolution_backward in compiled graphs.
// Math in ComputeType(out) (f16/bf16 upcast to f32).
#include <string>

#include "registry.h"

namespace tt::ops {
namespace {

std::string Arr(const Dims& v) { return hlo::I64Array(v); }


std::string Spatial(int n) {
  std::string s;
  for (int i = 0; i < n; ++i) s += ", " + std::to_string(i);
  return s;
}

struct ConvSpec {
  Dims stride, lo, hi, lhs_dil, rhs_dil;
  int64_t fgc = 1, bgc = 1;
  // Layout letters: lhs "b"/"f" for dims 0/1, rhs "o"/"i", out "b"/"f".
  bool lhs_swap = false, rhs_swap = false, out_swap = false;
};

Value Conv(Builder& b, Value x, Value w, const ConvSpec& s, const Dims& out_dims) {
  int n = x.rank() - 2;
  std::string sp = Spatial(n);
  std::string dn = std::string("#stablehlo.conv<[") + (s.lhs_swap ? "f, b" : "b, f") + sp + "]x[" +
                   (s.rhs_swap ? "i, o" : "o, i") + sp + "]->[" + (s.out_swap ? "f, b" : "b, f") + sp +
                   "]>";
  std::string attrs = "batch_group_count = " + std::to_string(s.bgc) + " : i64, dimension_numbers = " + dn +
                      ", feature_group_count = " + std::to_string(s.fgc) +
                      " : i64, lhs_dilation = " + Arr(s.lhs_dil) + ", padding = " + PadAttr(s.lo, s.hi) +
                      ", rhs_dilation = " + Arr(s.rhs_dil) + ", window_strides = " + Arr(s.stride) + b.PrecisionAttr(x.et(), w.et());
  return b.Op1("stablehlo.convolution", {x, w}, Type(x.et(), out_dims), attrs);
}

Dims Ones(int n) { return Dims(n, 1); }

// Pads `v` along every spatial dim to ints of size n (PyTorch's single-value
// expansion is done by the frontend; still accept length 1).
Dims Expand(Dims v, int n, int64_t dflt) {
  if (v.empty()) return Dims(n, dflt);
  if ((int)v.size() == 1 && n > 1) return Dims(n, v[0]);
  return v;
}

// y = conv(x, w): x (N, C, I...), w (O, C/g, K...).
Value ConvFwd(Builder& b, Value x, Value w, const Dims& st, const Dims& pad, const Dims& dil, int64_t g,
              const Dims& out_dims) {
  int n = x.rank() - 2;
  ConvSpec s;
  s.stride = st;
  s.lo = pad;
  s.lhs_dil = Ones(n);
  s.rhs_dil = dil;
  s.fgc = g;
  // Output spatial sizes are the meta kernel's. The right-hand pad is sized so
  // the windows give exactly those sizes; an input tail that no window reaches
  // (e.g. the gradient of a transposed conv whose output_padding >= stride)
  // is sliced off.
  Dims lim = x.dims();
  bool cut = false;
  for (int i = 0; i < n; ++i) {
    int64_t k = w.dims()[2 + i], I = x.dims()[2 + i], O = out_dims[2 + i];
    int64_t hi = (O - 1) * st[i] + dil[i] * (k - 1) + 1 - I - pad[i];
    if (hi < 0) {
      lim[2 + i] = I + hi;
      hi = 0;
      cut = true;
    }
    s.hi.push_back(hi);
  }
  if (cut) x = b.Slice(x, Dims(x.rank(), 0), lim, Ones(x.rank()));
  return Conv(b, x, w, s, out_dims);
}

// Weight (O, C/g, K...) -> flipped, per-group transposed (C, O/g, K...).
Value FlipSwap(Builder& b, Value w, int64_t g) {
  const Dims& d = w.dims();
  int n = w.rank() - 2;
  Dims rev;
  for (int i = 0; i < n; ++i) rev.push_back(2 + i);
  Value f = b.Op1("stablehlo.reverse", {w}, w.type, "dimensions = " + Arr(rev));
  int64_t O = d[0], Cg = d[1];
  Dims gd{g, O / g, Cg};
  for (int i = 0; i < n; ++i) gd.push_back(d[2 + i]);
  f = b.Reshape(f, gd);
  Dims perm{0, 2, 1};
  for (int i = 0; i < n; ++i) perm.push_back(3 + i);
  f = b.Transpose(f, perm);
  Dims od{Cg * g, O / g};
  for (int i = 0; i < n; ++i) od.push_back(d[2 + i]);
  return b.Reshape(f, od);
}

// Gradient of ConvFwd w.r.t. x: gy (N, O, Y...), w (O, C/g, K...) -> (N, C, in_sp...).
Value ConvGradInput(Builder& b, Value gy, Value w, const Dims& st, const Dims& pad, const Dims& dil, int64_t g,
                    const Dims& in_dims) {
  int n = gy.rank() - 2;
  Value wf = FlipSwap(b, w, g);
  ConvSpec s;
  s.stride = Ones(n);
  s.lhs_dil = st;
  s.rhs_dil = dil;
  s.fgc = g;
  for (int i = 0; i < n; ++i) {
    int64_t k = w.dims()[2 + i], Y = gy.dims()[2 + i], I = in_dims[2 + i];
    int64_t lo = dil[i] * (k - 1) - pad[i];
    s.lo.push_back(lo);
    s.hi.push_back(I - (Y - 1) * st[i] - 1 + pad[i]);
  }
  return Conv(b, gy, wf, s, in_dims);
}

// Gradient of ConvFwd w.r.t. w: x (N, C, I...), gy (N, O, Y...) -> (O, C/g, K...).
Value ConvGradWeight(Builder& b, Value x, Value gy, const Dims& st, const Dims& pad, const Dims& dil, int64_t g,
                     const Dims& w_dims) {
  int n = x.rank() - 2;
  ConvSpec s;
  s.stride = dil;
  s.lhs_dil = Ones(n);
  s.rhs_dil = st;
  s.bgc = g;
  s.lhs_swap = s.rhs_swap = s.out_swap = true;
  Dims lim = x.dims();
  bool cut = false;
  for (int i = 0; i < n; ++i) {
    int64_t k = w_dims[2 + i], Y = gy.dims()[2 + i], I = x.dims()[2 + i];
    int64_t hi = (k - 1) * dil[i] + (Y - 1) * st[i] + 1 - I - pad[i];
    if (hi < 0) {  // input tail no window reaches
      lim[2 + i] = I + hi;
      hi = 0;
      cut = true;
    }
    s.lo.push_back(pad[i]);
    s.hi.push_back(hi);
  }
  if (cut) x = b.Slice(x, Dims(x.rank(), 0), lim, Ones(x.rank()));
  // out: [f, b, sp] = (O, C/g, K...)
  return Conv(b, x, gy, s, w_dims);
}

struct Params {
  Dims st, pad, dil, opad;
  bool transposed;
  int64_t g;
};
Params GetParams(const LowerCtx& c, int first, int n) {
  Params p;
  p.st = Expand(c.ints(first), n, 1);
  p.pad = Expand(c.ints(first + 1), n, 0);
  p.dil = Expand(c.ints(first + 2), n, 1);
  p.transposed = c.flag(first + 3);
  p.opad = Expand(c.ints(first + 4), n, 0);
  p.g = c.i64(first + 5);
  return p;
}

Value AddBias(Builder& b, Value y, Value bias) {
  return b.Add(y, b.Broadcast(Cast(b, bias, y.et()), y.dims(), {1}));
}

// convolution(input, weight, bias?, stride, padding, dilation, transposed, output_padding, groups)
std::vector<Value> Convolution(LowerCtx& c) {
  Builder& b = c.b;
  const Type& o = c.out();
  ET ct = ComputeType(o.et);
  Value x = Cast(b, c.t(0), ct), w = Cast(b, c.t(1), ct);
  int n = x.rank() - 2;
  Params p = GetParams(c, 3, n);
  Dims od = o.dims;
  od[0] = x.dims()[0];
  Value y = p.transposed ? ConvGradInput(b, x, w, p.st, p.pad, p.dil, p.g, od)
                         : ConvFwd(b, x, w, p.st, p.pad, p.dil, p.g, od);
  if (c.has(2)) y = AddBias(b, y, c.t(2));
  return {Cast(b, y, o.et)};
}
TT_LOWERINGS(({"aten::convolution_overrideable", "aten::convolution_overrideable.out", "aten::convolution",
               "aten::convolution.out"}), Convolution);

// convolution_backward_overrideable(grad_output, input, weight, stride, padding, dilation, transposed,
//   output_padding, groups, output_mask)
// convolution_backward(grad_output, input, weight, bias_sizes?, stride, ..., output_mask)
std::vector<Value> ConvolutionBackward(LowerCtx& c) {
  Builder& b = c.b;
  bool full = c.op.rfind("aten::convolution_backward_overrideable", 0) != 0;
  int first = full ? 4 : 3;
  Value x0 = c.t(1), w0 = c.t(2);
  ET ct = ComputeType(x0.et());
  Value gy = Cast(b, c.t(0), ct), x = Cast(b, x0, ct), w = Cast(b, w0, ct);
  int n = x.rank() - 2;
  Params p = GetParams(c, first, n);
  std::vector<bool> mask = c.arg(first + 6).bools;
  std::vector<Value> res;
  size_t k = 0;
  if (mask[0]) {
    Value gx = p.transposed ? ConvFwd(b, gy, w, p.st, p.pad, p.dil, p.g, x.dims())
                            : ConvGradInput(b, gy, w, p.st, p.pad, p.dil, p.g, x.dims());
    res.push_back(Cast(b, gx, c.out(k++).et));
  }
  if (mask[1]) {
    Value gw = p.transposed ? ConvGradWeight(b, gy, x, p.st, p.pad, p.dil, p.g, w.dims())
                            : ConvGradWeight(b, x, gy, p.st, p.pad, p.dil, p.g, w.dims());
    res.push_back(Cast(b, gw, c.out(k++).et));
  }
  if (mask.size() > 2 && mask[2]) {
    Dims red{0};
    for (int i = 0; i < n; ++i) red.push_back(2 + i);
    res.push_back(Cast(b, SumDims(b, gy, red, false, ct), c.out(k++).et));
  }
  return res;
}
TT_LOWERINGS(({"aten::convolution_backward_overrideable", "aten::convolution_backward_overrideable.out",
               "aten::convolution_backward", "aten::convolution_backward.out"}), ConvolutionBackward);

}  // namespace
}  // namespace tt::ops
