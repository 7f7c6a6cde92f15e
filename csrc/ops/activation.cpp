// Activations and their backward ops: softplus, elu (selu/celu), leaky_relu,
// hardtanh, hardswish/hardsigmoid backward, log_sigmoid, glu, prelu,
// soft/hardshrink, threshold, rrelu. Forwards of relu/silu/mish/hardswish/
// hardsigmoid/sigmoid/tanh are rows in elementwise.cpp; gelu, silu/sigmoid/
// tanh/threshold backwards live in nn.cpp. Math runs in ComputeType(out).
#include <cmath>

#include "registry.h"

namespace tt::ops {
namespace {

Value S(Builder& b, const Value& like, double v) { return b.Splat(like.type, v); }
// Argument i (tensor or scalar) broadcast to the output shape in ct.
Value In(LowerCtx& c, size_t i, ET ct) { return Bcast(c.b, c.t(i), c.out().dims, ct); }
ET CT(LowerCtx& c) { return ComputeType(c.out().et); }
Value LT(Builder& b, Value x, Value y) { return b.Compare(x, y, "LT"); }
Value LE(Builder& b, Value x, Value y) { return b.Compare(x, y, "LE"); }
Value GT(Builder& b, Value x, Value y) { return b.Compare(x, y, "GT"); }
Value GE(Builder& b, Value x, Value y) { return b.Compare(x, y, "GE"); }
Value And(Builder& b, Value x, Value y) { return b.Binary("and", x, y); }
Value Or(Builder& b, Value x, Value y) { return b.Binary("or", x, y); }

// ---- softplus: x*beta > threshold ? x : log1p(exp(x*beta)) / beta ----
std::vector<Value> Softplus(LowerCtx& c) {
  Builder& b = c.b;
  ET ct = CT(c);
  Value x = In(c, 0, ct), beta = In(c, 1, ct), th = In(c, 2, ct);
  Value bx = b.Mul(x, beta);
  Value y = b.Div(b.Unary("log_plus_one", b.Unary("exponential", bx)), beta);
  return {b.Select(GT(b, bx, th), x, y)};
}
TT_LOWERINGS(({"aten::softplus", "aten::softplus.out"}), Softplus);

std::vector<Value> SoftplusBackward(LowerCtx& c) {
  Builder& b = c.b;
  ET ct = CT(c);
  Value g = In(c, 0, ct), x = In(c, 1, ct), beta = In(c, 2, ct), th = In(c, 3, ct);
  Value bx = b.Mul(x, beta);
  Value z = b.Unary("exponential", bx);
  return {b.Select(GT(b, bx, th), g, b.Div(b.Mul(g, z), b.Add(z, S(b, z, 1))))};
}
TT_LOWERINGS(({"aten::softplus_backward", "aten::softplus_backward.grad_input"}), SoftplusBackward);

// ---- elu(x, alpha, scale, input_scale) ----
std::vector<Value> Elu(LowerCtx& c) {
  Builder& b = c.b;
  ET ct = CT(c);
  Value x = In(c, 0, ct), alpha = In(c, 1, ct), scale = In(c, 2, ct), is = In(c, 3, ct);
  Value neg = b.Mul(b.Unary("exponential_minus_one", b.Mul(x, is)), b.Mul(alpha, scale));
  return {b.Select(LE(b, x, b.Zeros(x.type)), neg, b.Mul(x, scale))};
}
TT_LOWERINGS(({"aten::elu", "aten::elu_", "aten::elu.out"}), Elu);

std::vector<Value> EluBackward(LowerCtx& c) {
  Builder& b = c.b;
  ET ct = CT(c);
  Value g = In(c, 0, ct), alpha = In(c, 1, ct), scale = In(c, 2, ct), is = In(c, 3, ct);
  bool is_result = c.flag(4);
  Value v = In(c, 5, ct);
  Value negcoef = b.Mul(alpha, scale);
  Value neg = is_result ? b.Mul(b.Mul(g, is), b.Add(v, negcoef))
                        : b.Mul(b.Mul(b.Mul(g, is), negcoef), b.Unary("exponential", b.Mul(v, is)));
  return {b.Select(LE(b, v, b.Zeros(v.type)), neg, b.Mul(g, scale))};
}
TT_LOWERINGS(({"aten::elu_backward", "aten::elu_backward.grad_input"}), EluBackward);

// ---- leaky_relu ----
std::vector<Value> LeakyRelu(LowerCtx& c) {
  Builder& b = c.b;
  ET ct = CT(c);
  Value x = In(c, 0, ct), s = In(c, 1, ct);
  return {b.Select(GT(b, x, b.Zeros(x.type)), x, b.Mul(x, s))};
}
TT_LOWERINGS(({"aten::leaky_relu", "aten::leaky_relu_", "aten::leaky_relu.out"}), LeakyRelu);

std::vector<Value> LeakyReluBackward(LowerCtx& c) {
  Builder& b = c.b;
  ET ct = CT(c);
  Value g = In(c, 0, ct), x = In(c, 1, ct), s = In(c, 2, ct);
  return {b.Select(GT(b, x, b.Zeros(x.type)), g, b.Mul(g, s))};
}
TT_LOWERINGS(({"aten::leaky_relu_backward", "aten::leaky_relu_backward.grad_input"}), LeakyReluBackward);

// ---- hardtanh (relu6) ----
std::vector<Value> Hardtanh(LowerCtx& c) {
  Builder& b = c.b;
  ET ct = CT(c);
  Value x = In(c, 0, ct), lo = In(c, 1, ct), hi = In(c, 2, ct);
  // NaN propagates (as CPU's min(max(x, lo), hi) does)
  Value y = b.Select(LT(b, x, lo), lo, b.Select(GT(b, x, hi), hi, x));
  return {y};
}
TT_LOWERINGS(({"aten::hardtanh", "aten::hardtanh_", "aten::hardtanh.out"}), Hardtanh);

std::vector<Value> HardtanhBackward(LowerCtx& c) {
  Builder& b = c.b;
  ET ct = CT(c);
  Value g = In(c, 0, ct), x = In(c, 1, ct), lo = In(c, 2, ct), hi = In(c, 3, ct);
  return {b.Select(Or(b, LE(b, x, lo), GE(b, x, hi)), b.Zeros(g.type), g)};
}
TT_LOWERINGS(({"aten::hardtanh_backward", "aten::hardtanh_backward.grad_input"}), HardtanhBackward);

// ---- hardswish / hardsigmoid backward ----
std::vector<Value> HardswishBackward(LowerCtx& c) {
  Builder& b = c.b;
  ET ct = CT(c);
  Value g = In(c, 0, ct), x = In(c, 1, ct);
  Value mid = b.Mul(g, b.Add(b.Div(x, S(b, x, 3)), S(b, x, 0.5)));
  return {b.Select(LE(b, x, S(b, x, -3)), b.Zeros(g.type), b.Select(LT(b, x, S(b, x, 3)), mid, g))};
}
TT_LOWERINGS(({"aten::hardswish_backward", "aten::hardswish_backward.out"}), HardswishBackward);

std::vector<Value> HardsigmoidBackward(LowerCtx& c) {
  Builder& b = c.b;
  ET ct = CT(c);
  Value g = In(c, 0, ct), x = In(c, 1, ct);
  Value in = And(b, GT(b, x, S(b, x, -3)), LT(b, x, S(b, x, 3)));
  return {b.Select(in, b.Div(g, S(b, g, 6)), b.Zeros(g.type))};
}
TT_LOWERINGS(({"aten::hardsigmoid_backward", "aten::hardsigmoid_backward.grad_input"}), HardsigmoidBackward);

// ---- mish backward: g * (tanh(sp) + x * sigmoid(x) * (1 - tanh(sp)^2)) ----
std::vector<Value> MishBackward(LowerCtx& c) {
  Builder& b = c.b;
  ET ct = CT(c);
  Value g = In(c, 0, ct), x = In(c, 1, ct);
  Value sp = b.Unary("log_plus_one", b.Unary("exponential", x));
  sp = b.Select(GT(b, x, S(b, x, 20)), x, sp);
  Value t = b.Unary("tanh", sp);
  Value sg = b.Unary("logistic", x);
  return {b.Mul(g, b.Add(t, b.Mul(b.Mul(x, sg), b.Sub(S(b, t, 1), b.Mul(t, t)))))};
}
TT_LOWERINGS(({"aten::mish_backward"}), MishBackward);

// ---- log_sigmoid: min(x, 0) - log1p(exp(-|x|)); buffer = exp(-|x|) ----
std::vector<Value> LogSigmoidForward(LowerCtx& c) {
  Builder& b = c.b;
  ET ct = CT(c);
  Value x = In(c, 0, ct);
  Value z = b.Unary("exponential", b.Unary("negate", b.Unary("abs", x)));
  Value y = b.Sub(b.Min(x, b.Zeros(x.type)), b.Unary("log_plus_one", z));
  Value buf = c.out(1).dims == c.out(0).dims ? z : b.Zeros(c.out(1).with_et(ct));
  return {y, buf};
}
TT_LOWERINGS(({"aten::log_sigmoid_forward", "aten::log_sigmoid_forward.output"}), LogSigmoidForward);

std::vector<Value> LogSigmoidBackward(LowerCtx& c) {
  Builder& b = c.b;
  ET ct = CT(c);
  Value g = In(c, 0, ct), x = In(c, 1, ct);
  Value z = b.Unary("exponential", b.Unary("negate", b.Unary("abs", x)));
  Value neg = LT(b, x, b.Zeros(x.type));
  Value md = b.Select(neg, S(b, x, 1), b.Zeros(x.type));
  Value sign = b.Select(neg, S(b, x, 1), S(b, x, -1));
  return {b.Mul(g, b.Sub(md, b.Mul(sign, b.Div(z, b.Add(z, S(b, z, 1))))))};
}
TT_LOWERINGS(({"aten::log_sigmoid_backward", "aten::log_sigmoid_backward.grad_input"}), LogSigmoidBackward);

// ---- glu: a * sigmoid(b) over halves of dim ----
std::pair<Value, Value> Halves(Builder& b, Value x, int64_t d) {
  int64_t h = x.dims()[d] / 2;
  return {b.SliceDim(x, d, 0, h), b.SliceDim(x, d, h, 2 * h)};
}
std::vector<Value> Glu(LowerCtx& c) {
  Builder& b = c.b;
  Value x = Cast(b, c.t(0), CT(c));
  int64_t d = NormDim(c.i64(1), x.rank());
  auto [h1, h2] = Halves(b, x, d);
  return {b.Mul(h1, b.Unary("logistic", h2))};
}
TT_LOWERINGS(({"aten::glu", "aten::glu.out"}), Glu);

std::vector<Value> GluBackward(LowerCtx& c) {
  Builder& b = c.b;
  ET ct = CT(c);
  Value x = Cast(b, c.t(1), ct);
  int64_t d = NormDim(c.i64(2), x.rank());
  auto [h1, h2] = Halves(b, x, d);
  Value g = Cast(b, c.t(0), ct);
  Value s = b.Unary("logistic", h2);
  Value ga = b.Mul(g, s);
  Value gb = b.Mul(b.Mul(ga, h1), b.Sub(S(b, s, 1), s));
  return {b.Concat({ga, gb}, d)};
}
TT_LOWERINGS(({"aten::glu_backward", "aten::glu_backward.grad_input"}), GluBackward);

// Sum v (broadcast shape) down to `to` (numpy broadcasting in reverse).
Value SumTo(Builder& b, Value v, const Dims& to) {
  if (v.dims() == to) return v;
  int lead = v.rank() - (int)to.size();
  Dims red;
  for (int i = 0; i < v.rank(); ++i)
    if (i < lead || (to[i - lead] == 1 && v.dims()[i] != 1)) red.push_back(i);
  Value s = SumDims(b, v, red, false, v.et());
  return b.Reshape(s, to);
}

// ---- prelu: x > 0 ? x : w * x (w broadcasts against x) ----
std::vector<Value> Prelu(LowerCtx& c) {
  Builder& b = c.b;
  ET ct = CT(c);
  Value x = In(c, 0, ct), w = In(c, 1, ct);
  return {b.Select(GT(b, x, b.Zeros(x.type)), x, b.Mul(w, x))};
}
TT_LOWERINGS(({"aten::_prelu_kernel"}), Prelu);

std::vector<Value> PreluBackward(LowerCtx& c) {
  Builder& b = c.b;
  ET ct = ComputeType(c.out(0).et);
  Dims d = c.out(0).dims;
  if (c.out(1).dims.size() > d.size()) d = c.out(1).dims;
  // the broadcast shape of grad, self and weight
  for (size_t k : {0, 1, 2}) {
    Dims e = c.t(k).dims();
    if (e.size() > d.size()) d.insert(d.begin(), e.size() - d.size(), 1);
    for (size_t i = 0; i < e.size(); ++i) {
      int64_t& t = d[d.size() - e.size() + i];
      if (t == 1) t = e[i];
    }
  }
  Value g = Bcast(b, c.t(0), d, ct), x = Bcast(b, c.t(1), d, ct), w = Bcast(b, c.t(2), d, ct);
  Value pos = GT(b, x, b.Zeros(x.type));
  Value gi = b.Select(pos, g, b.Mul(w, g));
  Value gw = b.Select(pos, b.Zeros(g.type), b.Mul(x, g));
  return {SumTo(b, gi, c.out(0).dims), SumTo(b, gw, c.out(1).dims)};
}
TT_LOWERINGS(({"aten::_prelu_kernel_backward"}), PreluBackward);

// ---- softshrink / hardshrink ----
std::vector<Value> Softshrink(LowerCtx& c) {
  Builder& b = c.b;
  ET ct = CT(c);
  Value x = In(c, 0, ct), l = In(c, 1, ct);
  Value nl = b.Unary("negate", l);
  Value y = b.Select(GT(b, x, l), b.Sub(x, l), b.Select(LT(b, x, nl), b.Add(x, l), b.Zeros(x.type)));
  // NaN stays NaN
  return {b.Select(b.Compare(x, x, "NE"), x, y)};
}
TT_LOWERINGS(({"aten::softshrink", "aten::softshrink.out"}), Softshrink);

std::vector<Value> Hardshrink(LowerCtx& c) {
  Builder& b = c.b;
  ET ct = CT(c);
  Value x = In(c, 0, ct), l = In(c, 1, ct);
  Value in = And(b, GE(b, x, b.Unary("negate", l)), LE(b, x, l));
  return {b.Select(in, b.Zeros(x.type), x)};
}
TT_LOWERINGS(({"aten::hardshrink", "aten::hardshrink.out"}), Hardshrink);

std::vector<Value> ShrinkBackward(LowerCtx& c) {
  Builder& b = c.b;
  ET ct = CT(c);
  Value g = In(c, 0, ct), x = In(c, 1, ct), l = In(c, 2, ct);
  Value in = And(b, GE(b, x, b.Unary("negate", l)), LE(b, x, l));
  return {b.Select(in, b.Zeros(g.type), g)};
}
TT_LOWERINGS(({"aten::softshrink_backward", "aten::softshrink_backward.grad_input",
               "aten::hardshrink_backward", "aten::hardshrink_backward.grad_input"}), ShrinkBackward);

// ---- threshold: x <= th ? value : x ----
std::vector<Value> Threshold(LowerCtx& c) {
  Builder& b = c.b;
  ET ct = CT(c);
  ET xt = PromoteET(c.t(0).et(), ct);
  Value x = Bcast(b, c.t(0), c.out().dims, xt), th = Bcast(b, c.t(1), c.out().dims, xt);
  return {b.Select(LE(b, x, th), In(c, 2, ct), Cast(b, x, ct))};
}
TT_LOWERINGS(({"aten::threshold", "aten::threshold_", "aten::threshold.out"}), Threshold);

// ---- rrelu_with_noise: training draws slopes in [lower, upper) for x <= 0
// and writes them to noise (1 elsewhere); eval is leaky_relu((l+u)/2) ----
Value UniformUnit(LowerCtx& c, const Dims& dims) {
  int64_t n = 1;
  for (auto d : dims) n *= d;
  Value key = c.rng_key();
  key = c.b.Mul(key, c.b.Constant(Type(ET::U64, {2}), "[1, 4]"));
  auto r = c.b.Op("stablehlo.rng_bit_generator", {key}, {key.type, Type(ET::U32, {std::max<int64_t>(n, 1)})},
                  "rng_algorithm = #stablehlo<rng_algorithm THREE_FRY>");
  Value bits = r[1];
  Value s = c.b.Binary("shift_right_logical", bits, c.b.Splat(bits.type, 9));
  Value m = c.b.Binary("or", s, c.b.Splat(bits.type, 1065353216.0));  // 0x3F800000
  Value f = c.b.BitcastConvert(m, bits.type.with_et(ET::F32));
  f = c.b.Sub(f, c.b.Splat(f.type, 1.0));
  if (n == 0) f = c.b.Slice(f, {0}, {0}, {1});
  return c.b.Reshape(f, dims);
}

std::vector<Value> RreluWithNoise(LowerCtx& c) {
  Builder& b = c.b;
  ET ct = CT(c);
  Value x = In(c, 0, ct), lo = In(c, 2, ct), hi = In(c, 3, ct);
  bool training = c.flag(4);
  Value pos = GT(b, x, b.Zeros(x.type));  // CPU: x <= 0 uses the random slope
  if (!training) {
    Value slope = b.Div(b.Add(lo, hi), S(b, lo, 2));
    return {b.Select(pos, x, b.Mul(x, slope))};
  }
  Value u = Cast(b, UniformUnit(c, x.dims()), ct);
  Value r = b.Add(lo, b.Mul(u, b.Sub(hi, lo)));
  Value noise = b.Select(pos, S(b, x, 1), r);
  ET nt = c.t(1).et();
  return {b.Mul(x, noise), b.Reshape(Cast(b, noise, nt), c.t(1).dims())};
}
TT_RANDOM_LOWERINGS(({"aten::rrelu_with_noise", "aten::rrelu_with_noise_", "aten::rrelu_with_noise.out"}),
                    RreluWithNoise);

std::vector<Value> RreluWithNoiseBackward(LowerCtx& c) {
  Builder& b = c.b;
  ET ct = CT(c);
  Value g = In(c, 0, ct), x = In(c, 1, ct), lo = In(c, 3, ct), hi = In(c, 4, ct);
  bool training = c.flag(5);
  double l = c.arg(3).hint(), u = c.arg(4).hint();
  if (training && u - l > 1e-6) return {b.Mul(g, In(c, 2, ct))};
  Value slope = b.Div(b.Add(lo, hi), S(b, lo, 2));
  return {b.Select(GT(b, x, b.Zeros(x.type)), g, b.Mul(g, slope))};
}
TT_LOWERINGS(({"aten::rrelu_with_noise_backward", "aten::rrelu_with_noise_backward.out"}),
             RreluWithNoiseBackward);

}  // namespace
}  // namespace tt::ops
