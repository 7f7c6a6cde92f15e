// Random ops: uniform_, normal_, bernoulli, random_, exponential_, dropout,
// randperm, multinomial. Bits come from stablehlo.rng_bit_generator
// (THREE_FRY) keyed by the tpu generator's (seed, offset): same seed, same
// values; every call advances the offset, so successive calls differ.
#include <cmath>
#include <limits>

#include "registry.h"

namespace tt::ops {
namespace {

// Random bits (u32, or u64 for f64 math) of `n` elements, flat.
// The generator advances its offset by >= numel per call; XLA's THREE_FRY uses
// one 64-bit counter per u64 (half a counter per u32), and we draw at most two
// words per element, so spacing counters by 4 per offset unit never overlaps.
Value RandomBits(LowerCtx& c, ET et, int64_t n) {
  Value key = c.rng_key();
  key = c.b.Mul(key, c.b.Constant(Type(ET::U64, {2}), "[1, 4]"));
  auto r = c.b.Op("stablehlo.rng_bit_generator", {key}, {key.type, Type(et, {n})},
                  "rng_algorithm = #stablehlo<rng_algorithm THREE_FRY>");
  return r[1];
}

ET MathType(ET out) {
  ET ct = ComputeType(out);
  return ct == ET::F64 ? ET::F64 : ET::F32;
}

// Uniform [0, 1) in ft (f32 or f64) from raw bits: mantissa trick.
Value BitsToUnit(Builder& b, Value bits, ET ft) {
  if (ft == ET::F64) {
    Value s = b.Binary("shift_right_logical", bits, b.Splat(bits.type, 12));
    Value m = b.Binary("or", s, b.Splat(bits.type, 4607182418800017408.0));  // 0x3FF0...
    Value f = b.BitcastConvert(m, bits.type.with_et(ET::F64));
    return b.Sub(f, b.Splat(f.type, 1.0));
  }
  Value s = b.Binary("shift_right_logical", bits, b.Splat(bits.type, 9));
  Value m = b.Binary("or", s, b.Splat(bits.type, 1065353216.0));  // 0x3F800000
  Value f = b.BitcastConvert(m, bits.type.with_et(ET::F32));
  return b.Sub(f, b.Splat(f.type, 1.0));
}

// `k` independent uniform [0,1) tensors of shape dims (k * numel draws).
std::vector<Value> Uniforms(LowerCtx& c, ET ft, const Dims& dims, int k = 1) {
  int64_t n = 1;
  for (auto d : dims) n *= d;
  ET bt = ft == ET::F64 ? ET::U64 : ET::U32;
  Value bits = RandomBits(c, bt, std::max<int64_t>(n * k, 1));
  Value u = BitsToUnit(c.b, bits, ft);
  std::vector<Value> out;
  for (int i = 0; i < k; ++i) {
    Value s = c.b.Slice(u, {i * n}, {(i + 1) * n}, {1});
    out.push_back(c.b.Reshape(s, dims));
  }
  return out;
}

// Standard normal via Box-Muller.
Value StdNormal(LowerCtx& c, ET ft, const Dims& dims) {
  auto u = Uniforms(c, ft, dims, 2);
  Builder& b = c.b;
  Value one = b.Splat(u[0].type, 1.0);
  Value r = b.Unary("sqrt", b.Mul(b.Splat(u[0].type, -2.0), b.Unary("log", b.Sub(one, u[0]))));
  Value th = b.Mul(b.Splat(u[1].type, 2.0 * M_PI), u[1]);
  return b.Mul(r, b.Unary("cosine", th));
}

bool Empty(const Type& t) { return t.numel() == 0; }

// Tensor, Scalar or float argument i as a value of type et broadcast to dims.
Value ArgAs(LowerCtx& c, size_t i, const Dims& dims, ET et, double dflt) {
  if (!c.has(i)) return c.b.Splat(Type(et, dims), dflt);
  const Arg& a = c.arg(i);
  if (a.kind == Arg::Tensor || a.kind == Arg::Scalar) return Bcast(c.b, a.v, dims, et);
  return c.b.Splat(Type(et, dims), c.f64(i));
}

// ---- uniform_(self, from, to)
std::vector<Value> UniformL(LowerCtx& c) {
  const Type& o = c.out();
  if (Empty(o)) return {c.b.Zeros(o)};
  ET ft = MathType(o.et);
  Value u = Uniforms(c, ft, o.dims)[0];
  if (o.et == ET::F16 || o.et == ET::BF16) {
    // Keep only the output's mantissa bits so rounding never yields 1.0.
    double scale = o.et == ET::F16 ? 2048.0 : 256.0;
    u = c.b.Div(c.b.Unary("floor", c.b.Mul(u, c.b.Splat(u.type, scale))), c.b.Splat(u.type, scale));
  }
  Value lo = ArgAs(c, 1, o.dims, ft, 0.0), hi = ArgAs(c, 2, o.dims, ft, 1.0);
  return {c.b.Add(lo, c.b.Mul(u, c.b.Sub(hi, lo)))};
}
TT_RANDOM_LOWERINGS(({"aten::uniform_", "aten::uniform", "aten::uniform.out"}), UniformL);

// ---- normal: mean + std * z
std::vector<Value> NormalSelf(LowerCtx& c) {  // normal_(self, mean, std) / normal.out(self, ...)
  const Type& o = c.out();
  if (Empty(o)) return {c.b.Zeros(o)};
  ET ft = MathType(o.et);
  Value z = StdNormal(c, ft, o.dims);
  return {c.b.Add(ArgAs(c, 1, o.dims, ft, 0.0), c.b.Mul(z, ArgAs(c, 2, o.dims, ft, 1.0)))};
}
TT_RANDOM_LOWERINGS(({"aten::normal_", "aten::normal.out", "aten::normal.functional"}), NormalSelf);

std::vector<Value> NormalMeanStd(LowerCtx& c) {  // normal.{Tensor,float}_{Tensor,float}
  const Type& o = c.out();
  if (Empty(o)) return {c.b.Zeros(o)};
  ET ft = MathType(o.et);
  Value z = StdNormal(c, ft, o.dims);
  return {c.b.Add(ArgAs(c, 0, o.dims, ft, 0.0), c.b.Mul(z, ArgAs(c, 1, o.dims, ft, 1.0)))};
}
TT_RANDOM_LOWERINGS(({"aten::normal.Tensor_float", "aten::normal.Tensor_float_out",
                      "aten::normal.float_Tensor", "aten::normal.float_Tensor_out",
                      "aten::normal.Tensor_Tensor", "aten::normal.Tensor_Tensor_out",
                      "aten::normal.float_float", "aten::normal.float_float_out"}),
                    NormalMeanStd);

std::vector<Value> LogNormal(LowerCtx& c) {  // log_normal_(self, mean=1, std=2)
  const Type& o = c.out();
  if (Empty(o)) return {c.b.Zeros(o)};
  ET ft = MathType(o.et);
  Value z = StdNormal(c, ft, o.dims);
  Value x = c.b.Add(ArgAs(c, 1, o.dims, ft, 1.0), c.b.Mul(z, ArgAs(c, 2, o.dims, ft, 2.0)));
  return {c.b.Unary("exponential", x)};
}
TT_RANDOM_LOWERINGS(({"aten::log_normal_"}), LogNormal);

// ---- exponential_(self, lambd): -log(1 - u) / lambd
std::vector<Value> Exponential(LowerCtx& c) {
  const Type& o = c.out();
  if (Empty(o)) return {c.b.Zeros(o)};
  ET ft = MathType(o.et);
  Value u = Uniforms(c, ft, o.dims)[0];
  Value e = c.b.Unary("negate", c.b.Unary("log", c.b.Sub(c.b.Splat(u.type, 1.0), u)));
  return {c.b.Div(e, ArgAs(c, 1, o.dims, ft, 1.0))};
}
TT_RANDOM_LOWERINGS(({"aten::exponential_", "aten::exponential.out"}), Exponential);

// ---- cauchy_(self, median, sigma): median + sigma * tan(pi * (u - 1/2))
std::vector<Value> Cauchy(LowerCtx& c) {
  const Type& o = c.out();
  if (Empty(o)) return {c.b.Zeros(o)};
  ET ft = MathType(o.et);
  Value u = Uniforms(c, ft, o.dims)[0];
  Value t = c.b.Unary("tan", c.b.Mul(c.b.Splat(u.type, M_PI), c.b.Sub(u, c.b.Splat(u.type, 0.5))));
  return {c.b.Add(ArgAs(c, 1, o.dims, ft, 0.0), c.b.Mul(t, ArgAs(c, 2, o.dims, ft, 1.0)))};
}
TT_RANDOM_LOWERINGS(({"aten::cauchy_"}), Cauchy);

// ---- geometric_(self, p): ceil(log(u) / log1p(-p)), u in (0, 1] (CPU's formula)
std::vector<Value> Geometric(LowerCtx& c) {
  const Type& o = c.out();
  if (Empty(o)) return {c.b.Zeros(o)};
  ET ft = hlo::IsFloat(o.et) ? MathType(o.et) : ET::F32;
  Value u = Uniforms(c, ft, o.dims)[0];
  u = c.b.Sub(c.b.Splat(u.type, 1.0), u);  // (0, 1]
  Value lq = c.b.Unary("log_plus_one", c.b.Unary("negate", ArgAs(c, 1, o.dims, ft, 0.5)));
  Value g = c.b.Unary("ceil", c.b.Div(c.b.Unary("log", u), lq));
  return {Cast(c.b, g, o.et)};
}
TT_RANDOM_LOWERINGS(({"aten::geometric_"}), Geometric);

// ---- bernoulli: u < p
std::vector<Value> Bernoulli(LowerCtx& c) {
  const Type& o = c.out();
  if (Empty(o)) return {c.b.Zeros(o)};
  ET ft = MathType(o.et);
  if (c.has(1) && (c.arg(1).kind == Arg::Tensor || c.arg(1).kind == Arg::Scalar))
    ft = MathType(c.t(1).et()) == ET::F64 ? ET::F64 : ft;
  Value p = c.has(1) && c.arg(1).kind != Arg::Other ? ArgAs(c, 1, o.dims, ft, 0.5)
                                                    : Bcast(c.b, c.t(0), o.dims, ft);
  Value u = Uniforms(c, ft, o.dims)[0];
  return {Cast(c.b, c.b.Compare(u, p, "LT"), o.et)};
}
TT_RANDOM_LOWERINGS(({"aten::bernoulli_.float", "aten::bernoulli_.Tensor", "aten::bernoulli",
                      "aten::bernoulli.out", "aten::bernoulli.p", "aten::bernoulli.Tensor",
                      "aten::bernoulli.Tensor_out", "aten::bernoulli.float_out"}),
                    Bernoulli);

// ---- random_: integers uniform in [from, to)
int Digits(ET et) {
  switch (et) {
    case ET::F64: return 53;
    case ET::F32: return 24;
    case ET::F16: return 11;
    case ET::BF16: return 8;
    default: return 0;
  }
}
// Largest value random_ may produce for the type (inclusive).
uint64_t TypeMax(ET et) {
  if (hlo::IsFloat(et)) return 1ull << Digits(et);
  switch (et) {
    case ET::PRED: return 1;
    case ET::S8: return 127;
    case ET::U8: return 255;
    case ET::S16: return 32767;
    case ET::U16: return 65535;
    case ET::S32: return 2147483647ull;
    case ET::U32: return 4294967295ull;
    case ET::S64: return 9223372036854775807ull;
    default: return ~0ull;
  }
}

std::vector<Value> RandomFromTo(LowerCtx& c) {
  const Type& o = c.out();
  if (Empty(o)) return {c.b.Zeros(o)};
  int64_t from = 0;
  uint64_t range;  // number of values; 0 means 2^64
  const std::string& op = c.op;
  if (op == "aten::random_.from" || op == "aten::random.from" || op == "aten::random.from_out") {
    from = c.i64(1);
    if (c.has(2)) range = (uint64_t)(c.i64(2) - from);
    else range = TypeMax(o.et) - (uint64_t)from + 1;
  } else if (op == "aten::random_.to" || op == "aten::random.to" || op == "aten::random.to_out") {
    range = (uint64_t)c.i64(1);
  } else {
    range = TypeMax(o.et) + 1;
  }
  int64_t n = o.numel();
  Builder& b = c.b;
  Value r;
  if (range != 0 && range <= (1ull << 32)) {
    Value bits = RandomBits(c, ET::U32, n);
    if (range != (1ull << 32)) bits = b.Binary("remainder", bits, b.Splat(bits.type, (double)range));
    r = b.Convert(bits, ET::S64);
  } else {
    Value bits = RandomBits(c, ET::U64, n);
    if (range != 0) {
      char lit[32];
      std::snprintf(lit, sizeof lit, "%llu", (unsigned long long)range);
      bits = b.Binary("remainder", bits, b.Constant(bits.type, lit));
    }
    r = b.BitcastConvert(bits, bits.type.with_et(ET::S64));
  }
  if (from != 0) {
    char lit[32];
    std::snprintf(lit, sizeof lit, "%lld", (long long)from);
    r = b.Add(r, b.Constant(r.type, lit));
  }
  return {b.Reshape(b.Convert(r, o.et), o.dims)};
}
TT_RANDOM_LOWERINGS(({"aten::random_", "aten::random_.to", "aten::random_.from", "aten::random",
                      "aten::random.to", "aten::random.from", "aten::random.out",
                      "aten::random.to_out", "aten::random.from_out"}),
                    RandomFromTo);

// ---- dropout
std::vector<Value> NativeDropout(LowerCtx& c) {
  const Type& o = c.out(0);
  Value x = c.t(0);
  double p = c.f64(1);
  bool train = !c.has(2) || c.flag(2);
  if (!train || Empty(o)) return {x, c.b.Splat(c.out(1), 1)};
  ET ft = MathType(o.et);
  Value u = Uniforms(c, ft, o.dims)[0];
  Value keep = c.b.Compare(u, c.b.Splat(u.type, 1.0 - p), "LT");
  double scale = p >= 1.0 ? 0.0 : 1.0 / (1.0 - p);
  ET ct = ComputeType(o.et);
  Value xc = Cast(c.b, x, ct);
  Value y = c.b.Mul(c.b.Select(keep, xc, c.b.Zeros(xc.type)), c.b.Splat(xc.type, scale));
  return {y, keep};
}
TT_RANDOM_LOWERINGS(({"aten::native_dropout", "aten::native_dropout.out"}), NativeDropout);

std::vector<Value> NativeDropoutBackward(LowerCtx& c) {
  const Type& o = c.out();
  ET ct = ComputeType(o.et);
  Value g = Cast(c.b, c.t(0), ct);
  Value m = Bcast(c.b, c.t(1), o.dims, ET::PRED);
  Value y = c.b.Select(m, g, c.b.Zeros(g.type));
  return {c.b.Mul(y, c.b.Splat(g.type, c.f64(2)))};
}
TT_LOWERINGS(({"aten::native_dropout_backward", "aten::native_dropout_backward.out"}),
             NativeDropoutBackward);

// ---- sort helper: sorts `keys` along `dim`, carrying `payload`.
std::vector<Value> SortPairs(Builder& b, Value keys, Value payload, int64_t dim, bool descending) {
  hlo::Region reg;
  reg.arg_types = {Type(keys.et(), {}), Type(keys.et(), {}), Type(payload.et(), {}),
                   Type(payload.et(), {})};
  reg.body = [descending](Builder& bb, const std::vector<Value>& a) {
    return std::vector<Value>{bb.Compare(a[0], a[1], descending ? "GT" : "LT")};
  };
  return b.Op("stablehlo.sort", {keys, payload}, {keys.type, payload.type},
              "dimension = " + std::to_string(dim) + " : i64, is_stable = true", {reg});
}

// ---- randperm(n): argsort of random 64-bit keys
std::vector<Value> Randperm(LowerCtx& c) {
  const Type& o = c.out();
  int64_t n = o.numel();
  if (n == 0) return {c.b.Zeros(o)};
  Value keys = RandomBits(c, ET::U64, n);
  Value idx = c.b.Iota(Type(ET::S64, {n}), 0);
  Value perm = SortPairs(c.b, keys, idx, 0, false)[1];
  return {c.b.Convert(perm, o.et)};
}
TT_RANDOM_LOWERINGS(({"aten::randperm", "aten::randperm.generator", "aten::randperm.out",
                      "aten::randperm.generator_out"}),
                    Randperm);

// ---- multinomial(self [n] or [b, n], k, replacement)
std::vector<Value> Multinomial(LowerCtx& c) {
  const Type& o = c.out();
  if (Empty(o)) return {c.b.Zeros(o)};
  Builder& b = c.b;
  Value p = c.t(0);
  bool vec = p.rank() == 1;
  ET ft = MathType(p.et());
  p = Cast(b, p, ft);
  if (vec) p = b.Reshape(p, {1, p.dims()[0]});
  int64_t rows = p.dims()[0], n = p.dims()[1];
  int64_t k = c.i64(1);
  bool repl = c.flag(2);
  Value idx;
  if (!repl) {
    // Exponential race: the k largest p_i / E_i are a sample without replacement.
    Value u = Uniforms(c, ft, {rows, n})[0];
    Value e = b.Unary("negate", b.Unary("log", b.Sub(b.Splat(u.type, 1.0), u)));
    Value key = b.Div(p, e);
    Value iota = b.Iota(Type(ET::S64, {rows, n}), 1);
    Value sorted = SortPairs(b, key, iota, 1, true)[1];
    idx = b.Slice(sorted, {0, 0}, {rows, k}, {1, 1});
  } else {
    // Inverse CDF: index = #{j : cdf_j <= u * total}.
    Value ii = b.Iota(Type(ET::S32, {n, n}), 0), jj = b.Iota(Type(ET::S32, {n, n}), 1);
    Value tri = b.Convert(b.Compare(ii, jj, "LE"), ft);  // tri[i, j] = i <= j
    Value cdf = b.DotGeneral(p, tri, {}, {}, {1}, {0}, Type(ft, {rows, n}), Builder::Prec::kExact);
    Value total = b.Slice(cdf, {0, n - 1}, {rows, n}, {1, 1});  // [rows, 1]
    Value u = Uniforms(c, ft, {rows, k})[0];
    Value t = b.Mul(u, b.Broadcast(b.Reshape(total, {rows}), {rows, k}, {0}));
    Value cdf3 = b.Broadcast(cdf, {rows, k, n}, {0, 2});
    Value t3 = b.Broadcast(t, {rows, k, n}, {0, 1});
    Value le = b.Convert(b.Compare(cdf3, t3, "LE"), ET::S64);
    Value cnt = b.Reduce(le, b.Zeros(Type(ET::S64, {})), {2}, "add");
    idx = b.Min(cnt, b.Splat(cnt.type, (double)(n - 1)));
  }
  if (vec) idx = b.Reshape(idx, {k});
  return {b.Convert(idx, o.et)};
}
TT_RANDOM_LOWERINGS(({"aten::multinomial", "aten::multinomial.out"}), Multinomial);

}  // namespace
}  // namespace tt::ops
