// FFTs: aten::_fft_c2c, _fft_r2c, _fft_c2r (and their .out forms), which
// every torch.fft.* function (fft, ifft, rfft, irfft, hfft, fftn, stft, ...)
// and their autograd formulas reduce to, lowered to stablehlo.fft.
//
// stablehlo.fft transforms the trailing fft_length dims (at most 3): a `dim`
// list is done in groups of up to 3 dims, each transposed to the end and
// back. XLA's IFFT/IRFFT divide by n; torch's c2c (forward=false) and c2r are
// unnormalized, so one scale at the end turns XLA's result into torch's
// `normalization` (0: none, 1: 1/sqrt(n), 2: 1/n; n = the product of the
// signal sizes: the input's for c2c/r2c, the output's for c2r).
#include <cmath>

#include "registry.h"

namespace tt::ops {
namespace {

// The dims (as given, normalized), rejecting duplicates and empty lists.
Dims FftDims(const LowerCtx& c, size_t i, int rank, bool allow_empty = false) {
  std::vector<int64_t> raw = c.ints(i);
  if (raw.empty() && !allow_empty) c.fail("expected at least one dimension to transform");
  if (rank == 0 && !raw.empty()) c.fail("expected a tensor with at least one dimension, got a 0-d tensor");
  Dims ds;
  for (int64_t d : raw) {
    int64_t n = NormDim(d, rank);
    for (int64_t e : ds)
      if (e == n) c.fail("dim " + std::to_string(d) + " appears more than once in the dim list");
    ds.push_back(n);
  }
  return ds;
}

void CheckDtype(const LowerCtx& c, ET et, bool complex, const char* what) {
  bool ok = complex ? (et == ET::C64 || et == ET::C128) : (et == ET::F32 || et == ET::F64);
  if (!ok)
    c.fail(std::string("tpu FFTs support ") + (complex ? "complex64/complex128" : "float32/float64") + " " +
           what + ", got " + hlo::ETName(et));
  if (c.b.tpu_target() && (et == ET::C128 || et == ET::F64))
    c.fail(std::string("a ") + (complex ? "complex128" : "float64") + " " + what +
           " does not compile for TPU (XLA's TPU FFT takes float32/complex64 only): convert it with .to(" +
           (complex ? "torch.complex64" : "torch.float32") + ") or run this FFT on the CPU");
}

// stablehlo.fft of `type` over `group` (dims of x, in order; at most 3):
// the group is transposed to the trailing dims and back. `fft_len` are the
// signal sizes (for IRFFT the real output's), `out_et` the result's dtype.
Value FftGroup(Builder& b, Value x, const Dims& group, const char* type, const Dims& fft_len, ET out_et) {
  int r = x.rank();
  Dims perm;
  for (int64_t d = 0; d < r; ++d) {
    bool in = false;
    for (int64_t g : group) in |= g == d;
    if (!in) perm.push_back(d);
  }
  for (int64_t g : group) perm.push_back(g);
  bool ident = true;
  for (int64_t i = 0; i < r; ++i) ident &= perm[i] == i;
  if (!ident) x = b.Transpose(x, perm);
  Dims od = x.dims();
  std::string t = type;
  if (t == "RFFT") od.back() = fft_len.back() / 2 + 1;
  if (t == "IRFFT") od.back() = fft_len.back();
  Value y = b.Op1("stablehlo.fft", {x}, Type(out_et, od),
                  "fft_type = #stablehlo<fft_type " + t + ">, fft_length = " + hlo::I64Array(fft_len));
  if (ident) return y;
  Dims inv(r);
  for (int64_t i = 0; i < r; ++i) inv[perm[i]] = i;
  return b.Transpose(y, inv);
}

// XLA's result times `s` (skipped when 1).
Value Scale(Builder& b, Value y, double s) {
  if (s == 1.0) return y;
  return b.Mul(y, b.Splat(y.type, s));
}

// torch's scale for `normalization` relative to XLA's (unnormalized forward,
// 1/n inverse).
double NormScale(const LowerCtx& c, int64_t norm, double n, bool xla_inverse) {
  double s;
  switch (norm) {
    case 0: s = 1.0; break;
    case 1: s = 1.0 / std::sqrt(n); break;
    case 2: s = 1.0 / n; break;
    default: c.fail("invalid normalization mode " + std::to_string(norm) + " (expected 0, 1 or 2)");
  }
  return xla_inverse ? s * n : s;
}

// c2c over `dims` (any number), forward or inverse (XLA-normalized).
Value C2C(Builder& b, Value x, const Dims& dims, bool forward) {
  for (size_t hi = dims.size(); hi > 0;) {
    size_t lo = hi >= 3 ? hi - 3 : 0;
    Dims g(dims.begin() + lo, dims.begin() + hi), len;
    for (int64_t d : g) len.push_back(x.dims()[d]);
    x = FftGroup(b, x, g, forward ? "FFT" : "IFFT", len, x.et());
    hi = lo;
  }
  return x;
}

double SignalSize(const Dims& shape, const Dims& dims) {
  double n = 1;
  for (int64_t d : dims) n *= (double)shape[d];
  return n;
}

// _fft_c2c(Tensor self, SymInt[] dim, int normalization, bool forward)
std::vector<Value> FftC2C(LowerCtx& c) {
  Builder& b = c.b;
  const Type& o = c.out();
  Value x = c.t(0);
  CheckDtype(c, x.et(), true, "input");
  Dims dims = FftDims(c, 1, x.rank(), true);
  int64_t norm = c.i64(2);
  bool forward = c.flag(3);
  double n = SignalSize(x.dims(), dims);
  double s = NormScale(c, norm, n, !forward);
  if (o.numel() == 0) return {b.Zeros(o)};
  return {Cast(b, Scale(b, C2C(b, x, dims, forward), s), o.et)};
}
TT_LOWERINGS(({"aten::_fft_c2c", "aten::_fft_c2c.out"}), FftC2C);

// _fft_r2c(Tensor self, int[] dim, int normalization, bool onesided): the
// last dim of `dim` is the halved one when onesided.
std::vector<Value> FftR2C(LowerCtx& c) {
  Builder& b = c.b;
  const Type& o = c.out();
  Value x = c.t(0);
  CheckDtype(c, x.et(), false, "input");
  CheckDtype(c, o.et, true, "output");
  Dims dims = FftDims(c, 1, x.rank());
  int64_t norm = c.i64(2);
  bool onesided = c.flag(3);
  double n = SignalSize(x.dims(), dims);
  double s = NormScale(c, norm, n, false);
  if (o.numel() == 0) return {b.Zeros(o)};
  ET cet = x.et() == ET::F64 ? ET::C128 : ET::C64;
  Value y;
  if (!onesided) {
    y = C2C(b, b.Convert(x, cet), dims, true);
  } else {
    size_t k = std::min<size_t>(3, dims.size());
    Dims g(dims.end() - k, dims.end()), len, rest(dims.begin(), dims.end() - k);
    for (int64_t d : g) len.push_back(x.dims()[d]);
    y = FftGroup(b, x, g, "RFFT", len, cet);
    y = C2C(b, y, rest, true);
  }
  return {Cast(b, Scale(b, y, s), o.et)};
}
TT_LOWERINGS(({"aten::_fft_r2c", "aten::_fft_r2c.out"}), FftR2C);

// _fft_c2r(Tensor self, int[] dim, int normalization, SymInt last_dim_size):
// the input is the onesided half of a Hermitian spectrum along dim[-1];
// the output has last_dim_size there.
std::vector<Value> FftC2R(LowerCtx& c) {
  Builder& b = c.b;
  const Type& o = c.out();
  Value x = c.t(0);
  CheckDtype(c, x.et(), true, "input");
  CheckDtype(c, o.et, false, "output");
  Dims dims = FftDims(c, 1, x.rank());
  int64_t norm = c.i64(2);
  int64_t last = c.i64(3);
  if (last < 1) c.fail("expected last_dim_size >= 1, got " + std::to_string(last));
  if (o.rank() != x.rank()) c.fail("output rank differs from the input's");
  double n = SignalSize(o.dims, dims);
  double s = NormScale(c, norm, n, true);
  if (o.numel() == 0) return {b.Zeros(o)};
  size_t k = std::min<size_t>(3, dims.size());
  Dims g(dims.end() - k, dims.end()), rest(dims.begin(), dims.end() - k), len;
  // the other dims first (inverse c2c), then the real inverse over the group
  x = C2C(b, x, rest, false);
  // IRFFT reads exactly last/2+1 entries along dim[-1]: trim or zero-pad
  int64_t ld = dims.back(), half = last / 2 + 1, have = x.dims()[ld];
  if (have > half) x = b.SliceDim(x, ld, 0, half);
  if (have < half) {
    Dims lo(x.rank(), 0), hi(x.rank(), 0), in(x.rank(), 0);
    hi[ld] = half - have;
    x = b.Pad(x, b.Zeros(Type(x.et(), {})), lo, hi, in);
  }
  for (int64_t d : g) len.push_back(o.dims[d]);
  ET ret = x.et() == ET::C128 ? ET::F64 : ET::F32;
  Value y = FftGroup(b, x, g, "IRFFT", len, ret);
  return {Cast(b, Scale(b, y, s), o.et)};
}
TT_LOWERINGS(({"aten::_fft_c2r", "aten::_fft_c2r.out"}), FftC2R);

}  // namespace
}  // namespace tt::ops
