// Optimizer paths: the _foreach_* family (one program for the whole list),
// norms (linalg_vector_norm, _foreach_norm), stack, and the AMP grad-scaler
// ops. Scalars and scalar lists are program arguments, so a changing learning
// rate does not recompile.
#include <cmath>
#include <limits>
#include <map>
#include <utility>

#include "registry.h"

namespace tt::ops {
namespace {

// Registers a _foreach_ family in its three forms for each overload:
// aten::_foreach_<base>.<ov>, the in-place aten::_foreach_<base>_.<ov> and
// aten::_foreach_<base>.<ov>_out (overload "": _foreach_<base>,
// _foreach_<base>_ and _foreach_<base>.out).
struct ForeachRegistrar {
  ForeachRegistrar(const char* base, std::initializer_list<const char*> overloads, LowerFn fn) {
    std::string b = std::string("aten::_foreach_") + base;
    for (std::string ov : overloads) {
      std::string dot = ov.empty() ? "" : "." + ov;
      Register((b + dot).c_str(), fn, false);
      Register((b + "_" + dot).c_str(), fn, false);
      Register((b + (ov.empty() ? ".out" : dot + "_out")).c_str(), fn, false);
    }
  }
};
#define TT_FOREACH(base, overloads, fn) \
  static ForeachRegistrar TT_CAT(tt_foreach_, __COUNTER__)(base, std::initializer_list<const char*> overloads, fn)

// Operand `argi` for list element k, converted to ct and broadcast to dims.
Value ListOperand(LowerCtx& c, size_t argi, size_t k, const Dims& dims, ET ct, double dflt) {
  if (!c.has(argi)) return c.b.Splat(Type(ct, dims), dflt);
  const Arg& a = c.arg(argi);
  switch (a.kind) {
    case Arg::TensorList:
      return Bcast(c.b, a.vs.at(k), dims, ct);
    case Arg::ScalarList:
      return Bcast(c.b, a.vs.at(k), dims, ct);
    case Arg::Tensor:
    case Arg::Scalar: {
      Value v = a.v;
      if (v.rank() == 1 && a.kind == Arg::Tensor && v.dims()[0] > 1) {  // one value per element
        v = c.b.Reshape(c.b.Slice(v, {(int64_t)k}, {(int64_t)k + 1}, {1}), {});
      }
      return Bcast(c.b, v, dims, ct);
    }
    case Arg::Double:
    case Arg::Int:
      return c.b.Splat(Type(ct, dims), c.f64(argi));
    default:
      return c.b.Splat(Type(ct, dims), dflt);
  }
}

bool IsScalarish(const LowerCtx& c, size_t i) {
  return c.has(i) && (c.arg(i).kind == Arg::Scalar || c.arg(i).kind == Arg::ScalarList ||
                      c.arg(i).kind == Arg::TensorList || c.arg(i).kind == Arg::Tensor);
}

Value NanMax(Builder& b, Value x, Value y, bool is_max) {
  Value r = is_max ? b.Max(x, y) : b.Min(x, y);
  if (!hlo::IsFloat(x.et())) return r;
  r = b.Select(b.Compare(x, x, "NE"), x, r);
  return b.Select(b.Compare(y, y, "NE"), y, r);
}

// ---- binary: self (op) other, other = list / scalar / scalar list / tensor
enum class BinOp { Add, Sub, Mul, Div, Max, Min, Pow };

template <BinOp Op>
std::vector<Value> ForeachBinary(LowerCtx& c) {
  std::vector<Value> xs = c.tl(0);
  std::vector<Value> out;
  for (size_t k = 0; k < xs.size(); ++k) {
    const Type& ot = c.out(k);
    ET ct = ComputeType(ot.et);
    Value x = Bcast(c.b, xs[k], ot.dims, ct);
    Value y = ListOperand(c, 1, k, ot.dims, ct, 0.0);
    Value r;
    switch (Op) {
      case BinOp::Add:
      case BinOp::Sub:
        if (c.has(2) && c.arg(2).kind == Arg::Scalar && c.arg(2).hint() != 1.0)
          y = c.b.Mul(y, Bcast(c.b, c.arg(2).v, ot.dims, ct));
        r = Op == BinOp::Add ? (ct == ET::PRED ? c.b.Binary("or", x, y) : c.b.Add(x, y))
                             : c.b.Sub(x, y);
        break;
      case BinOp::Mul: r = ct == ET::PRED ? c.b.Binary("and", x, y) : c.b.Mul(x, y); break;
      case BinOp::Div: r = c.b.Div(x, y); break;
      case BinOp::Max: r = NanMax(c.b, x, y, true); break;
      case BinOp::Min: r = NanMax(c.b, x, y, false); break;
      case BinOp::Pow: r = c.b.Binary("power", x, y); break;
    }
    out.push_back(r);
  }
  return out;
}

#define FOREACH_BIN(base, op) TT_FOREACH(base, ({"Scalar", "List", "ScalarList", "Tensor"}), ForeachBinary<op>)
FOREACH_BIN("add", BinOp::Add);
FOREACH_BIN("sub", BinOp::Sub);
FOREACH_BIN("mul", BinOp::Mul);
FOREACH_BIN("div", BinOp::Div);
FOREACH_BIN("maximum", BinOp::Max);
FOREACH_BIN("minimum", BinOp::Min);
FOREACH_BIN("clamp_min", BinOp::Max);
FOREACH_BIN("clamp_max", BinOp::Min);
FOREACH_BIN("pow", BinOp::Pow);
#undef FOREACH_BIN

// _foreach_pow.ScalarAndTensor(Scalar self, Tensor[] exponent): self ** e[k]
// (Adam's bias corrections beta ** step under torch.compile).
std::vector<Value> ForeachScalarPow(LowerCtx& c) {
  std::vector<Value> es = c.tl(1), out;
  for (size_t k = 0; k < es.size(); ++k) {
    const Type& ot = c.out(k);
    ET ct = ComputeType(ot.et);
    out.push_back(c.b.Binary("power", Bcast(c.b, c.arg(0).v, ot.dims, ct), Bcast(c.b, es[k], ot.dims, ct)));
  }
  return out;
}
TT_LOWERINGS(({"aten::_foreach_pow.ScalarAndTensor"}), ForeachScalarPow);

// ---- unary
using UFn = Value (*)(Builder&, Value);
#define U(name, expr) \
  Value name(Builder& b, Value x) { return expr; }
U(f_sqrt, b.Unary("sqrt", x))
U(f_rsqrt, b.Unary("rsqrt", x))
U(f_abs, b.Unary("abs", x))
U(f_exp, b.Unary("exponential", x))
U(f_expm1, b.Unary("exponential_minus_one", x))
U(f_log, b.Unary("log", x))
U(f_log1p, b.Unary("log_plus_one", x))
U(f_neg, b.Unary("negate", x))
U(f_reciprocal, b.Div(b.Splat(x.type, 1.0), x))
U(f_sign, b.Unary("sign", x))
U(f_sigmoid, b.Unary("logistic", x))
U(f_tanh, b.Unary("tanh", x))
U(f_sin, b.Unary("sine", x))
U(f_cos, b.Unary("cosine", x))
U(f_floor, b.Unary("floor", x))
U(f_ceil, b.Unary("ceil", x))
U(f_round, b.Unary("round_nearest_even", x))
U(f_erf, b.Op1("chlo.erf", {x}, x.type))
U(f_zero, b.Zeros(x.type))
#undef U
Value f_trunc(Builder& b, Value x) {
  return b.Select(b.Compare(x, b.Zeros(x.type), "LT"), b.Unary("ceil", x), b.Unary("floor", x));
}
Value f_frac(Builder& b, Value x) { return b.Sub(x, f_trunc(b, x)); }

template <UFn F>
std::vector<Value> ForeachUnary(LowerCtx& c) {
  std::vector<Value> xs = c.tl(0), out;
  for (size_t k = 0; k < xs.size(); ++k) {
    const Type& ot = c.out(k);
    ET ct = hlo::IsFloat(ot.et) ? ComputeType(ot.et) : ot.et;
    out.push_back(F(c.b, Cast(c.b, xs[k], ct)));
  }
  return out;
}
#define FOREACH_UN(base, fn) TT_FOREACH(base, ({""}), ForeachUnary<fn>)
FOREACH_UN("sqrt", f_sqrt);
FOREACH_UN("rsqrt", f_rsqrt);
FOREACH_UN("abs", f_abs);
FOREACH_UN("exp", f_exp);
FOREACH_UN("expm1", f_expm1);
FOREACH_UN("log", f_log);
FOREACH_UN("log1p", f_log1p);
FOREACH_UN("neg", f_neg);
FOREACH_UN("reciprocal", f_reciprocal);
FOREACH_UN("sign", f_sign);
FOREACH_UN("sigmoid", f_sigmoid);
FOREACH_UN("tanh", f_tanh);
FOREACH_UN("sin", f_sin);
FOREACH_UN("cos", f_cos);
FOREACH_UN("floor", f_floor);
FOREACH_UN("ceil", f_ceil);
FOREACH_UN("round", f_round);
FOREACH_UN("trunc", f_trunc);
FOREACH_UN("frac", f_frac);
FOREACH_UN("erf", f_erf);
FOREACH_UN("zero", f_zero);
#undef FOREACH_UN

// ---- copy: self[k] = src[k]
std::vector<Value> ForeachCopy(LowerCtx& c) {
  std::vector<Value> src = c.tl(1), out;
  for (size_t k = 0; k < src.size(); ++k) out.push_back(Bcast(c.b, src[k], c.out(k).dims, c.out(k).et));
  return out;
}
TT_FOREACH("copy", ({""}), ForeachCopy);

// ---- addcmul / addcdiv: self + value * (t1 op t2)
template <bool Div>
std::vector<Value> ForeachAddc(LowerCtx& c) {
  std::vector<Value> xs = c.tl(0), out;
  for (size_t k = 0; k < xs.size(); ++k) {
    const Type& ot = c.out(k);
    ET ct = ComputeType(ot.et);
    Value x = Bcast(c.b, xs[k], ot.dims, ct);
    Value t1 = ListOperand(c, 1, k, ot.dims, ct, 0), t2 = ListOperand(c, 2, k, ot.dims, ct, 1);
    Value p = Div ? c.b.Div(t1, t2) : c.b.Mul(t1, t2);
    if (IsScalarish(c, 3) && !(c.arg(3).kind == Arg::Scalar && c.arg(3).hint() == 1.0))
      p = c.b.Mul(p, ListOperand(c, 3, k, ot.dims, ct, 1.0));
    out.push_back(c.b.Add(x, p));
  }
  return out;
}
TT_FOREACH("addcmul", ({"Scalar", "ScalarList", "Tensor"}), ForeachAddc<false>);
TT_FOREACH("addcdiv", ({"Scalar", "ScalarList", "Tensor"}), ForeachAddc<true>);

// ---- lerp: self + w * (end - self)
std::vector<Value> ForeachLerp(LowerCtx& c) {
  std::vector<Value> xs = c.tl(0), out;
  for (size_t k = 0; k < xs.size(); ++k) {
    const Type& ot = c.out(k);
    ET ct = ComputeType(ot.et);
    Value x = Bcast(c.b, xs[k], ot.dims, ct);
    Value e = ListOperand(c, 1, k, ot.dims, ct, 0), w = ListOperand(c, 2, k, ot.dims, ct, 0);
    out.push_back(c.b.Add(x, c.b.Mul(w, c.b.Sub(e, x))));
  }
  return out;
}
TT_FOREACH("lerp", ({"List", "Scalar", "ScalarList"}), ForeachLerp);

// ---- norms
Value VectorNorm(Builder& b, Value x, double ord, const Dims& dims, bool keepdim) {
  ET ct = x.et();
  Value r;
  Value ax = b.Unary("abs", x);
  if (std::isinf(ord)) {
    double init = ord > 0 ? 0.0 : std::numeric_limits<double>::infinity();
    Value i = b.Splat(Type(ct, {}), init);
    r = dims.empty() ? ax : b.Reduce(ax, i, dims, ord > 0 ? "maximum" : "minimum");
  } else if (ord == 0) {
    Value nz = b.Convert(b.Compare(x, b.Zeros(x.type), "NE"), ct);
    r = SumDims(b, nz, dims, false, ct);
  } else if (ord == 1) {
    r = SumDims(b, ax, dims, false, ct);
  } else if (ord == 2) {
    r = b.Unary("sqrt", SumDims(b, b.Mul(x, x), dims, false, ct));
  } else {
    Value p = b.Binary("power", ax, b.Splat(ax.type, ord));
    Value s = SumDims(b, p, dims, false, ct);
    r = b.Binary("power", s, b.Splat(s.type, 1.0 / ord));
  }
  if (keepdim) {
    Dims kd = x.dims();
    for (auto d : dims) kd[d] = 1;
    r = b.Reshape(r, kd);
  }
  return r;
}

Dims AllDims(int rank) {
  Dims d;
  for (int i = 0; i < rank; ++i) d.push_back(i);
  return d;
}

std::vector<Value> ForeachNorm(LowerCtx& c) {
  std::vector<Value> xs = c.tl(0), out;
  double ord = c.has(1) ? c.f64(1) : 2.0;
  for (size_t k = 0; k < xs.size(); ++k) {
    const Type& ot = c.out(k);
    ET ct = ComputeType(ot.et);
    Value x = Cast(c.b, xs[k], ct);
    out.push_back(c.b.Reshape(VectorNorm(c.b, x, ord, AllDims(x.rank()), false), ot.dims));
  }
  return out;
}
TT_LOWERINGS(({"aten::_foreach_norm.Scalar", "aten::_foreach_norm.Scalar_out"}), ForeachNorm);

// ---- AMP grad scaler
// _amp_foreach_non_finite_check_and_unscale_(self[], found_inf, inv_scale)
std::vector<Value> AmpUnscale(LowerCtx& c) {
  std::vector<Value> xs = c.tl(0), out;
  Value found = c.t(1);
  Value bad;  // any non-finite (pred scalar)
  for (size_t k = 0; k < xs.size(); ++k) {
    const Type& ot = c.out(k);
    ET ct = ComputeType(ot.et);
    Value x = Cast(c.b, xs[k], ct);
    Value inv = Bcast(c.b, c.t(2), ot.dims, ct);
    out.push_back(c.b.Mul(x, inv));
    Value nf = c.b.Unary("not", c.b.Op1("stablehlo.is_finite", {x}, x.type.with_et(ET::PRED)));
    Value any = x.rank() == 0 ? nf
                              : c.b.Reduce(nf, c.b.Splat(Type(ET::PRED, {}), 0), AllDims(x.rank()), "or");
    bad = bad.valid() ? c.b.Binary("or", bad, any) : any;
  }
  const Type& ft = c.out(xs.size());
  Value f = Cast(c.b, found, ft.et);
  if (bad.valid()) f = c.b.Select(c.b.BroadcastTo(bad, ft.dims), c.b.Splat(ft, 1.0), f);
  out.push_back(f);
  return out;
}
TT_LOWERINGS(({"aten::_amp_foreach_non_finite_check_and_unscale_"}), AmpUnscale);

// _amp_update_scale_(self, growth_tracker, found_inf, growth, backoff, interval) -> self
// (outputs: self, then the mutated growth_tracker)
std::vector<Value> AmpUpdateScale(LowerCtx& c) {
  Builder& b = c.b;
  const Type& st = c.out(0);
  Value scale = Cast(b, c.t(0), st.et);
  Value tracker = c.t(1);
  Value found = b.Compare(Bcast(b, c.t(2), st.dims, st.et), b.Zeros(st), "GT");
  Value growth = b.Splat(st, c.f64(3)), backoff = b.Splat(st, c.f64(4));
  Value succ = b.Add(tracker, b.Splat(tracker.type, 1));
  Value grow = b.Compare(succ, b.Splat(tracker.type, (double)c.i64(5)), "EQ");
  grow = b.BroadcastTo(grow, st.dims);
  Value grown = b.Mul(scale, growth);
  Value grown_ok = b.Op1("stablehlo.is_finite", {grown}, grown.type.with_et(ET::PRED));
  Value ns = b.Select(found, b.Mul(scale, backoff),
                      b.Select(b.Binary("and", grow, grown_ok), grown, scale));
  Value zero_t = b.Zeros(tracker.type);
  Value found_t = b.Reshape(found, tracker.dims()), grow_t = b.Reshape(grow, tracker.dims());
  Value nt = b.Select(found_t, zero_t, b.Select(grow_t, zero_t, succ));
  return {ns, nt};
}
TT_LOWERINGS(({"aten::_amp_update_scale_"}), AmpUpdateScale);

// ---- fused optimizers: _fused_{adam,adamw,sgd,adagrad}_ (torch.optim's
// fused=True): the whole step over every parameter as one program. The
// schema's floats (lr, betas, ...) are program arguments, so a scheduler
// changing lr does not recompile. In-place forms write self and the state
// lists (and the grads, unscaled, when grad_scale is given); the functional
// forms (torch.compile graphs) return every list.
struct FusedCtx {
  LowerCtx& c;
  bool functional;  // aten::_fused_adam (graphs): every output is returned
  // Validates the lists (there is no meta function for every overload):
  // `shaped` lists hold one tensor of the parameter's shape per parameter,
  // `opt_shaped` ones may also be empty (max_exp_avg_sqs without amsgrad),
  // `steps` holds one one-element tensor per parameter.
  FusedCtx(LowerCtx& ctx, std::initializer_list<size_t> shaped, std::initializer_list<size_t> opt_shaped,
           int steps)
      : c(ctx) {
    std::string base = c.op.substr(0, c.op.find('.'));
    functional = base.back() != '_';
    std::vector<Value> ps = c.tl(0);
    auto check = [&](size_t i, bool may_be_empty, bool shape) {
      const std::vector<Value>& l = c.arg(i).vs;
      if (l.size() != ps.size() && !(may_be_empty && l.empty()))
        c.fail("argument '" + c.names.at(i) + "' has " + std::to_string(l.size()) + " tensors, expected " +
               std::to_string(ps.size()) + " (one per parameter)");
      for (size_t k = 0; k < l.size(); ++k) {
        bool ok = shape ? l[k].dims() == ps[k].dims() : l[k].type.numel() == 1;
        if (!ok)
          c.fail("argument '" + c.names.at(i) + "' tensor " + std::to_string(k) + " has shape " +
                 l[k].type.str() + ", expected " + (shape ? ps[k].type.str() : std::string("one element")));
      }
    };
    for (size_t i : shaped) check(i, false, true);
    for (size_t i : opt_shaped) check(i, true, true);
    if (steps >= 0) check((size_t)steps, false, false);
  }
  // Float argument `i` (a schema float, or a Tensor lr) as a 0-d value of ct,
  // emitted once per (argument, type) for the whole parameter list.
  Value num(size_t i, ET ct) {
    auto key = std::make_pair(i, ct);
    auto it = memo_.find(key);
    if (it != memo_.end()) return it->second;
    const Arg& a = c.arg(i);
    Value v = a.kind == Arg::Tensor || a.kind == Arg::Scalar ? Cast(c.b, c.b.Reshape(a.v, {}), ct)
                                                             : c.num_arg(i, ct);
    return memo_[key] = v;
  }
  // Optional tensor argument (grad_scale, found_inf) as a 0-d ct value.
  std::optional<Value> opt(size_t i, ET ct) {
    if (!c.has(i)) return std::nullopt;
    return num(i, ct);
  }
  // An unchanged list element: the input itself in a functional graph,
  // nothing to write in eager.
  Value same(const Value& v) const { return functional ? v : Value(); }
  // Parameter k in its compute type, with its grad unscaled (grad_scale at
  // argument `scale_i`, found_inf after it), negated for maximize and, for
  // wd != 0, with L2 weight decay added (every family but AdamW).
  struct Param {
    ET ct;
    Dims dims;
    Value p, g, unscaled;  // unscaled: what the grads list gets back
    std::optional<Value> scale;
    Value skip;  // found_inf == 1 (0-d pred); invalid without found_inf
  };
  Param param(const Value& p, const Value& g, size_t scale_i, bool maximize, double l2) {
    Param r;
    r.ct = ComputeType(p.et());
    r.dims = p.dims();
    r.scale = opt(scale_i, r.ct);
    if (auto found = opt(scale_i + 1, r.ct)) {
      auto key = std::make_pair(scale_i + 1, ET::PRED);
      auto it = memo_.find(key);
      r.skip = it != memo_.end() ? it->second
                                 : memo_[key] = c.b.Compare(*found, c.b.Splat(found->type, 1.0), "EQ");
    }
    r.p = Cast(c.b, p, r.ct);
    r.g = Cast(c.b, g, r.ct);
    if (r.scale) r.g = c.b.Div(r.g, c.b.BroadcastTo(*r.scale, r.dims));
    r.unscaled = r.g;
    if (maximize) r.g = c.b.Unary("negate", r.g);
    if (l2 != 0) r.g = c.b.Add(r.g, c.b.Mul(c.b.BroadcastTo(c.scalar_arg(l2, r.ct), r.dims), r.p));
    return r;
  }
  // A 0-d value broadcast to the parameter's shape.
  Value bc(const Param& q, const Value& s) const { return c.b.BroadcastTo(s, q.dims); }
  // found_inf == 1 skips the step: every output keeps its input value.
  Value skip(const Param& q, Value updated, const Value& old) const {
    if (!q.skip.valid()) return updated;
    return c.b.Select(c.b.BroadcastTo(q.skip, old.dims()), Cast(c.b, old, updated.et()), updated);
  }
  // The grads list's output: unscaled when grad_scale is given.
  Value grad_out(const Param& q, const Value& g) const { return q.scale ? skip(q, q.unscaled, g) : same(g); }

 private:
  std::map<std::pair<size_t, ET>, Value> memo_;
};

// The outputs in schema order: the lists one after another.
std::vector<Value> Lists(std::initializer_list<const std::vector<Value>*> lists) {
  std::vector<Value> out;
  for (auto* l : lists) out.insert(out.end(), l->begin(), l->end());
  return out;
}

// Adam / AdamW. args: self, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs,
// state_steps, lr, beta1, beta2, weight_decay, eps, amsgrad, maximize,
// grad_scale, found_inf. The steps were incremented by the optimizer.
template <bool AdamW>
std::vector<Value> FusedAdam(LowerCtx& c) {
  FusedCtx f(c, {1, 2, 3}, {4}, 5);
  Builder& b = c.b;
  std::vector<Value> ps = c.tl(0), gs = c.tl(1), m1 = c.tl(2), m2 = c.tl(3), mx = c.tl(4), steps = c.tl(5);
  bool amsgrad = c.flag(11), maximize = c.flag(12);
  double beta1 = c.f64(7), beta2 = c.f64(8), wd = c.f64(9);
  if (amsgrad && mx.size() != ps.size()) c.fail("amsgrad needs one max_exp_avg_sq per parameter");
  std::vector<Value> np, ng, nm1, nm2, nmx;
  for (size_t k = 0; k < ps.size(); ++k) {
    FusedCtx::Param q = f.param(ps[k], gs[k], 13, maximize, AdamW ? 0.0 : wd);
    ET ct = q.ct;
    auto bc = [&](const Value& s) { return f.bc(q, s); };
    Value lr = f.num(6, ct), eps = f.num(10, ct), p = q.p, g = q.g;
    if (AdamW && wd != 0) p = b.Sub(p, b.Mul(bc(b.Mul(lr, c.scalar_arg(wd, ct))), p));
    // 1 - beta is formed on the host in double: 1 - f32(0.999) is off by 1e-5.
    Value omb1 = c.scalar_arg(1.0 - beta1, ct), omb2 = c.scalar_arg(1.0 - beta2, ct);
    Value ea = Cast(b, m1[k], ct), es = Cast(b, m2[k], ct);
    ea = b.Add(ea, b.Mul(bc(omb1), b.Sub(g, ea)));                                    // lerp(ea, g, 1 - beta1)
    es = b.Add(b.Mul(es, bc(c.scalar_arg(beta2, ct))), b.Mul(bc(omb2), b.Mul(g, g)));  // beta2 es + (1-beta2) g^2
    // bias corrections 1 - beta^step = -expm1(step * log1p(-(1 - beta)))
    Value step = Cast(b, b.Reshape(steps[k], {}), ct);
    auto corr = [&](Value omb) {
      return b.Unary("negate", b.Unary("exponential_minus_one",
                                       b.Mul(step, b.Unary("log_plus_one", b.Unary("negate", omb)))));
    };
    Value step_size = b.Div(lr, corr(omb1));
    Value bc2_sqrt = b.Unary("sqrt", corr(omb2));
    Value den_src = es, nmax;
    if (amsgrad) den_src = nmax = b.Max(Cast(b, mx[k], ct), es);
    Value denom = b.Add(b.Div(b.Unary("sqrt", den_src), bc(bc2_sqrt)), bc(eps));
    p = b.Sub(p, b.Mul(bc(step_size), b.Div(ea, denom)));
    np.push_back(f.skip(q, p, ps[k]));
    ng.push_back(f.grad_out(q, gs[k]));
    nm1.push_back(f.skip(q, ea, m1[k]));
    nm2.push_back(f.skip(q, es, m2[k]));
    if (k < mx.size()) nmx.push_back(amsgrad ? f.skip(q, nmax, mx[k]) : f.same(mx[k]));
  }
  return Lists({&np, &ng, &nm1, &nm2, &nmx});
}
TT_LOWERINGS(({"aten::_fused_adam_", "aten::_fused_adam_.tensor_lr", "aten::_fused_adam",
               "aten::_fused_adam.tensor_lr"}), FusedAdam<false>);
TT_LOWERINGS(({"aten::_fused_adamw_", "aten::_fused_adamw_.tensor_lr", "aten::_fused_adamw",
               "aten::_fused_adamw.tensor_lr"}), FusedAdam<true>);

// SGD. args: self, grads, momentum_buffer_list, weight_decay, momentum, lr,
// dampening, nesterov, maximize, is_first_step, grad_scale, found_inf.
std::vector<Value> FusedSgd(LowerCtx& c) {
  FusedCtx f(c, {1}, {2}, -1);
  Builder& b = c.b;
  std::vector<Value> ps = c.tl(0), gs = c.tl(1), bufs = c.tl(2);
  double momentum = c.f64(4);
  bool nesterov = c.flag(7), first = c.flag(9);
  if (momentum != 0 && bufs.size() != ps.size()) c.fail("momentum needs one momentum buffer per parameter");
  std::vector<Value> np, ng, nb;
  for (size_t k = 0; k < ps.size(); ++k) {
    FusedCtx::Param q = f.param(ps[k], gs[k], 10, c.flag(8), c.f64(3));
    auto bc = [&](const Value& s) { return f.bc(q, s); };
    Value g = q.g, buf;
    if (momentum != 0) {
      Value mom = bc(c.scalar_arg(momentum, q.ct));
      buf = first ? g
                  : b.Add(b.Mul(mom, Cast(b, bufs[k], q.ct)), b.Mul(bc(c.scalar_arg(1.0 - c.f64(6), q.ct)), g));
      g = nesterov ? b.Add(g, b.Mul(mom, buf)) : buf;
    }
    np.push_back(f.skip(q, b.Sub(q.p, b.Mul(bc(f.num(5, q.ct)), g)), ps[k]));
    ng.push_back(f.grad_out(q, gs[k]));
    if (k < bufs.size()) nb.push_back(momentum != 0 ? f.skip(q, buf, bufs[k]) : f.same(bufs[k]));
  }
  return Lists({&np, &ng, &nb});
}
TT_LOWERINGS(({"aten::_fused_sgd_", "aten::_fused_sgd_.tensor_lr", "aten::_fused_sgd",
               "aten::_fused_sgd.tensor_lr"}), FusedSgd);

// Adagrad. args: self, grads, state_sums, state_steps, lr, lr_decay,
// weight_decay, eps, maximize, grad_scale, found_inf.
std::vector<Value> FusedAdagrad(LowerCtx& c) {
  FusedCtx f(c, {1, 2}, {}, 3);
  Builder& b = c.b;
  std::vector<Value> ps = c.tl(0), gs = c.tl(1), sums = c.tl(2), steps = c.tl(3);
  // the float-lr schema marks state_steps written (it is not): an output
  bool steps_out = f.functional || c.outs.size() == 4 * ps.size();
  std::vector<Value> np, ng, ns, nst;
  for (size_t k = 0; k < ps.size(); ++k) {
    FusedCtx::Param q = f.param(ps[k], gs[k], 9, c.flag(8), c.f64(6));
    auto bc = [&](const Value& s) { return f.bc(q, s); };
    Value step = Cast(b, b.Reshape(steps[k], {}), q.ct);
    Value one = b.Splat(Type(q.ct, {}), 1.0);
    // clr = lr / (1 + (step - 1) * lr_decay); sum += g^2; p -= clr * g / (sqrt(sum) + eps)
    Value clr = b.Div(f.num(4, q.ct), b.Add(one, b.Mul(b.Sub(step, one), c.scalar_arg(c.f64(5), q.ct))));
    Value s = b.Add(Cast(b, sums[k], q.ct), b.Mul(q.g, q.g));
    Value stdv = b.Add(b.Unary("sqrt", s), bc(c.scalar_arg(c.f64(7), q.ct)));
    np.push_back(f.skip(q, b.Sub(q.p, b.Mul(bc(clr), b.Div(q.g, stdv))), ps[k]));
    ng.push_back(f.grad_out(q, gs[k]));
    ns.push_back(f.skip(q, s, sums[k]));
    if (steps_out) nst.push_back(f.same(steps[k]));
  }
  return Lists({&np, &ng, &ns, &nst});
}
TT_LOWERINGS(({"aten::_fused_adagrad_", "aten::_fused_adagrad_.tensor_lr", "aten::_fused_adagrad",
               "aten::_fused_adagrad.tensor_lr"}), FusedAdagrad);

}  // namespace
}  // namespace tt::ops
