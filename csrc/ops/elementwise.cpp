// Elementwise ops: table-driven unary and binary math, comparisons, where,
// clamp, fill. The output dtype comes from PyTorch's meta kernels; math runs
// in ComputeType(out) (f16/bf16 upcast to f32, as PyTorch's CPU kernels do).
#include <cmath>
#include <cstdlib>
#include <limits>

#include "registry.h"

namespace tt::ops {
namespace {

// ---- unary math: out = f(x) ----
using UnaryFn = Value (*)(Builder&, Value);

#define HLO_UNARY(fname, opname) \
  Value fname(Builder& b, Value x) { return b.Unary(opname, x); }
HLO_UNARY(u_exp, "exponential")
HLO_UNARY(u_expm1, "exponential_minus_one")
HLO_UNARY(u_log, "log")
HLO_UNARY(u_log1p, "log_plus_one")
HLO_UNARY(u_sqrt, "sqrt")
HLO_UNARY(u_rsqrt, "rsqrt")
HLO_UNARY(u_tanh, "tanh")
HLO_UNARY(u_sin, "sine")
HLO_UNARY(u_cos, "cosine")
HLO_UNARY(u_tan, "tan")
HLO_UNARY(u_neg, "negate")
HLO_UNARY(u_sign_f, "sign")
HLO_UNARY(u_logistic, "logistic")
#undef HLO_UNARY

bool IsFP(const Value& x) { return hlo::IsFloat(x.et()) || hlo::IsComplex(x.et()); }
// Rounding ops are the identity on integers (and sign on bools).
Value u_floor(Builder& b, Value x) { return IsFP(x) ? b.Unary("floor", x) : x; }
Value u_ceil(Builder& b, Value x) { return IsFP(x) ? b.Unary("ceil", x) : x; }
Value u_round(Builder& b, Value x) { return IsFP(x) ? b.Unary("round_nearest_even", x) : x; }
Value u_sign(Builder& b, Value x) { return x.et() == ET::PRED ? x : b.Unary("sign", x); }
Value u_abs(Builder& b, Value x) {
  if (hlo::IsComplex(x.et())) return b.Op1("stablehlo.abs", {x}, x.type.with_et(hlo::ComplexPart(x.et())));
  return b.Unary("abs", x);
}

Value One(Builder& b, const Value& x, double v) { return b.Splat(x.type, v); }

Value u_trunc(Builder& b, Value x) {
  if (!IsFP(x)) return x;
  Value fl = b.Unary("floor", x), ce = b.Unary("ceil", x);
  return b.Select(b.Compare(x, b.Zeros(x.type), "LT"), ce, fl);
}
Value u_relu(Builder& b, Value x) { return b.Max(x, b.Zeros(x.type)); }
Value u_reciprocal(Builder& b, Value x) { return b.Div(One(b, x, 1), x); }
Value u_log2(Builder& b, Value x) { return b.Div(b.Unary("log", x), One(b, x, std::log(2.0))); }
Value u_log10(Builder& b, Value x) { return b.Div(b.Unary("log", x), One(b, x, std::log(10.0))); }
Value u_exp2(Builder& b, Value x) { return b.Unary("exponential", b.Mul(x, One(b, x, std::log(2.0)))); }
Value u_square(Builder& b, Value x) { return b.Mul(x, x); }
Value u_silu(Builder& b, Value x) { return b.Mul(x, b.Unary("logistic", x)); }
Value u_erf(Builder& b, Value x) { return b.Op1("chlo.erf", {x}, x.type); }
Value u_erfinv(Builder& b, Value x) { return b.Op1("chlo.erf_inv", {x}, x.type); }
Value u_asin(Builder& b, Value x) { return b.Op1("chlo.asin", {x}, x.type); }
Value u_acos(Builder& b, Value x) { return b.Op1("chlo.acos", {x}, x.type); }
Value u_atan(Builder& b, Value x) { return b.Op1("chlo.atan", {x}, x.type); }
Value u_sinh(Builder& b, Value x) { return b.Op1("chlo.sinh", {x}, x.type); }
Value u_cosh(Builder& b, Value x) { return b.Op1("chlo.cosh", {x}, x.type); }
Value u_asinh(Builder& b, Value x) { return b.Op1("chlo.asinh", {x}, x.type); }
Value u_acosh(Builder& b, Value x) { return b.Op1("chlo.acosh", {x}, x.type); }
Value u_atanh(Builder& b, Value x) { return b.Op1("chlo.atanh", {x}, x.type); }
Value u_lgamma(Builder& b, Value x) { return b.Op1("chlo.lgamma", {x}, x.type); }
// x <= 0 and integral: the poles of digamma / polygamma.
Value NonPosInt(Builder& b, Value x) {
  Value pos = b.Compare(x, b.Splat(x.type, 0.0), "GT");
  Value integral = b.Compare(b.Unary("floor", x), x, "EQ");
  Value z = b.Splat(x.type, 0.0);
  return b.Select(pos, b.Compare(z, z, "NE"), integral);
}
// As CPU: digamma(+-0) = copysign(inf, -x), digamma(negative integer) = nan.
Value u_digamma(Builder& b, Value x) {
  Value d = b.Op1("chlo.digamma", {x}, x.type);
  Value zero = b.Compare(x, b.Splat(x.type, 0.0), "EQ");
  Value pole = b.Select(zero, b.Unary("negate", b.Div(b.Splat(x.type, 1.0), x)), b.Splat(x.type, NAN));
  return b.Select(NonPosInt(b, x), pole, d);
}
// CPU's calc_trigamma (reflection below 0.5, 6 recurrence steps, asymptotic series),
// so the poles give what CPU gives (+inf at 0, huge finite values at negative integers).
Value Trigamma(Builder& b, Value x) {
  auto k = [&](double v) { return b.Splat(x.type, v); };
  Value refl = b.Compare(x, k(0.5), "LT");
  Value s = b.Unary("sine", b.Mul(k(M_PI), x));
  Value res = b.Select(refl, b.Unary("negate", b.Div(k(M_PI * M_PI), b.Mul(s, s))), k(0.0));
  Value sign = b.Select(refl, k(-1.0), k(1.0));
  Value y = b.Select(refl, b.Sub(k(1.0), x), x);
  for (int i = 0; i < 6; ++i) {
    res = b.Add(res, b.Div(k(1.0), b.Mul(y, y)));
    y = b.Add(y, k(1.0));
  }
  Value ixx = b.Div(k(1.0), b.Mul(y, y));
  Value t = b.Sub(k(1.0 / 30), b.Mul(ixx, k(1.0 / 42)));
  t = b.Sub(k(1.0 / 6), b.Mul(ixx, t));
  t = b.Add(b.Add(k(1.0), b.Div(k(1.0), b.Mul(k(2.0), y))), b.Mul(ixx, t));
  res = b.Add(res, b.Div(t, y));
  return b.Mul(sign, res);
}
Value u_mish(Builder& b, Value x) {
  // x * tanh(softplus(x))
  Value sp = b.Unary("log_plus_one", b.Unary("exponential", x));
  Value big = b.Compare(x, One(b, x, 20.0), "GT");
  sp = b.Select(big, x, sp);
  return b.Mul(x, b.Unary("tanh", sp));
}
Value u_hardsigmoid(Builder& b, Value x) {
  Value y = b.Div(b.Add(x, One(b, x, 3)), One(b, x, 6));
  return b.Min(b.Max(y, b.Zeros(x.type)), One(b, x, 1));
}
Value u_hardswish(Builder& b, Value x) { return b.Mul(x, u_hardsigmoid(b, x)); }
Value u_sigmoid(Builder& b, Value x) { return b.Unary("logistic", x); }
Value u_frac(Builder& b, Value x) { return b.Sub(x, u_trunc(b, x)); }
Value u_sgn(Builder& b, Value x) { return u_sign(b, x); }
constexpr double kPi = 3.14159265358979323846;
Value u_sinc(Builder& b, Value x) {
  Value px = b.Mul(x, One(b, x, kPi));
  Value r = b.Div(b.Unary("sine", px), px);
  return b.Select(b.Compare(x, b.Zeros(x.type), "EQ"), One(b, x, 1), r);
}
Value u_erfc(Builder& b, Value x) { return b.Op1("chlo.erfc", {x}, x.type); }
Value u_i1e(Builder& b, Value x) { return b.Op1("chlo.bessel_i1e", {x}, x.type); }
Value u_entr(Builder& b, Value x) {
  Value zero = b.Zeros(x.type);
  Value r = b.Unary("negate", b.Mul(x, b.Unary("log", x)));
  r = b.Select(b.Compare(x, zero, "EQ"), zero, r);
  r = b.Select(b.Compare(x, zero, "LT"), One(b, x, -INFINITY), r);
  return b.Select(b.Compare(x, x, "NE"), x, r);
}
Value u_ndtri(Builder& b, Value x) {
  Value e = b.Op1("chlo.erf_inv", {b.Sub(b.Mul(x, One(b, x, 2)), One(b, x, 1))}, x.type);
  return b.Mul(e, One(b, x, 1.41421356237309504880));
}
Value u_angle(Builder& b, Value x) {
  if (hlo::IsComplex(x.et())) {
    Type rt = x.type.with_et(hlo::ComplexPart(x.et()));
    return b.Binary("atan2", b.Op1("stablehlo.imag", {x}, rt), b.Op1("stablehlo.real", {x}, rt));
  }
  Value r = b.Select(b.Compare(x, b.Zeros(x.type), "LT"), One(b, x, kPi), b.Zeros(x.type));
  return b.Select(b.Compare(x, x, "NE"), x, r);
}


struct UnaryRow {
  std::initializer_list<const char*> names;
  UnaryFn fn;
  bool int_passthrough;  // integer inputs: apply on the integer type (abs, neg, ...)
};

std::vector<Value> LowerUnary(LowerCtx& c, UnaryFn fn, bool int_ok) {
  Value x = c.t(0);
  ET out = c.out().et;
  ET ct = ComputeType(out);
  if (hlo::IsComplex(x.et()) && !hlo::IsComplex(out)) {
    // complex -> real ops (abs, angle): compute on the complex value
    x = Cast(c.b, x, ct == ET::F64 ? ET::C128 : ET::C64);
    return {Cast(c.b, fn(c.b, x), out)};
  }
  if (!int_ok || hlo::IsFloat(out) || hlo::IsComplex(out)) x = Cast(c.b, x, ct);
  else x = Cast(c.b, x, out);
  return {fn(c.b, x)};
}

template <UnaryFn F, bool IntOk>
std::vector<Value> UnaryLowering(LowerCtx& c) {
  return LowerUnary(c, F, IntOk);
}

#define UNARY(base, fn, intok)                                                           \
  TT_LOWERINGS(({"aten::" base, "aten::" base "_", "aten::" base ".out"}),              \
               (UnaryLowering<fn, intok>))
UNARY("exp", u_exp, false);
UNARY("expm1", u_expm1, false);
UNARY("exp2", u_exp2, false);
UNARY("log", u_log, false);
UNARY("log1p", u_log1p, false);
UNARY("log2", u_log2, false);
UNARY("log10", u_log10, false);
UNARY("sqrt", u_sqrt, false);
UNARY("rsqrt", u_rsqrt, false);
UNARY("tanh", u_tanh, false);
UNARY("sin", u_sin, false);
UNARY("cos", u_cos, false);
UNARY("tan", u_tan, false);
UNARY("asin", u_asin, false);
UNARY("acos", u_acos, false);
UNARY("atan", u_atan, false);
UNARY("sinh", u_sinh, false);
UNARY("cosh", u_cosh, false);
UNARY("asinh", u_asinh, false);
UNARY("acosh", u_acosh, false);
UNARY("atanh", u_atanh, false);
UNARY("erf", u_erf, false);
UNARY("erfinv", u_erfinv, false);
UNARY("lgamma", u_lgamma, false);
UNARY("digamma", u_digamma, false);
UNARY("sigmoid", u_sigmoid, false);
UNARY("reciprocal", u_reciprocal, false);
UNARY("abs", u_abs, true);
UNARY("neg", u_neg, true);
UNARY("floor", u_floor, true);
UNARY("ceil", u_ceil, true);
UNARY("trunc", u_trunc, true);
UNARY("frac", u_frac, false);
UNARY("round", u_round, true);
UNARY("sign", u_sign, true);
UNARY("sgn", u_sgn, true);
UNARY("relu", u_relu, true);
UNARY("silu", u_silu, false);
UNARY("mish", u_mish, false);
UNARY("hardswish", u_hardswish, false);
UNARY("hardsigmoid", u_hardsigmoid, false);
UNARY("square", u_square, true);
UNARY("sinc", u_sinc, false);
UNARY("erfc", u_erfc, false);
UNARY("special_i1e", u_i1e, false);
UNARY("special_entr", u_entr, false);
UNARY("special_ndtri", u_ndtri, false);
TT_LOWERINGS(({"aten::angle", "aten::angle.out"}), (UnaryLowering<u_angle, false>));
#undef UNARY

// ---- binary arithmetic ----
using BinaryFn = Value (*)(Builder&, Value, Value);
Value b_add(Builder& b, Value x, Value y) { return x.et() == ET::PRED ? b.Binary("or", x, y) : b.Add(x, y); }
Value b_sub(Builder& b, Value x, Value y) { return b.Sub(x, y); }
Value b_mul(Builder& b, Value x, Value y) { return x.et() == ET::PRED ? b.Binary("and", x, y) : b.Mul(x, y); }
Value b_max(Builder& b, Value x, Value y) {
  if (!hlo::IsFloat(x.et())) return b.Max(x, y);
  // propagate NaN like torch.maximum
  Value r = b.Max(x, y);
  Value nan = b.Compare(x, x, "NE");
  r = b.Select(nan, x, r);
  return b.Select(b.Compare(y, y, "NE"), y, r);
}
Value b_min(Builder& b, Value x, Value y) {
  if (!hlo::IsFloat(x.et())) return b.Min(x, y);
  Value r = b.Min(x, y);
  r = b.Select(b.Compare(x, x, "NE"), x, r);
  return b.Select(b.Compare(y, y, "NE"), y, r);
}
Value b_fmax(Builder& b, Value x, Value y) {
  if (!hlo::IsFloat(x.et())) return b.Max(x, y);
  Value r = b.Max(x, y);
  r = b.Select(b.Compare(x, x, "NE"), y, r);
  return b.Select(b.Compare(y, y, "NE"), x, r);
}
Value b_fmin(Builder& b, Value x, Value y) {
  if (!hlo::IsFloat(x.et())) return b.Min(x, y);
  Value r = b.Min(x, y);
  r = b.Select(b.Compare(x, x, "NE"), y, r);
  return b.Select(b.Compare(y, y, "NE"), x, r);
}
Value b_pow(Builder& b, Value x, Value y) { return b.Binary("power", x, y); }
Value b_atan2(Builder& b, Value x, Value y) { return b.Binary("atan2", x, y); }
Value b_and(Builder& b, Value x, Value y) { return b.Binary("and", x, y); }
Value b_or(Builder& b, Value x, Value y) { return b.Binary("or", x, y); }
Value b_xor(Builder& b, Value x, Value y) { return b.Binary("xor", x, y); }
Value b_shl(Builder& b, Value x, Value y) { return b.Binary("shift_left", x, y); }
Value b_shr(Builder& b, Value x, Value y) {
  return b.Binary(hlo::IsUnsigned(x.et()) ? "shift_right_logical" : "shift_right_arithmetic", x, y);
}

// Broadcast both operands to the output shape in compute type ct.
std::pair<Value, Value> Operands(LowerCtx& c, size_t i, size_t j, ET ct) {
  const Dims& d = c.out().dims;
  return {Bcast(c.b, c.t(i), d, ct), Bcast(c.b, c.t(j), d, ct)};
}

template <BinaryFn F>
std::vector<Value> BinaryLowering(LowerCtx& c) {
  ET ct = ComputeType(c.out().et);
  auto [x, y] = Operands(c, 0, 1, ct);
  return {F(c.b, x, y)};
}

// add/sub with alpha: x + alpha * y
template <bool Sub>
std::vector<Value> AddLowering(LowerCtx& c) {
  ET ct = ComputeType(c.out().et);
  auto [x, y] = Operands(c, 0, 1, ct);
  if (c.has(2) && c.arg(2).kind == Arg::Scalar) {
    const Arg& al = c.arg(2);
    if (!(al.hint() == 1.0 && !al.scalar_is_complex))
      y = c.b.Mul(y, Bcast(c.b, al.v, y.dims(), ct));
  }
  return {Sub ? c.b.Sub(x, y) : b_add(c.b, x, y)};
}

// true and trunc division ("floor" goes through FloorDiv)
std::vector<Value> DivImpl(LowerCtx& c, const std::string& mode) {
  ET ct = ComputeType(c.out().et);
  auto [x, y] = Operands(c, 0, 1, ct);
  Value q = c.b.Div(x, y);  // integers: truncates toward zero
  if (mode == "trunc" && (hlo::IsFloat(ct) || hlo::IsComplex(ct))) q = u_trunc(c.b, q);
  return {q};
}
// Python-style floor division (ATen's div_floor_floating / div_floor_integer).
Value FloorDiv(Builder& b, Value x, Value y) {
  Value zero = b.Zeros(x.type);
  if (!hlo::IsFloat(x.et())) {
    Value q = b.Div(x, y);  // truncates toward zero
    Value r = b.Binary("remainder", x, y);
    Value adjust = b.Binary("and", b.Compare(r, zero, "NE"),
                            b.Compare(b.Compare(r, zero, "LT"), b.Compare(y, zero, "LT"), "NE"));
    return b.Select(adjust, b.Sub(q, b.Splat(q.type, 1)), q);
  }
  // mod = fmod(x, y); div = (x - mod) / y; if mod != 0 and sign(y) != sign(mod): div -= 1;
  // floordiv = floor(div) (+1 if div - floor(div) > 0.5), copysign(0, x/y) when div == 0;
  // y == 0: x / y.
  Value mod = b.Binary("remainder", x, y);
  Value div = b.Div(b.Sub(x, mod), y);
  Value fix = b.Binary("and", b.Compare(mod, zero, "NE"),
                       b.Compare(b.Compare(y, zero, "LT"), b.Compare(mod, zero, "LT"), "NE"));
  div = b.Select(fix, b.Sub(div, b.Splat(x.type, 1)), div);
  Value fl = b.Unary("floor", div);
  Value up = b.Compare(b.Sub(div, fl), b.Splat(x.type, 0.5), "GT");
  fl = b.Select(up, b.Add(fl, b.Splat(x.type, 1)), fl);
  Value q = b.Div(x, y);
  Value signed_zero = b.Mul(zero, q);  // copysign(0, x / y)
  fl = b.Select(b.Compare(div, zero, "EQ"), signed_zero, fl);
  return b.Select(b.Compare(y, zero, "EQ"), q, fl);
}

std::vector<Value> DivLowering(LowerCtx& c) {
  std::string mode;
  for (size_t i = 2; i < c.args.size(); ++i)
    if (c.arg(i).kind == Arg::String) mode = c.arg(i).s;
  if (mode == "floor") {
    ET ct = ComputeType(c.out().et);
    auto [x, y] = Operands(c, 0, 1, ct);
    return {FloorDiv(c.b, x, y)};
  }
  return DivImpl(c, mode);
}
std::vector<Value> FloorDivide(LowerCtx& c) {
  ET ct = ComputeType(c.out().et);
  auto [x, y] = Operands(c, 0, 1, ct);
  return {FloorDiv(c.b, x, y)};
}

std::vector<Value> RemainderLowering(LowerCtx& c) {
  ET ct = ComputeType(c.out().et);
  auto [x, y] = Operands(c, 0, 1, ct);
  Value r = c.b.Binary("remainder", x, y);  // sign of dividend (fmod)
  Value zero = c.b.Zeros(r.type);
  Value fix = c.b.Binary("and", c.b.Compare(r, zero, "NE"),
                         c.b.Compare(c.b.Compare(r, zero, "LT"), c.b.Compare(y, zero, "LT"), "NE"));
  return {c.b.Select(fix, c.b.Add(r, y), r)};
}

std::vector<Value> FmodLowering(LowerCtx& c) {
  ET ct = ComputeType(c.out().et);
  auto [x, y] = Operands(c, 0, 1, ct);
  return {c.b.Binary("remainder", x, y)};
}

#define BINARY_T(base, fn)                                                                  \
  TT_LOWERINGS(({"aten::" base ".Tensor", "aten::" base "_.Tensor", "aten::" base ".out",   \
                 "aten::" base ".Tensor_out", "aten::" base ".Scalar", "aten::" base "_.Scalar",    \
                 "aten::" base ".Scalar_out"}),                                                      \
               fn)
BINARY_T("add", AddLowering<false>);
BINARY_T("sub", AddLowering<true>);
BINARY_T("mul", BinaryLowering<b_mul>);
BINARY_T("div", DivLowering);
BINARY_T("remainder", RemainderLowering);
BINARY_T("fmod", FmodLowering);
// Bitwise ops exist for integers and bool only: floats raise as CPU/CUDA's
// kernels do (XLA would reject the program with a less helpful message).
template <BinaryFn F>
std::vector<Value> BitwiseLowering(LowerCtx& c) {
  ET et = c.out().et;
  if (hlo::IsFloat(et) || IsComplex(et)) {
    static const std::unordered_map<int, const char*> kNames = {
        {(int)ET::F32, "Float"}, {(int)ET::F64, "Double"}, {(int)ET::F16, "Half"}, {(int)ET::BF16, "BFloat16"},
        {(int)ET::C64, "ComplexFloat"}, {(int)ET::C128, "ComplexDouble"}};
    auto it = kNames.find((int)et);
    std::string base = c.op.substr(6, c.op.find('.') == std::string::npos ? std::string::npos : c.op.find('.') - 6);
    if (!base.empty() && base.back() == '_') base.pop_back();
    c.fail("\"" + base + "\" not implemented for '" + (it == kNames.end() ? hlo::ETName(et) : it->second) + "'");
  }
  return BinaryLowering<F>(c);
}
BINARY_T("bitwise_and", BitwiseLowering<b_and>);
BINARY_T("bitwise_or", BitwiseLowering<b_or>);
BINARY_T("bitwise_xor", BitwiseLowering<b_xor>);
TT_LOWERINGS(({"aten::div.Tensor_mode", "aten::div_.Tensor_mode", "aten::div.out_mode",
               "aten::div.Scalar_mode", "aten::div_.Scalar_mode", "aten::div.Scalar_mode_out"}),
             DivLowering);
TT_LOWERINGS(({"aten::maximum", "aten::maximum.out"}), BinaryLowering<b_max>);
TT_LOWERINGS(({"aten::minimum", "aten::minimum.out"}), BinaryLowering<b_min>);
TT_LOWERINGS(({"aten::fmax", "aten::fmax.out"}), BinaryLowering<b_fmax>);
TT_LOWERINGS(({"aten::fmin", "aten::fmin.out"}), BinaryLowering<b_fmin>);
TT_LOWERINGS(({"aten::atan2", "aten::atan2_", "aten::atan2.out"}), BinaryLowering<b_atan2>);
TT_LOWERINGS(({"aten::pow.Tensor_Tensor", "aten::pow_.Tensor", "aten::pow.Tensor_Tensor_out",
               "aten::pow.Tensor_Scalar", "aten::pow_.Scalar", "aten::pow.Tensor_Scalar_out"}),
             BinaryLowering<b_pow>);
TT_LOWERINGS(({"aten::bitwise_left_shift.Tensor", "aten::bitwise_left_shift_.Tensor",
               "aten::bitwise_left_shift.Tensor_out", "aten::__lshift__.Tensor", "aten::__lshift__.Scalar",
               "aten::__lshift__.Tensor_out", "aten::__lshift__.Scalar_out", "aten::__ilshift__.Tensor",
               "aten::__ilshift__.Scalar"}), BinaryLowering<b_shl>);
TT_LOWERINGS(({"aten::bitwise_right_shift.Tensor", "aten::bitwise_right_shift_.Tensor",
               "aten::bitwise_right_shift.Tensor_out", "aten::__rshift__.Tensor", "aten::__rshift__.Scalar",
               "aten::__rshift__.Tensor_out", "aten::__rshift__.Scalar_out", "aten::__irshift__.Tensor",
               "aten::__irshift__.Scalar"}), BinaryLowering<b_shr>);
TT_LOWERINGS(({"aten::floor_divide", "aten::floor_divide_.Tensor", "aten::floor_divide.out",
               "aten::floor_divide.Scalar", "aten::floor_divide_.Scalar", "aten::floor_divide.Scalar_out"}),
             FloorDivide);

std::vector<Value> PowScalarBase(LowerCtx& c) {  // pow(Scalar self, Tensor exponent)
  ET ct = ComputeType(c.out().et);
  const Dims& d = c.out().dims;
  return {c.b.Binary("power", Bcast(c.b, c.t(0), d, ct), Bcast(c.b, c.t(1), d, ct))};
}
TT_LOWERINGS(({"aten::pow.Scalar", "aten::pow.Scalar_out"}), PowScalarBase);

// ---- comparisons and logical ops (bool outputs) ----
template <const char* Dir>
std::vector<Value> CompareLowering(LowerCtx& c) {
  ET ct = CommonType(c, {0, 1});
  auto [x, y] = Operands(c, 0, 1, ct);
  return {c.b.Compare(x, y, Dir)};
}
constexpr char kEQ[] = "EQ", kNE[] = "NE", kLT[] = "LT", kLE[] = "LE", kGT[] = "GT", kGE[] = "GE";
#define COMPARE(base, dir) BINARY_T(base, CompareLowering<dir>)
COMPARE("eq", kEQ);
COMPARE("ne", kNE);
COMPARE("lt", kLT);
COMPARE("le", kLE);
COMPARE("gt", kGT);
COMPARE("ge", kGE);
#undef COMPARE

template <BinaryFn F>
std::vector<Value> LogicalLowering(LowerCtx& c) {
  const Dims& d = c.out().dims;
  Value x = Bcast(c.b, c.t(0), d, ET::PRED), y = Bcast(c.b, c.t(1), d, ET::PRED);
  return {F(c.b, x, y)};
}
TT_LOWERINGS(({"aten::logical_and", "aten::logical_and_", "aten::logical_and.out"}), LogicalLowering<b_and>);
TT_LOWERINGS(({"aten::logical_or", "aten::logical_or_", "aten::logical_or.out"}), LogicalLowering<b_or>);
TT_LOWERINGS(({"aten::logical_xor", "aten::logical_xor_", "aten::logical_xor.out"}), LogicalLowering<b_xor>);

std::vector<Value> LogicalNot(LowerCtx& c) {
  Value x = Cast(c.b, c.t(0), ET::PRED);
  return {c.b.Unary("not", x)};
}
TT_LOWERINGS(({"aten::logical_not", "aten::logical_not_", "aten::logical_not.out"}), LogicalNot);

std::vector<Value> BitwiseNot(LowerCtx& c) { return {c.b.Unary("not", Cast(c.b, c.t(0), c.out().et))}; }
TT_LOWERINGS(({"aten::bitwise_not", "aten::bitwise_not_", "aten::bitwise_not.out"}), BitwiseNot);

std::vector<Value> IsNan(LowerCtx& c) {
  Value x = c.t(0);
  if (!hlo::IsFloat(x.et())) return {c.b.Splat(c.out(), 0)};
  return {c.b.Compare(x, x, "NE")};
}
TT_LOWERING("aten::isnan", IsNan);

std::vector<Value> IsFinite(LowerCtx& c) {
  Value x = c.t(0);
  if (!hlo::IsFloat(x.et())) return {c.b.Splat(c.out(), 1)};
  return {c.b.Op1("stablehlo.is_finite", {x}, x.type.with_et(ET::PRED))};
}
TT_LOWERING("aten::isfinite", IsFinite);

// ---- where / clamp / fill / lerp / addcmul ----
std::vector<Value> Where(LowerCtx& c) {
  const Dims& d = c.out().dims;
  ET et = c.out().et;
  return {c.b.Select(Bcast(c.b, c.t(0), d, ET::PRED), Bcast(c.b, c.t(1), d, et), Bcast(c.b, c.t(2), d, et))};
}
TT_LOWERINGS(({"aten::where.self", "aten::where.self_out", "aten::where.ScalarSelf",
               "aten::where.ScalarOther", "aten::where.Scalar"}), Where);

std::vector<Value> Clamp(LowerCtx& c) {
  ET et = c.out().et;
  const Dims& d = c.out().dims;
  ET ct = ComputeType(et);
  Value x = Bcast(c.b, c.t(0), d, ct);
  if (c.has(1)) x = b_max(c.b, x, Bcast(c.b, c.t(1), d, ct));
  if (c.has(2)) x = b_min(c.b, x, Bcast(c.b, c.t(2), d, ct));
  return {x};
}
TT_LOWERINGS(({"aten::clamp", "aten::clamp_", "aten::clamp.out", "aten::clamp.Tensor",
               "aten::clamp_.Tensor", "aten::clamp.Tensor_out"}), Clamp);

std::vector<Value> ClampMin(LowerCtx& c) {
  ET ct = ComputeType(c.out().et);
  auto [x, y] = Operands(c, 0, 1, ct);
  return {b_max(c.b, x, y)};
}
std::vector<Value> ClampMax(LowerCtx& c) {
  ET ct = ComputeType(c.out().et);
  auto [x, y] = Operands(c, 0, 1, ct);
  return {b_min(c.b, x, y)};
}
TT_LOWERINGS(({"aten::clamp_min", "aten::clamp_min_", "aten::clamp_min.out", "aten::clamp_min.Tensor",
               "aten::clamp_min_.Tensor", "aten::clamp_min.Tensor_out"}), ClampMin);
TT_LOWERINGS(({"aten::clamp_max", "aten::clamp_max_", "aten::clamp_max.out", "aten::clamp_max.Tensor",
               "aten::clamp_max_.Tensor", "aten::clamp_max.Tensor_out"}), ClampMax);

// A Scalar fill value the output dtype cannot hold raises, as CPU's
// checked conversion does (torch.full((3,), 300, dtype=torch.int8)).
void CheckFillRange(const LowerCtx& c, const Arg& a, ET et) {
  if (a.kind != Arg::Scalar || a.scalar_is_complex || a.scalar_is_bool || IsBool(et) || IsComplex(et)) return;
  double v = a.hint(), lo = 0, hi = 0;
  switch (et) {
    case ET::S8: lo = -128; hi = 127; break;
    case ET::U8: lo = -255; hi = 255; break;  // unsigned: negatives wrap, as c10 allows
    case ET::S16: lo = -32768; hi = 32767; break;
    case ET::U16: lo = -65535; hi = 65535; break;
    case ET::S32: lo = -2147483648.0; hi = 2147483647.0; break;
    case ET::U32: lo = -4294967295.0; hi = 4294967295.0; break;
    case ET::F16: lo = -65504; hi = 65504; break;
    case ET::BF16: lo = -3.3895313892515355e38; hi = 3.3895313892515355e38; break;
    case ET::F32: lo = -3.4028234663852886e38; hi = 3.4028234663852886e38; break;
    default: return;
  }
  if (std::isfinite(v) && (v < lo || v > hi))
    c.fail(std::string("value cannot be converted to type ") + hlo::ETName(et) + " without overflow");
}

std::vector<Value> Fill(LowerCtx& c) {
  CheckFillRange(c, c.arg(1), c.out().et);
  return {Bcast(c.b, c.t(1), c.out().dims, c.out().et)};
}
TT_LOWERINGS(({"aten::fill_.Scalar", "aten::fill_.Tensor", "aten::fill.Scalar", "aten::fill.Tensor"}), Fill);

std::vector<Value> Zero(LowerCtx& c) { return {c.b.Zeros(c.out())}; }
TT_LOWERING("aten::zero_", Zero);

std::vector<Value> Lerp(LowerCtx& c) {
  ET ct = ComputeType(c.out().et);
  const Dims& d = c.out().dims;
  Value s = Bcast(c.b, c.t(0), d, ct), e = Bcast(c.b, c.t(1), d, ct), w = Bcast(c.b, c.t(2), d, ct);
  return {c.b.Add(s, c.b.Mul(w, c.b.Sub(e, s)))};
}
TT_LOWERINGS(({"aten::lerp.Scalar", "aten::lerp_.Scalar", "aten::lerp.Scalar_out", "aten::lerp.Tensor",
               "aten::lerp_.Tensor", "aten::lerp.Tensor_out"}), Lerp);

template <bool Div>
std::vector<Value> AddcOp(LowerCtx& c) {  // self + value * t1 (*|/) t2
  ET ct = ComputeType(c.out().et);
  const Dims& d = c.out().dims;
  Value s = Bcast(c.b, c.t(0), d, ct), t1 = Bcast(c.b, c.t(1), d, ct), t2 = Bcast(c.b, c.t(2), d, ct);
  Value p = Div ? c.b.Div(t1, t2) : c.b.Mul(t1, t2);
  if (c.has(3)) p = c.b.Mul(p, Bcast(c.b, c.t(3), d, ct));
  return {c.b.Add(s, p)};
}
TT_LOWERINGS(({"aten::addcmul", "aten::addcmul_", "aten::addcmul.out"}), AddcOp<false>);
TT_LOWERINGS(({"aten::addcdiv", "aten::addcdiv_", "aten::addcdiv.out"}), AddcOp<true>);


// ---- more binary math (xlogy, logaddexp, hypot, copysign, ...) ----
Value IsNaN(Builder& b, Value x) { return b.Compare(x, x, "NE"); }
template <bool Log1p>
Value b_xlogy(Builder& b, Value x, Value y) {
  Value l = b.Mul(x, b.Unary(Log1p ? "log_plus_one" : "log", y));
  l = b.Select(b.Compare(x, b.Zeros(x.type), "EQ"), b.Zeros(x.type), l);
  return b.Select(IsNaN(b, y), y, l);
}
template <bool Base2>
Value b_logaddexp(Builder& b, Value x, Value y) {
  Value m = b.Max(x, y);
  Value d = b.Unary("negate", b.Unary("abs", b.Sub(x, y)));
  Value r = Base2 ? b.Add(m, b.Div(b.Unary("log_plus_one", u_exp2(b, d)), One(b, d, std::log(2.0))))
                  : b.Add(m, b.Unary("log_plus_one", b.Unary("exponential", d)));
  Value same_inf = b.Binary("and", b.Compare(x, y, "EQ"),
                            b.Compare(b.Unary("abs", x), One(b, x, INFINITY), "EQ"));
  r = b.Select(same_inf, x, r);
  // NaN in either operand propagates
  r = b.Select(IsNaN(b, x), x, r);
  return b.Select(IsNaN(b, y), y, r);
}
Value b_hypot(Builder& b, Value x, Value y) {
  Value ax = b.Unary("abs", x), ay = b.Unary("abs", y);
  Value m = b.Max(ax, ay), n = b.Min(ax, ay);
  Value q = b.Div(n, m);
  Value r = b.Mul(m, b.Unary("sqrt", b.Add(One(b, q, 1), b.Mul(q, q))));
  r = b.Select(b.Compare(m, b.Zeros(m.type), "EQ"), b.Zeros(m.type), r);
  Value inf = b.Binary("or", b.Compare(ax, One(b, x, INFINITY), "EQ"), b.Compare(ay, One(b, x, INFINITY), "EQ"));
  return b.Select(inf, One(b, x, INFINITY), r);
}
// Sign bit of a float (bool), by bit pattern (-0.0 and -NaN count as negative).
Value SignBit(Builder& b, Value x) {
  if (!hlo::IsFloat(x.et())) return b.Compare(x, b.Zeros(x.type), "LT");
  ET it = hlo::ETBytes(x.et()) == 8 ? ET::S64 : hlo::ETBytes(x.et()) == 4 ? ET::S32 : ET::S16;
  Value bits = b.BitcastConvert(x, x.type.with_et(it));
  return b.Compare(bits, b.Zeros(bits.type), "LT");
}
Value b_copysign(Builder& b, Value x, Value y) {
  Value a = b.Unary("abs", x);
  return b.Select(SignBit(b, y), b.Unary("negate", a), a);
}
Value b_heaviside(Builder& b, Value x, Value v) {
  Value zero = b.Zeros(x.type);
  Value pos = Cast(b, b.Compare(x, zero, "GT"), x.et());
  return b.Select(b.Compare(x, zero, "EQ"), v, pos);
}
Value b_nextafter(Builder& b, Value x, Value y) { return b.Op1("chlo.next_after", {x, y}, x.type); }

TT_LOWERINGS(({"aten::xlogy.Tensor", "aten::xlogy.Scalar_Other", "aten::xlogy.Scalar_Self",
               "aten::xlogy.OutTensor", "aten::xlogy.OutScalar_Self", "aten::xlogy.OutScalar_Other",
               "aten::xlogy_.Tensor", "aten::xlogy_.Scalar_Other"}), BinaryLowering<b_xlogy<false>>);
TT_LOWERINGS(({"aten::special_xlog1py", "aten::special_xlog1py.other_scalar", "aten::special_xlog1py.self_scalar",
               "aten::special_xlog1py.out", "aten::special_xlog1py.self_scalar_out",
               "aten::special_xlog1py.other_scalar_out"}), BinaryLowering<b_xlogy<true>>);
TT_LOWERINGS(({"aten::logaddexp", "aten::logaddexp.out"}), BinaryLowering<b_logaddexp<false>>);
TT_LOWERINGS(({"aten::logaddexp2", "aten::logaddexp2.out"}), BinaryLowering<b_logaddexp<true>>);
TT_LOWERINGS(({"aten::hypot", "aten::hypot_", "aten::hypot.out"}), BinaryLowering<b_hypot>);
TT_LOWERINGS(({"aten::copysign.Tensor", "aten::copysign.Scalar", "aten::copysign.out",
               "aten::copysign.Scalar_out", "aten::copysign_.Tensor", "aten::copysign_.Scalar"}),
             BinaryLowering<b_copysign>);
TT_LOWERINGS(({"aten::heaviside", "aten::heaviside_", "aten::heaviside.out"}), BinaryLowering<b_heaviside>);

// nextafter steps in the output dtype itself (no f32 upcast for bf16/f16)
std::vector<Value> NextAfter(LowerCtx& c) {
  auto [x, y] = Operands(c, 0, 1, c.out().et);
  return {b_nextafter(c.b, x, y)};
}
TT_LOWERINGS(({"aten::nextafter", "aten::nextafter_", "aten::nextafter.out"}), NextAfter);

std::vector<Value> SignBitOp(LowerCtx& c) { return {SignBit(c.b, c.t(0))}; }
TT_LOWERINGS(({"aten::signbit", "aten::signbit.out"}), SignBitOp);

template <bool Pos>
std::vector<Value> IsSignedInf(LowerCtx& c) {
  Value x = c.t(0);
  if (!hlo::IsFloat(x.et())) return {c.b.Splat(c.out(), 0)};
  return {c.b.Compare(x, c.b.Splat(x.type, Pos ? INFINITY : -INFINITY), "EQ")};
}
TT_LOWERINGS(({"aten::isposinf", "aten::isposinf.out"}), IsSignedInf<true>);
TT_LOWERINGS(({"aten::isneginf", "aten::isneginf.out"}), IsSignedInf<false>);

// nan_to_num(x, nan=0, posinf=max, neginf=lowest), in the output dtype
double MaxFinite(ET et) {
  switch (et) {
    case ET::F16: return 65504.0;
    case ET::BF16: return 3.38953138925153547590470800371487866880e38;
    case ET::F64: return std::numeric_limits<double>::max();
    default: return std::numeric_limits<float>::max();
  }
}
std::vector<Value> NanToNum(LowerCtx& c) {
  Builder& b = c.b;
  ET et = c.out().et;
  Value x = Cast(b, c.t(0), et);
  if (!hlo::IsFloat(et)) return {x};
  double mx = MaxFinite(et);
  Value nan = c.has(1) ? b.Splat(x.type, c.f64(1)) : b.Zeros(x.type);
  Value pinf = b.Splat(x.type, c.has(2) ? c.f64(2) : mx);
  Value ninf = b.Splat(x.type, c.has(3) ? c.f64(3) : -mx);
  Value r = b.Select(IsNaN(b, x), nan, x);
  r = b.Select(b.Compare(x, b.Splat(x.type, INFINITY), "EQ"), pinf, r);
  return {b.Select(b.Compare(x, b.Splat(x.type, -INFINITY), "EQ"), ninf, r)};
}
TT_LOWERINGS(({"aten::nan_to_num", "aten::nan_to_num_", "aten::nan_to_num.out"}), NanToNum);

// round(x, decimals): half-to-even at 10^-decimals
std::vector<Value> RoundDecimals(LowerCtx& c) {
  Builder& b = c.b;
  ET ct = ComputeType(c.out().et);
  Value x = Cast(b, c.t(0), ct);
  int64_t d = c.i64(1);
  if (!hlo::IsFloat(ct)) return {x};
  Value p = b.Splat(x.type, std::pow(10.0, (double)std::llabs(d)));
  if (d < 0) return {b.Mul(b.Unary("round_nearest_even", b.Div(x, p)), p)};
  return {b.Div(b.Unary("round_nearest_even", b.Mul(x, p)), p)};
}
TT_LOWERINGS(({"aten::round.decimals", "aten::round_.decimals", "aten::round.decimals_out"}), RoundDecimals);

// logit(x, eps) = log(x / (1 - x)), x clamped to [eps, 1 - eps] when eps is given
std::vector<Value> Logit(LowerCtx& c) {
  Builder& b = c.b;
  ET ct = ComputeType(c.out().et);
  Value x = Cast(b, c.t(0), ct);
  if (c.has(1)) {
    double e = c.f64(1);
    Value lo = b.Splat(x.type, e), hi = b.Splat(x.type, 1.0 - e);
    Value cl = b.Select(b.Compare(x, lo, "LT"), lo, b.Select(b.Compare(x, hi, "GT"), hi, x));
    x = cl;
  }
  return {b.Unary("log", b.Div(x, b.Sub(One(b, x, 1), x)))};
}
TT_LOWERINGS(({"aten::logit", "aten::logit_", "aten::logit.out"}), Logit);

std::vector<Value> LogitBackward(LowerCtx& c) {
  Builder& b = c.b;
  ET ct = ComputeType(c.out().et);
  const Dims& d = c.out().dims;
  Value g = Bcast(b, c.t(0), d, ct), x = Bcast(b, c.t(1), d, ct);
  Value r = b.Div(g, b.Mul(x, b.Sub(One(b, x, 1), x)));
  if (c.has(2)) {
    double e = c.f64(2);
    Value out = b.Binary("or", b.Compare(x, One(b, x, e), "LT"), b.Compare(x, One(b, x, 1.0 - e), "GT"));
    return {b.Select(out, b.Zeros(x.type), r)};
  }
  Value out = b.Binary("or", b.Compare(x, b.Zeros(x.type), "LT"), b.Compare(x, One(b, x, 1), "GT"));
  return {b.Select(out, One(b, x, NAN), r)};
}
TT_LOWERINGS(({"aten::logit_backward", "aten::logit_backward.grad_input"}), LogitBackward);

// polygamma(n, x): n = 0 is digamma
std::vector<Value> Polygamma(LowerCtx& c) {
  Builder& b = c.b;
  ET ot = c.out().et, ct = ComputeType(ot);
  // polygamma(int n, Tensor self) but polygamma_(Tensor self, int n)
  bool inplace = c.op == "aten::polygamma_";
  Value x = Cast(b, c.t(inplace ? 0 : 1), ct);
  int64_t n = c.i64(inplace ? 1 : 0);
  if (n == 0) return {Cast(b, u_digamma(b, x), ot)};
  if (n == 1) return {Cast(b, Trigamma(b, x), ot)};
  // As CPU ((-1)^(n+1) n! zeta(n+1, x)): +-inf at the poles.
  Value p = b.Op1("chlo.polygamma", {b.Splat(x.type, (double)n), x}, x.type);
  p = b.Select(NonPosInt(b, x), b.Splat(x.type, n % 2 ? INFINITY : -INFINITY), p);
  return {Cast(b, p, ot)};
}
TT_LOWERINGS(({"aten::polygamma", "aten::polygamma.out", "aten::polygamma_"}), Polygamma);

// gcd / lcm: Euclid in a while loop until every divisor is zero
Value Gcd(Builder& b, Value x, Value y) {
  x = b.Unary("abs", x);
  y = b.Unary("abs", y);
  Type t = x.type;
  hlo::Region cond, body;
  cond.arg_types = {t, t};
  cond.body = [t](Builder& b, const std::vector<Value>& a) {
    Value nz = b.Compare(a[1], b.Zeros(t), "NE");
    Value any = t.rank() == 0 ? nz : b.Reduce(nz, b.Constant(Type(ET::PRED, {}), "false"), [&] {
      Dims d;
      for (int i = 0; i < t.rank(); ++i) d.push_back(i);
      return d;
    }(), "or");
    return std::vector<Value>{any};
  };
  body.arg_types = {t, t};
  body.body = [t](Builder& b, const std::vector<Value>& a) {
    Value zero = b.Zeros(t);
    Value nz = b.Compare(a[1], zero, "NE");
    Value safe = b.Select(nz, a[1], b.Splat(t, 1));
    Value r = b.Binary("remainder", a[0], safe);
    return std::vector<Value>{b.Select(nz, a[1], a[0]), b.Select(nz, r, zero)};
  };
  return b.Op("stablehlo.while", {x, y}, {t, t}, "", {cond, body})[0];
}
std::vector<Value> GcdOp(LowerCtx& c) {
  auto [x, y] = Operands(c, 0, 1, c.out().et);
  return {Gcd(c.b, x, y)};
}
std::vector<Value> LcmOp(LowerCtx& c) {
  Builder& b = c.b;
  auto [x, y] = Operands(c, 0, 1, c.out().et);
  Value g = Gcd(b, x, y);
  Value zero = b.Zeros(g.type);
  Value safe = b.Select(b.Compare(g, zero, "EQ"), b.Splat(g.type, 1), g);
  Value l = b.Unary("abs", b.Mul(b.Div(x, safe), y));
  return {b.Select(b.Compare(g, zero, "EQ"), zero, l)};
}
TT_LOWERINGS(({"aten::gcd", "aten::gcd_", "aten::gcd.out"}), GcdOp);
TT_LOWERINGS(({"aten::lcm", "aten::lcm_", "aten::lcm.out"}), LcmOp);

// ---- complex construction ----
std::vector<Value> ComplexOp(LowerCtx& c) {
  ET pt = hlo::ComplexPart(c.out().et);
  auto [re, im] = Operands(c, 0, 1, pt);
  return {c.b.Op1("stablehlo.complex", {re, im}, c.out())};
}
TT_LOWERINGS(({"aten::complex", "aten::complex.out"}), ComplexOp);

std::vector<Value> Polar(LowerCtx& c) {
  Builder& b = c.b;
  ET pt = hlo::ComplexPart(c.out().et);
  auto [r, th] = Operands(c, 0, 1, pt);
  Value re = b.Mul(r, b.Unary("cosine", th)), im = b.Mul(r, b.Unary("sine", th));
  return {b.Op1("stablehlo.complex", {re, im}, c.out())};
}
TT_LOWERINGS(({"aten::polar", "aten::polar.out"}), Polar);

std::vector<Value> ConjPhysical(LowerCtx& c) {
  Builder& b = c.b;
  Value x = Cast(b, c.t(0), c.out().et);
  if (!hlo::IsComplex(x.et())) return {x};
  Type rt = x.type.with_et(hlo::ComplexPart(x.et()));
  Value re = b.Op1("stablehlo.real", {x}, rt), im = b.Op1("stablehlo.imag", {x}, rt);
  return {b.Op1("stablehlo.complex", {re, b.Unary("negate", im)}, x.type)};
}
TT_LOWERINGS(({"aten::conj_physical", "aten::conj_physical_", "aten::conj_physical.out"}), ConjPhysical);
// Functionalized graphs (value semantics): the conj view is the conjugated value.
TT_GRAPH_LOWERINGS(({"aten::_conj", "aten::_conj_copy", "aten::conj"}), ConjPhysical);

// mvlgamma(x, p) = sum_{i<p} lgamma(x - i/2) + p(p-1)/4 log(pi)
std::vector<Value> Mvlgamma(LowerCtx& c) {
  Value x = Cast(c.b, c.t(0), ComputeType(c.out().et));
  int64_t p = c.i64(1);
  Value r = c.b.Splat(x.type, (double)p * (double)(p - 1) / 4.0 * std::log(M_PI));
  for (int64_t i = 0; i < p; ++i)
    r = c.b.Add(r, u_lgamma(c.b, c.b.Sub(x, c.b.Splat(x.type, (double)i / 2.0))));
  return {r};
}
TT_LOWERINGS(({"aten::mvlgamma", "aten::mvlgamma_", "aten::mvlgamma.out"}), Mvlgamma);

// rsub(self, other, alpha) = other - alpha * self
std::vector<Value> RSub(LowerCtx& c) {
  ET ct = ComputeType(c.out().et);
  auto [x, y] = Operands(c, 0, 1, ct);
  if (c.has(2)) x = c.b.Mul(x, Bcast(c.b, c.t(2), x.dims(), ct));
  return {c.b.Sub(y, x)};
}
TT_LOWERINGS(({"aten::rsub.Tensor", "aten::rsub.Scalar", "aten::rsub.Tensor_out", "aten::rsub.Scalar_out"}),
             RSub);

}  // namespace
}  // namespace tt::ops
