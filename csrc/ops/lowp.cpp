// Low-precision floats (float8_*, float4_e2m1fn_x2): casts with PyTorch's
// semantics, and the block-scaled matmuls (torch._scaled_mm, _scaled_mm_v2,
// torchtpu::block_scaled_mm).
//
// Casts. c10 defines every 8-bit float by its conversions to and from float32
// (double, half, bfloat16 and integers go through float), so a cast touching
// one of them goes through f32 here too. XLA's `convert` already rounds to
// nearest even; where PyTorch differs from it we fix it up:
//   * float8_e4m3fn saturates: finite overflow and ±inf become ±448 (XLA: NaN);
//   * float8_e8m0fnu ignores the sign and rounds the exponent up when the
//     mantissa's top bit is set (c10's fp8e8m0fnu_from_fp32_value), 0 is
//     2^-127 and 0xff is NaN: built from the bits.
//   * float8_e5m2's NaN is 0x7f/0xff by the sign (XLA: 0x7e, unsigned).
// float8_e5m2 overflow (-> inf) and the fnuz types (overflow -> NaN 0x80) are
// XLA's convert as is; tests/test_lowp.py checks every bit pattern and a
// dense grid of floats against CPU PyTorch.
#include "lowp.h"

#include <optional>
#include <string>

namespace tt::ops {

bool IsLowpFloat(ET t) {
  switch (t) {
    case ET::F8E4M3FN: case ET::F8E5M2: case ET::F8E8M0FNU: case ET::F4E2M1FN:
    case ET::F8E4M3FNUZ: case ET::F8E5M2FNUZ:
      return true;
    default: return false;
  }
}

static Value U32(Builder& b, const Dims& d, double v) { return b.Splat(Type(ET::U32, d), v); }

// float8_e8m0fnu bits (as u32) -> f32, exactly c10's operator float().
Value E8M0ToF32(Builder& b, Value bits_u32) {
  const Dims& d = bits_u32.dims();
  Value pow2 = b.Binary("shift_left", bits_u32, U32(b, d, 23));
  Value r = b.Select(b.Compare(bits_u32, U32(b, d, 0), "EQ"), U32(b, d, 0x00400000), pow2);
  r = b.Select(b.Compare(bits_u32, U32(b, d, 255), "EQ"), U32(b, d, 0x7f800001), r);
  return b.BitcastConvert(r, Type(ET::F32, d));
}

// f32 -> float8_e8m0fnu bits (as u32): c10's fp8e8m0fnu_from_fp32_value.
static Value F32ToE8M0Bits(Builder& b, Value f) {
  const Dims& d = f.dims();
  Value u = b.BitcastConvert(f, Type(ET::U32, d));
  Value e = b.Binary("and", b.Binary("shift_right_logical", u, U32(b, d, 23)), U32(b, d, 255));
  auto nz = [&](double mask) {
    return b.Compare(b.Binary("and", u, U32(b, d, mask)), U32(b, d, 0), "NE");
  };
  Value g = nz(0x400000), rs = nz(0x3FFFFF), lsb = b.Compare(e, U32(b, d, 0), "GT");
  Value up = b.Binary("and", g, b.Binary("or", rs, lsb));
  up = b.Binary("and", up, b.Compare(e, U32(b, d, 255), "NE"));  // inf/NaN stay 0xff
  return b.Add(e, b.Convert(up, ET::U32));
}

// An exact f32 value of a low-precision float.
static Value LowpToF32(Builder& b, Value v) {
  if (v.et() == ET::F8E8M0FNU) {
    Value bits = b.BitcastConvert(v, v.type.with_et(ET::U8));
    return E8M0ToF32(b, b.Convert(bits, ET::U32));
  }
  return b.Convert(v, ET::F32);
}

static Value F32ToLowp(Builder& b, Value f, ET et) {
  const Dims& d = f.dims();
  if (et == ET::F8E8M0FNU) {
    Value bits = b.Convert(F32ToE8M0Bits(b, f), ET::U8);
    return b.BitcastConvert(bits, Type(et, d));
  }
  if (et == ET::F8E4M3FN) {  // saturate (NaN compares false and stays NaN)
    Value hi = b.Splat(f.type, 448.0), lo = b.Splat(f.type, -448.0);
    f = b.Select(b.Compare(f, hi, "GT"), hi, f);
    f = b.Select(b.Compare(f, lo, "LT"), lo, f);
  }
  Value r = b.Convert(f, et);
  if (et == ET::F8E5M2) {  // NaN: c10 keeps the sign and sets every mantissa bit (XLA: 0x7e)
    Value sign = b.Binary("shift_right_logical", b.BitcastConvert(f, Type(ET::U32, d)), U32(b, d, 24));
    sign = b.Binary("and", sign, U32(b, d, 0x80));
    Value nan = b.Convert(b.Binary("or", sign, U32(b, d, 0x7f)), ET::U8);
    // select on the bytes: XLA:CPU computes f8 ops in a wider float, which
    // would canonicalize the NaN again
    Value rb = b.BitcastConvert(r, Type(ET::U8, d));
    r = b.BitcastConvert(b.Select(b.Compare(f, f, "NE"), nan, rb), Type(et, d));
  }
  return r;
}

Value LowpCast(Builder& b, Value v, ET et) {
  if (v.et() == et) return v;
  if (IsLowpFloat(v.et())) return Cast(b, LowpToF32(b, v), et);
  return F32ToLowp(b, Cast(b, v, ET::F32), et);
}

// ---------------------------------------------------------------- scaled matmuls
//
// Every operand is seen as (rows, K) with K contiguous — a is (M, K), mat2 is
// (K, N) column-major, so its transpose (N, K) — and its scales as a matrix
// (ceil(rows/rb), ceil(K/kb)) of blocks rb x kb. Packed fp4 pairs (bytes here,
// see ToET) hold element 2i in the low nibble and 2i+1 in the high one.
//
// Lowering: scales that span K (tensor-wise, row-wise) multiply the result of
// a native low-precision dot (f8 x f8 -> f32); block scales along K are
// applied to the values first (exact in bf16 for e8m0/e4m3 scales of fp4/fp8
// values, else f32) and the dequantized operands meet in one dot with f32
// accumulation. Then bias, then the output cast.
namespace {

struct Operand {
  Value q;              // (R, K) f8, or (R, K/2) u8 packed fp4
  Value s;              // (R/rb, K/kb) scales
  int64_t rb = 1, kb = 1;
  bool fp4() const { return q.et() == ET::U8; }
  int64_t rows() const { return q.dims()[0]; }
  int64_t k() const { return q.dims()[1] * (fp4() ? 2 : 1); }
  // one scale per row (or one for all rows) spanning all of K: it can multiply the dot's result
  bool spans_k() const {
    int64_t sr = s.dims()[0];
    return kb >= k() && (sr == 1 || (rb == 1 && sr == rows()));
  }
};

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// e2m1 codes (u32, 0..15) -> f32
Value E2M1ToF32(Builder& b, Value n) {
  const Dims& d = n.dims();
  Value e = b.Binary("and", b.Binary("shift_right_logical", n, U32(b, d, 1)), U32(b, d, 3));
  Value m = b.Binary("and", n, U32(b, d, 1));
  Value normal = b.Binary("or", b.Binary("shift_left", b.Add(e, U32(b, d, 126)), U32(b, d, 23)),
                          b.Binary("shift_left", m, U32(b, d, 22)));
  Value sub = b.Mul(m, U32(b, d, 0x3f000000));  // 0 or 0.5
  Value mag = b.Select(b.Compare(e, U32(b, d, 0), "EQ"), sub, normal);
  Value sign = b.Binary("shift_left", b.Binary("and", n, U32(b, d, 8)), U32(b, d, 28));
  return b.BitcastConvert(b.Binary("or", mag, sign), Type(ET::F32, d));
}

// The operand's values in f32, (R, K).
Value Values(Builder& b, const Operand& o) {
  if (!o.fp4()) return LowpToF32(b, o.q);
  int64_t r = o.rows(), h = o.q.dims()[1];
  Value u = b.Convert(o.q, ET::U32);
  Value lo = b.Binary("and", u, U32(b, u.dims(), 15));
  Value hi = b.Binary("shift_right_logical", u, U32(b, u.dims(), 4));
  Value pairs = b.Concat({b.Reshape(lo, {r, h, 1}), b.Reshape(hi, {r, h, 1})}, 2);
  return E2M1ToF32(b, b.Reshape(pairs, {r, 2 * h}));
}

// The scales expanded to (R, K) in f32.
Value ExpandScales(Builder& b, const Operand& o) {
  Value s = LowpToF32(b, o.s);
  if (s.et() != ET::F32) s = Cast(b, s, ET::F32);
  int64_t gr = s.dims()[0], gk = s.dims()[1];
  Value e = b.Broadcast(s, {gr, o.rb, gk, o.kb}, {0, 2});
  e = b.Reshape(e, {gr * o.rb, gk * o.kb});
  return b.Slice(e, {0, 0}, {o.rows(), o.k()}, {1, 1});
}

// Dequantized operand: exact in bf16 when its scales are e8m0/e4m3.
Value Dequant(Builder& b, const Operand& o, ET* et) {
  Value v = b.Mul(Values(b, o), ExpandScales(b, o));
  bool exact_bf16 = o.s.et() == ET::F8E8M0FNU || o.s.et() == ET::F8E4M3FN;
  if (!exact_bf16) *et = ET::F32;
  return v;
}

// a (M, K) x bt (N, K) -> (M, N) f32, times global (0-d f32) when given, plus bias.
Value ScaledDot(LowerCtx& c, const Operand& a, const Operand& bt, std::optional<Value> global,
                std::optional<Value> bias) {
  Builder& b = c.b;
  if (a.k() != bt.k())
    c.fail("self has K = " + std::to_string(a.k()) + " but mat2 has K = " + std::to_string(bt.k()));
  int64_t M = a.rows(), N = bt.rows();
  Type rt(ET::F32, {M, N});
  Value r;
  if (a.spans_k() && bt.spans_k() && !a.fp4() && !bt.fp4()) {
    // native low-precision dot, scales on the result
    Value qa = a.q, qb = bt.q;
    if (qa.et() != qb.et()) qa = Cast(b, qa, ET::BF16), qb = Cast(b, qb, ET::BF16);
    r = b.DotGeneral(qa, qb, {}, {}, {1}, {1}, rt);
    Value sa = b.Reshape(Cast(b, a.s, ET::F32), {a.s.dims()[0]});
    Value sb = b.Reshape(Cast(b, bt.s, ET::F32), {bt.s.dims()[0]});
    sa = sa.dims()[0] == 1 ? b.BroadcastTo(b.Reshape(sa, {}), {M, N}) : b.Broadcast(sa, {M, N}, {0});
    sb = sb.dims()[0] == 1 ? b.BroadcastTo(b.Reshape(sb, {}), {M, N}) : b.Broadcast(sb, {M, N}, {1});
    r = b.Mul(b.Mul(r, sa), sb);
  } else {
    ET et = ET::BF16;
    Value da = Dequant(b, a, &et), db = Dequant(b, bt, &et);
    r = b.DotGeneral(Cast(b, da, et), Cast(b, db, et), {}, {}, {1}, {1}, rt, Builder::Prec::kExact);  // emulates an exact dot
  }
  if (global) r = b.Mul(r, b.BroadcastTo(Cast(b, *global, ET::F32), {M, N}));
  if (bias) r = b.Add(r, b.BroadcastTo(Cast(b, *bias, ET::F32), {M, N}));
  return r;
}

// cuBLAS' blocked scale layout (SWIZZLE_32_4_4: 128x4 tiles stored as
// 32x16) -> the plain (rows, kblocks) matrix.
Value Unswizzle(Builder& b, Value s, int64_t rows, int64_t kblocks) {
  int64_t nr = CeilDiv(rows, 128), nc = CeilDiv(kblocks, 4);
  Value v = b.Reshape(s, {nr, nc, 32, 4, 4});        // [row tile, col tile, r%32, r/32, c%4]
  v = b.Transpose(v, {0, 3, 2, 1, 4});               // [row tile, r/32, r%32, col tile, c%4]
  v = b.Reshape(v, {nr * 128, nc * 4});
  return b.Slice(v, {0, 0}, {rows, kblocks}, {1, 1});
}

void Need(LowerCtx& c, bool ok, const std::string& what) {
  if (!ok) c.fail(what);
}

std::string Shape(const Value& v) {
  std::string s = "(";
  for (size_t i = 0; i < v.dims().size(); ++i) s += (i ? ", " : "") + std::to_string(v.dims()[i]);
  return s + ")";
}

// Block scales of `o` along K of block kb, plain (rows, K/kb) or swizzled.
void BlockScales(LowerCtx& c, Operand& o, Value s, int64_t kb, bool swizzled, const char* name) {
  int64_t kblocks = CeilDiv(o.k(), kb);
  if (swizzled) {
    int64_t want = CeilDiv(o.rows(), 128) * 128 * CeilDiv(kblocks, 4) * 4;
    Need(c, s.type.numel() == want, std::string(name) + ": the swizzled block scales need " +
                                        std::to_string(want) + " elements, got " + Shape(s));
    s = Unswizzle(c.b, c.b.Reshape(s, {s.type.numel()}), o.rows(), kblocks);
  } else {
    Need(c, o.k() % kb == 0, std::string(name) + ": K = " + std::to_string(o.k()) +
                                 " is not a multiple of the block size " + std::to_string(kb));
    Need(c, s.rank() == 2 && s.dims()[0] == o.rows() && s.dims()[1] == kblocks,
         std::string(name) + " must have shape (" + std::to_string(o.rows()) + ", " +
             std::to_string(kblocks) + "), got " + Shape(s));
  }
  o.s = s, o.rb = 1, o.kb = kb;
}

Value Transposed(Builder& b, const Value& mat2) { return b.Transpose(mat2, {1, 0}); }

void SpanK(Operand& o, Value s, int64_t scale_rows) {
  o.s = s;
  o.rb = scale_rows == 1 ? o.rows() : 1;
  o.kb = o.k();
}

std::optional<Value> OptT(LowerCtx& c, size_t i) {
  return c.has(i) ? std::optional<Value>(c.t(i)) : std::nullopt;
}

}  // namespace

// torch._scaled_mm: the scaling is told by the scales' dtypes and shapes
// (the meta kernel has checked them as CUDA does).
std::vector<Value> ScaledMM(LowerCtx& c) {
  Builder& b = c.b;
  Operand a{c.t(0)}, bt{Transposed(b, c.t(1))};
  Value sa = c.t(2), sb = c.t(3);
  int64_t M = a.rows(), N = bt.rows(), K = a.k(), KB = CeilDiv(K, 128);
  auto is = [](const Value& v, int64_t r, int64_t k) {
    return v.rank() == 2 && v.dims()[0] == r && v.dims()[1] == k;
  };
  if (sa.et() == ET::F8E8M0FNU || sa.et() == ET::F8E4M3FN) {  // MX / NVFP4 in cuBLAS' layout
    int64_t kb = sa.et() == ET::F8E8M0FNU ? 32 : 16;
    BlockScales(c, a, sa, kb, true, "scale_a");
    BlockScales(c, bt, sb, kb, true, "scale_b");
  } else if (sa.type.numel() == 1 && sb.type.numel() == 1) {
    SpanK(a, b.Reshape(sa, {1, 1}), 1);
    SpanK(bt, b.Reshape(sb, {1, 1}), 1);
  } else if (is(sa, M, 1) && is(sb, 1, N)) {
    SpanK(a, sa, M);
    SpanK(bt, Transposed(b, sb), N);
  } else if ((is(sa, M, KB) || is(sa, CeilDiv(M, 128), KB)) &&
             (is(sb, KB, N) || is(sb, KB, CeilDiv(N, 128)))) {
    a.s = sa, a.rb = sa.dims()[0] == M ? 1 : 128, a.kb = 128;
    bt.s = Transposed(b, sb), bt.rb = sb.dims()[1] == N ? 1 : 128, bt.kb = 128;
  } else {
    c.fail("unsupported scales: scale_a " + Shape(sa) + ", scale_b " + Shape(sb));
  }
  Value r = ScaledDot(c, a, bt, std::nullopt, OptT(c, 4));
  ET out = c.out().et;
  if (c.has(5) && (out == ET::F8E4M3FN || out == ET::F8E5M2))  // as CPU: result / scale_result
    r = b.Div(r, b.BroadcastTo(Cast(b, c.t(5), ET::F32), r.dims()));
  return {Cast(b, r, out)};
}
TT_LOWERINGS(({"aten::_scaled_mm", "aten::_scaled_mm.out"}), ScaledMM);

// torch._scaled_mm_v2 / torch.nn.functional.scaled_mm: explicit recipes
// (ScalingType: 0 TensorWise, 1 RowWise, 2 BlockWise1x16, 3 BlockWise1x32,
// 4 BlockWise1x128, 5 BlockWise128x128) and swizzles (1: SWIZZLE_32_4_4).
std::vector<Value> ScaledMMv2(LowerCtx& c) {
  Builder& b = c.b;
  Operand a{c.t(0)}, bt{Transposed(b, c.t(1))};
  if (c.has(10)) {
    auto cd = c.ints(10);
    if (!cd.empty() && cd != std::vector<int64_t>{1, 0}) c.fail("contraction_dim must be [] or [1, 0]");
  }
  std::optional<Value> global;
  auto setup = [&](Operand& o, const std::vector<Value>& s, const std::vector<int64_t>& recipe,
                   const std::vector<int64_t>& swizzle, const char* name) {
    Need(c, !s.empty() && s.size() == recipe.size(), std::string(name) + ": one scale per recipe");
    bool swz = !swizzle.empty() && swizzle[0] == 1;
    int64_t R = o.rows();
    switch (recipe[0]) {
      case 0: SpanK(o, b.Reshape(s[0], {1, 1}), 1); break;
      case 1:
        Need(c, s[0].type.numel() == R, std::string(name) + ": row-wise scales need " +
                                             std::to_string(R) + " elements, got " + Shape(s[0]));
        SpanK(o, b.Reshape(s[0], {R, 1}), R);
        break;
      case 2: case 3: BlockScales(c, o, s[0], recipe[0] == 2 ? 16 : 32, swz, name); break;
      case 4: BlockScales(c, o, s[0], 128, false, name); break;
      case 5: {  // (round_up(K/128, 4), R/128), K-blocks first
        int64_t kb = CeilDiv(o.k(), 128), rb = CeilDiv(R, 128);
        Need(c, s[0].rank() == 2 && s[0].dims()[0] >= kb && s[0].dims()[1] == rb,
             std::string(name) + ": 128x128 scales must have shape (" + std::to_string(kb) +
                 " rounded up to 4, " + std::to_string(rb) + "), got " + Shape(s[0]));
        o.s = b.Slice(Transposed(b, s[0]), {0, 0}, {rb, kb}, {1, 1}), o.rb = 128, o.kb = 128;
        break;
      }
      default: c.fail(std::string(name) + ": unknown scaling recipe " + std::to_string(recipe[0]));
    }
    if (recipe.size() == 2) {  // NVFP4's second level: a tensor-wise f32 scale
      Need(c, recipe[1] == 0 && s[1].type.numel() == 1,
           std::string(name) + ": the second scale must be one tensor-wise value");
      Value g = b.Reshape(Cast(b, s[1], ET::F32), {});
      global = global ? b.Mul(*global, g) : g;
    }
  };
  setup(a, c.tl(2), c.ints(3), c.has(4) ? c.ints(4) : std::vector<int64_t>{}, "scale_a");
  setup(bt, c.tl(5), c.ints(6), c.has(7) ? c.ints(7) : std::vector<int64_t>{}, "scale_b");
  return {Cast(b, ScaledDot(c, a, bt, global, OptT(c, 8)), c.out().et)};
}
TT_LOWERINGS(({"aten::_scaled_mm_v2", "aten::_scaled_mm_v2.out"}), ScaledMMv2);

// torchtpu::block_scaled_mm (torchtpu.quant): a (M, K) and b (N, K) —
// fp8, or packed fp4 pairs (M, K/2) / (N, K/2) — with plain block scales
// (M, K/block) and (N, K/block), an optional f32 global scale; a @ b.T.
std::vector<Value> BlockScaledMM(LowerCtx& c) {
  Operand a{c.t(0)}, bt{c.t(2)};
  int64_t block = c.i64(5);
  BlockScales(c, a, c.t(1), block, false, "a_scale");
  BlockScales(c, bt, c.t(3), block, false, "b_scale");
  std::optional<Value> g;
  if (c.has(4)) g = c.b.Reshape(Cast(c.b, c.t(4), ET::F32), {});
  return {Cast(c.b, ScaledDot(c, a, bt, g, std::nullopt), c.out().et)};
}
TT_LOWERINGS(({"torchtpu::block_scaled_mm"}), BlockScaledMM);

}  // namespace tt::ops
