// Normalization: batch norm (native_batch_norm, _native_batch_norm_legit*,
// backward; running stats updated in place when training), group norm
// (+backward), var_mean (group norm's eager decomposition reaches it),
// _fused_rms_norm (+backward, compiled graphs). Math in ComputeType.
#include <cmath>

#include "nn_util.h"
#include "registry.h"

namespace tt::ops {
namespace {

Value S(Builder& b, const Value& like, double v) { return b.Splat(like.type, v); }

// Dims of x except the channel dim 1.
Dims NotChannel(int r) {
  Dims d{0};
  for (int i = 2; i < r; ++i) d.push_back(i);
  return d;
}
// Per-channel vector (C) broadcast along dim 1 of `dims`.
Value PerC(Builder& b, Value v, const Dims& dims, ET et) { return b.Broadcast(Cast(b, v, et), dims, {1}); }

Value Empty(Builder& b, const Type& t) { return b.Zeros(t); }

// Any of the batch-norm forward schemas; arguments found by name.
std::vector<Value> BatchNorm(LowerCtx& c) {
  Builder& b = c.b;
  const Type& o = c.out(0);
  ET ct = ComputeType(o.et);
  Value x = Cast(b, c.t(0), ct);
  int r = x.rank();
  Dims red = NotChannel(r);
  int rm_i = ArgIndex(c, "running_mean"), rv_i = ArgIndex(c, "running_var");
  int tr_i = ArgIndex(c, "training"), mo_i = ArgIndex(c, "momentum"), ep_i = ArgIndex(c, "eps");
  bool training = tr_i >= 0 && c.flag(tr_i);
  bool has_stats = rm_i >= 0 && c.has(rm_i) && rv_i >= 0 && c.has(rv_i);
  double eps = c.f64(ep_i), momentum = mo_i >= 0 && c.has(mo_i) ? c.f64(mo_i) : 0.1;
  int64_t C = r > 1 ? x.dims()[1] : 1;
  Value mean, var, invstd;  // (C)
  int64_t n = 1;
  for (auto d : red) n *= x.dims()[d];
  if (training) {
    mean = b.Div(SumDims(b, x, red, false, ct), b.Splat(Type(ct, {C}), (double)n));
    Value xc = b.Sub(x, b.Broadcast(mean, x.dims(), {1}));
    var = b.Div(SumDims(b, b.Mul(xc, xc), red, false, ct), b.Splat(Type(ct, {C}), (double)n));
  } else {
    if (!has_stats) c.fail("running_mean and running_var must be defined in evaluation mode");
    mean = Cast(b, c.t(rm_i), ct);
    var = Cast(b, c.t(rv_i), ct);
  }
  invstd = b.Unary("rsqrt", b.Add(var, S(b, var, eps)));
  Value y = b.Mul(b.Sub(x, b.Broadcast(mean, x.dims(), {1})), b.Broadcast(invstd, x.dims(), {1}));
  if (c.has(1)) y = b.Mul(y, PerC(b, c.t(1), x.dims(), ct));
  if (c.has(2)) y = b.Add(y, PerC(b, c.t(2), x.dims(), ct));
  std::vector<Value> res{Cast(b, y, o.et)};
  auto stat = [&](Value v, size_t k) {
    const Type& t = c.out(k);
    if (t.numel() != (int64_t)C || t.dims.size() != 1) return Empty(b, t);
    return Cast(b, v, t.et);
  };
  bool functional = c.op.rfind("aten::_native_batch_norm_legit_functional", 0) == 0;
  bool no_training = c.op.rfind("aten::_native_batch_norm_legit_no_training", 0) == 0;
  if (no_training) {
    // outputs 1, 2 are empty (as CPU)
    res.push_back(Empty(b, c.out(1)));
    res.push_back(Empty(b, c.out(2)));
    return res;
  }
  if (training) {
    res.push_back(stat(mean, 1));
    res.push_back(stat(invstd, 2));
  } else {
    // Evaluation: CPU leaves the .out variant's save_mean / save_invstd untouched.
    for (const char* nm : {"save_mean", "save_invstd"}) {
      int i = ArgIndex(c, nm);
      size_t k = res.size();
      res.push_back(i >= 0 && c.has(i) && c.t(i).type == c.out(k) ? c.t(i) : Empty(b, c.out(k)));
    }
  }
  if (has_stats && (functional || (training && c.outs.size() >= 5))) {
    Value rm = c.t(rm_i), rv = c.t(rv_i);
    if (training) {
      Value rmc = Cast(b, rm, ct), rvc = Cast(b, rv, ct);
      Value m = b.Splat(rmc.type, momentum), m1 = b.Splat(rmc.type, 1.0 - momentum);
      Value uv = b.Mul(var, b.Splat(var.type, n > 1 ? (double)n / (double)(n - 1) : INFINITY));
      if (n <= 1) uv = b.Splat(var.type, NAN);
      rm = Cast(b, b.Add(b.Mul(m1, rmc), b.Mul(m, mean)), rm.et());
      rv = Cast(b, b.Add(b.Mul(m1, rvc), b.Mul(m, uv)), rv.et());
    }
    res.push_back(rm);
    res.push_back(rv);
  }
  return res;
}
TT_LOWERINGS(({"aten::native_batch_norm", "aten::native_batch_norm.out", "aten::_native_batch_norm_legit",
               "aten::_native_batch_norm_legit.no_stats", "aten::_native_batch_norm_legit.out",
               "aten::_native_batch_norm_legit.no_stats_out", "aten::_native_batch_norm_legit_no_training",
               "aten::_native_batch_norm_legit_no_training.out", "aten::_native_batch_norm_legit_functional"}),
             BatchNorm);

// native_batch_norm_backward(grad_out, input, weight?, running_mean?, running_var?, save_mean?,
//   save_invstd?, train, eps, output_mask)
std::vector<Value> BatchNormBackward(LowerCtx& c) {
  Builder& b = c.b;
  ET ct = ComputeType(c.t(1).et());
  Value g = Cast(b, c.t(0), ct), x = Cast(b, c.t(1), ct);
  int r = x.rank();
  const Dims& xd = x.dims();
  Dims red = NotChannel(r);
  int64_t C = xd[1];
  int64_t n = 1;
  for (auto d : red) n *= xd[d];
  bool train = c.flag(7);
  double eps = c.f64(8);
  Value mean, invstd;
  if (train) {
    mean = Cast(b, c.t(5), ct);
    invstd = Cast(b, c.t(6), ct);
  } else {
    mean = Cast(b, c.t(3), ct);
    Value var = Cast(b, c.t(4), ct);
    invstd = b.Unary("rsqrt", b.Add(var, S(b, var, eps)));
  }
  Value w = c.has(2) ? Cast(b, c.t(2), ct) : b.Splat(Type(ct, {C}), 1.0);
  Value xhat = b.Mul(b.Sub(x, b.Broadcast(mean, xd, {1})), b.Broadcast(invstd, xd, {1}));
  std::vector<bool> mask = c.arg(9).bools;
  Value sg = SumDims(b, g, red, false, ct);
  Value sgx = SumDims(b, b.Mul(g, xhat), red, false, ct);
  std::vector<Value> res;
  size_t k = 0;
  if (mask[0]) {
    Value scale = b.Broadcast(b.Mul(w, invstd), xd, {1});
    Value gx;
    if (train) {
      Value inv_n = b.Splat(Type(ct, {C}), 1.0 / (double)n);
      Value mg = b.Broadcast(b.Mul(sg, inv_n), xd, {1});
      Value mgx = b.Broadcast(b.Mul(sgx, inv_n), xd, {1});
      gx = b.Mul(scale, b.Sub(b.Sub(g, mg), b.Mul(xhat, mgx)));
    } else {
      gx = b.Mul(g, scale);
    }
    res.push_back(Cast(b, gx, c.out(k++).et));
  }
  if (mask[1]) res.push_back(Cast(b, sgx, c.out(k++).et));
  if (mask[2]) res.push_back(Cast(b, sg, c.out(k++).et));
  return res;
}
TT_LOWERINGS(({"aten::native_batch_norm_backward", "aten::native_batch_norm_backward.out"}), BatchNormBackward);

// ---- group norm ----
// native_group_norm(input, weight?, bias?, N, C, HxW, group, eps) -> (y, mean (N,G), rstd (N,G))
std::vector<Value> GroupNorm(LowerCtx& c) {
  Builder& b = c.b;
  const Type& o = c.out(0);
  ET ct = ComputeType(o.et);
  Value x0 = Cast(b, c.t(0), ct);
  int64_t N = c.i64(3), C = c.i64(4), HW = c.i64(5), G = c.i64(6);
  double eps = c.f64(7);
  int64_t D = (C / G) * HW;
  Value x = b.Reshape(x0, {N, G, D});
  Value mean = b.Div(SumDims(b, x, {2}, false, ct), b.Splat(Type(ct, {N, G}), (double)D));
  Value xc = b.Sub(x, b.Broadcast(mean, x.dims(), {0, 1}));
  Value var = b.Div(SumDims(b, b.Mul(xc, xc), {2}, false, ct), b.Splat(Type(ct, {N, G}), (double)D));
  Value rstd = b.Unary("rsqrt", b.Add(var, S(b, var, eps)));
  Value y = b.Reshape(b.Mul(xc, b.Broadcast(rstd, x.dims(), {0, 1})), {N, C, HW});
  if (c.has(1)) y = b.Mul(y, b.Broadcast(Cast(b, c.t(1), ct), y.dims(), {1}));
  if (c.has(2)) y = b.Add(y, b.Broadcast(Cast(b, c.t(2), ct), y.dims(), {1}));
  return {Cast(b, b.Reshape(y, o.dims), o.et), Cast(b, b.Reshape(mean, c.out(1).dims), c.out(1).et),
          Cast(b, b.Reshape(rstd, c.out(2).dims), c.out(2).et)};
}
TT_LOWERINGS(({"aten::native_group_norm", "aten::native_group_norm.out"}), GroupNorm);

// native_group_norm_backward(grad_out, input, mean, rstd, weight?, N, C, HxW, group, output_mask)
std::vector<Value> GroupNormBackward(LowerCtx& c) {
  Builder& b = c.b;
  ET ct = ComputeType(c.t(1).et());
  int64_t N = c.i64(5), C = c.i64(6), HW = c.i64(7), G = c.i64(8);
  int64_t Cg = C / G, D = Cg * HW;
  Dims d4{N, G, Cg, HW};
  Value g = b.Reshape(Cast(b, c.t(0), ct), d4), x = b.Reshape(Cast(b, c.t(1), ct), d4);
  Value mean = b.Broadcast(b.Reshape(Cast(b, c.t(2), ct), {N, G}), d4, {0, 1});
  Value rstd = b.Broadcast(b.Reshape(Cast(b, c.t(3), ct), {N, G}), d4, {0, 1});
  Value xhat = b.Mul(b.Sub(x, mean), rstd);
  std::vector<bool> mask = c.arg(9).bools;
  std::vector<Value> res;
  size_t k = 0;
  if (mask[0]) {
    Value gw = g;
    if (c.has(4)) gw = b.Mul(g, b.Broadcast(b.Reshape(Cast(b, c.t(4), ct), {G, Cg}), d4, {1, 2}));
    auto mean_nd = [&](Value v) {
      Value s = SumDims(b, v, {2, 3}, false, ct);
      return b.Broadcast(b.Div(s, b.Splat(s.type, (double)D)), d4, {0, 1});
    };
    Value gx = b.Mul(rstd, b.Sub(b.Sub(gw, mean_nd(gw)), b.Mul(xhat, mean_nd(b.Mul(gw, xhat)))));
    const Type& t = c.out(k++);
    res.push_back(Cast(b, b.Reshape(gx, t.dims), t.et));
  }
  if (mask[1]) {
    const Type& t = c.out(k++);
    res.push_back(Cast(b, b.Reshape(SumDims(b, b.Mul(g, xhat), {0, 3}, false, ct), t.dims), t.et));
  }
  if (mask[2]) {
    const Type& t = c.out(k++);
    res.push_back(Cast(b, b.Reshape(SumDims(b, g, {0, 3}, false, ct), t.dims), t.et));
  }
  return res;
}
TT_LOWERINGS(({"aten::native_group_norm_backward", "aten::native_group_norm_backward.out"}),
             GroupNormBackward);

// var_mean (reached by group norm's eager decomposition) lives in reduce.cpp.


// ---- fused rms norm (compiled graphs) ----
std::vector<Value> RmsNorm(LowerCtx& c) {
  Builder& b = c.b;
  const Type& o = c.out(0);
  ET ct = ComputeType(o.et);
  Value x = Cast(b, c.t(0), ct);
  int r = x.rank();
  int64_t k = (int64_t)c.ints(1).size();
  Dims red;
  int64_t n = 1;
  for (int64_t i = r - k; i < r; ++i) {
    red.push_back(i);
    n *= x.dims()[i];
  }
  double eps = c.has(3) ? c.f64(3) : (double)std::numeric_limits<float>::epsilon();
  if (c.has(3) == false && hlo::ETBytes(o.et) == 8) eps = std::numeric_limits<double>::epsilon();
  Value ms = b.Div(SumDims(b, b.Mul(x, x), red, true, ct),
             b.BroadcastTo(b.ScalarConst(ct, (double)n), [&] {
               Dims kd = x.dims();
               for (auto d : red) kd[d] = 1;
               return kd;
             }()));
  Value rstd = b.Unary("rsqrt", b.Add(ms, S(b, ms, eps)));
  Value y = b.Mul(x, b.BroadcastTo(rstd, x.dims()));
  if (c.has(2)) y = b.Mul(y, Bcast(b, c.t(2), x.dims(), ct));
  return {Cast(b, y, o.et), Cast(b, b.Reshape(rstd, c.out(1).dims), c.out(1).et)};
}
TT_LOWERINGS(({"aten::_fused_rms_norm"}), RmsNorm);

// _fused_rms_norm_backward(grad_out, input, normalized_shape, rstd, weight?, output_mask)
std::vector<Value> RmsNormBackward(LowerCtx& c) {
  Builder& b = c.b;
  ET ct = ComputeType(c.t(1).et());
  Value g = Cast(b, c.t(0), ct), x = Cast(b, c.t(1), ct);
  int r = x.rank();
  int64_t k = (int64_t)c.ints(2).size();
  Dims red, batch;
  int64_t n = 1;
  for (int64_t i = 0; i < r; ++i) {
    if (i >= r - k) {
      red.push_back(i);
      n *= x.dims()[i];
    } else {
      batch.push_back(i);
    }
  }
  Dims kd = x.dims();
  for (auto d : red) kd[d] = 1;
  Value rstd = b.BroadcastTo(b.Reshape(Cast(b, c.t(3), ct), kd), x.dims());
  std::vector<bool> mask = c.arg(5).bools;
  std::vector<Value> res;
  size_t oi = 0;
  if (mask[0]) {
    Value gw = c.has(4) ? b.Mul(g, Bcast(b, c.t(4), x.dims(), ct)) : g;
    // dx = rstd * (gw - x * rstd^2 * mean(gw * x))
    Value m = b.BroadcastTo(b.Div(SumDims(b, b.Mul(gw, x), red, true, ct),
                                  b.BroadcastTo(b.ScalarConst(ct, (double)n), kd)),
                            x.dims());
    Value gx = b.Mul(rstd, b.Sub(gw, b.Mul(b.Mul(x, b.Mul(rstd, rstd)), m)));
    res.push_back(Cast(b, gx, c.out(oi++).et));
  }
  if (mask.size() > 1 && mask[1]) {
    const Type& t = c.out(oi++);
    Value gw = SumDims(b, b.Mul(g, b.Mul(x, rstd)), batch, false, ct);
    res.push_back(Cast(b, b.Reshape(gw, t.dims), t.et));
  }
  return res;
}
TT_LOWERINGS(({"aten::_fused_rms_norm_backward"}), RmsNormBackward);

}  // namespace
}  // namespace tt::ops
