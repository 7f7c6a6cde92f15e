#include <algorithm>

#include "lowp.h"
#include "registry.h"

namespace tt::ops {

std::unordered_map<std::string, Lowering>& Registry() {
  static std::unordered_map<std::string, Lowering> r;
  return r;
}

std::vector<std::string>& DuplicateLowerings() {
  static std::vector<std::string> d;
  return d;
}

void Register(const char* name, LowerFn fn, bool random, bool graph_only) {
  auto& r = Registry();
  if (r.count(name)) DuplicateLowerings().push_back(name);
  r[name] = {fn, random, graph_only};
}

const Lowering* Find(const std::string& op) {
  auto& r = Registry();
  auto it = r.find(op);
  return it == r.end() ? nullptr : &it->second;
}

std::vector<std::string> RegisteredOps() {
  std::vector<std::string> v;
  for (auto& kv : Registry()) v.push_back(kv.first);
  std::sort(v.begin(), v.end());
  return v;
}

const Value& LowerCtx::t(size_t i) const {
  const Arg& a = arg(i);
  if (a.kind == Arg::Tensor || a.kind == Arg::Scalar) return a.v;
  fail("argument " + std::to_string(i) + " is not a tensor");
}

std::vector<Value> LowerCtx::tl(size_t i) const {
  const Arg& a = arg(i);
  if (a.kind != Arg::TensorList) fail("argument " + std::to_string(i) + " is not a tensor list");
  return a.vs;
}

Value LowerCtx::scalar(size_t i, ET et) const {
  const Arg& a = arg(i);
  if (a.kind != Arg::Tensor && a.kind != Arg::Scalar)
    fail("argument " + std::to_string(i) + " is not a scalar");
  return Cast(b, a.v, et);
}

int64_t LowerCtx::i64(size_t i) const {
  const Arg& a = arg(i);
  if (a.kind == Arg::Int) return a.i;
  if (a.kind == Arg::Bool) return a.b;
  if (a.kind == Arg::Scalar) return (int64_t)a.hint();
  fail("argument " + std::to_string(i) + " is not an int");
}

double LowerCtx::f64(size_t i) const {
  const Arg& a = arg(i);
  if (a.kind == Arg::Double) {
    a.used = true;
    return a.d;
  }
  if (a.kind == Arg::Int) return (double)a.i;
  if (a.kind == Arg::Scalar) return a.hint();
  fail("argument " + std::to_string(i) + " is not a float");
}

bool LowerCtx::flag(size_t i, bool dflt) const {
  if (!has(i)) return dflt;
  const Arg& a = arg(i);
  if (a.kind == Arg::Bool) return a.b;
  if (a.kind == Arg::Int) return a.i != 0;
  // Optional bools (`bool?`) arrive as Scalars from the native kernel.
  if (a.kind == Arg::Scalar && a.scalar_is_bool) return a.hint() != 0;
  fail("argument " + std::to_string(i) + " is not a bool");
}

std::vector<int64_t> LowerCtx::ints(size_t i) const {
  const Arg& a = arg(i);
  if (a.kind == Arg::IntList) return a.ints;
  if (a.kind == Arg::Int) return {a.i};
  if (a.kind == Arg::None) return {};
  fail("argument " + std::to_string(i) + " is not an int list");
}

int64_t NormDim(int64_t d, int64_t rank) {
  int64_t r = rank == 0 ? 1 : rank;
  if (d < -r || d >= r)
    throw LowerError("Dimension out of range (expected to be in range of [" + std::to_string(-r) +
                     ", " + std::to_string(r - 1) + "], but got " + std::to_string(d) + ")");
  return d < 0 ? d + r : d;
}

Dims NormDims(const std::vector<int64_t>& ds, int64_t rank) {
  Dims out;
  for (auto d : ds) out.push_back(rank == 0 ? 0 : NormDim(d, rank));
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  if (rank == 0) out.clear();
  return out;
}

Value Cast(Builder& b, Value v, ET et) {
  if (v.et() == et) return v;
  if (IsLowpFloat(v.et()) || IsLowpFloat(et)) return LowpCast(b, v, et);  // ops/lowp.cpp
  if (et == ET::PRED) {
    // bool(x) is x != 0
    return b.Compare(v, b.Zeros(v.type), "NE");
  }
  if (hlo::IsComplex(v.et()) && !hlo::IsComplex(et)) {
    v = b.Op1("stablehlo.real", {v}, v.type.with_et(hlo::ComplexPart(v.et())));
    return b.Convert(v, et);
  }
  return b.Convert(v, et);
}

Value Bcast(Builder& b, Value v, const Dims& dims, ET et) {
  return b.BroadcastTo(Cast(b, v, et), dims);
}

ET ComputeType(ET out) {
  if (out == ET::F16 || out == ET::BF16 || IsLowpFloat(out)) return ET::F32;
  return out;
}

Value SumDims(Builder& b, Value v, const Dims& dims, bool keepdim, ET acc) {
  v = Cast(b, v, acc);
  Value r = dims.empty() ? v : b.Reduce(v, b.Zeros(Type(acc, {})), dims, "add");
  if (keepdim) {
    Dims kd = v.dims();
    for (auto d : dims) kd[d] = 1;
    r = b.Reshape(r, kd);
  }
  return r;
}

// torch.matmul on values whose dtype already equals out_et (or is promoted to it).
// Operands are cast to in_et; the dot's result type is res (f32 for f16/bf16
// operands: accumulation in f32, like CPU's kernels).
static Value MatmulImpl(Builder& b, Value a, Value c, ET in_et, ET res) {
  ET acc = res;
  a = Cast(b, a, in_et);
  c = Cast(b, c, in_et);
  int ra = a.rank(), rc = c.rank();
  if (ra == 1 && rc == 1) {
    return b.DotGeneral(a, c, {}, {}, {0}, {0}, Type(acc, {}));
  }
  if (ra == 2 && rc == 2) {
    return b.DotGeneral(a, c, {}, {}, {1}, {0}, Type(acc, {a.dims()[0], c.dims()[1]}));
  }
  if (ra == 1) {  // (k) @ (..., k, n)
    Value r = MatmulImpl(b, b.Reshape(a, {1, a.dims()[0]}), c, in_et, res);
    Dims d = r.dims();
    d.erase(d.end() - 2);
    return b.Reshape(r, d);
  }
  if (rc == 1) {  // (..., m, k) @ (k)
    Value r = MatmulImpl(b, a, b.Reshape(c, {c.dims()[0], 1}), in_et, res);
    Dims d = r.dims();
    d.pop_back();
    return b.Reshape(r, d);
  }
  // batched: broadcast batch dims
  Dims ba(a.dims().begin(), a.dims().end() - 2), bc(c.dims().begin(), c.dims().end() - 2);
  size_t n = std::max(ba.size(), bc.size());
  Dims batch(n);
  for (size_t i = 0; i < n; ++i) {
    int64_t x = i + ba.size() >= n ? ba[i + ba.size() - n] : 1;
    int64_t y = i + bc.size() >= n ? bc[i + bc.size() - n] : 1;
    batch[i] = x == 1 ? y : x;
  }
  Dims da = batch, dc = batch;
  da.push_back(a.dims()[ra - 2]);
  da.push_back(a.dims()[ra - 1]);
  dc.push_back(c.dims()[rc - 2]);
  dc.push_back(c.dims()[rc - 1]);
  a = b.BroadcastTo(a, da);
  c = b.BroadcastTo(c, dc);
  Dims bd;
  for (size_t i = 0; i < n; ++i) bd.push_back(i);
  Dims od = batch;
  od.push_back(da[n]);
  od.push_back(dc[n + 1]);
  return b.DotGeneral(a, c, bd, bd, {(int64_t)n + 1}, {(int64_t)n}, Type(acc, od));
}


Value Matmul(Builder& b, Value a, Value c, ET out_et, bool wide) {
  Value r = MatmulImpl(b, a, c, out_et, ComputeType(out_et));
  return wide ? r : Cast(b, r, out_et);
}

}  // namespace tt::ops

namespace tt::ops {

static int Category(ET t) {
  if (t == ET::PRED) return 0;
  if (hlo::IsInt(t)) return 1;
  if (hlo::IsComplex(t)) return 3;
  return 2;
}

ET PromoteET(ET a, ET b) {
  if (a == b) return a;
  int ca = Category(a), cb = Category(b);
  if (ca != cb) {
    if (ca > cb) {
      if (ca == 3 && b == ET::F64) return ET::C128;
      return a;
    }
    if (cb == 3 && a == ET::F64) return ET::C128;
    return b;
  }
  if (ca == 1) {
    bool ua = hlo::IsUnsigned(a), ub = hlo::IsUnsigned(b);
    int wa = hlo::ETBytes(a), wb = hlo::ETBytes(b);
    if (ua == ub) return wa >= wb ? a : b;
    // mixed signedness: uint8 with signed -> signed type wide enough
    ET s = ua ? b : a, u = ua ? a : b;
    if (hlo::ETBytes(s) > hlo::ETBytes(u)) return s;
    switch (hlo::ETBytes(u)) {
      case 1: return ET::S16;
      case 2: return ET::S32;
      default: return ET::S64;
    }
  }
  if (ca == 2) {
    if ((a == ET::F16 && b == ET::BF16) || (a == ET::BF16 && b == ET::F16)) return ET::F32;
    return hlo::ETBytes(a) >= hlo::ETBytes(b) ? a : b;
  }
  if (ca == 3) return (a == ET::C128 || b == ET::C128) ? ET::C128 : ET::C64;
  return a;
}

ET CommonType(const LowerCtx& c, std::initializer_list<size_t> idx) {
  // three priority classes, as in torch: dimensioned tensors, 0-d tensors, scalars
  bool have[3] = {false, false, false};
  ET res[3] = {ET::PRED, ET::PRED, ET::PRED};
  for (size_t i : idx) {
    if (!c.has(i)) continue;
    const Arg& a = c.arg(i);
    int cls;
    ET et;
    if (a.kind == Arg::Tensor) {
      cls = a.v.rank() > 0 ? 0 : 1;
      et = a.v.et();
    } else if (a.kind == Arg::Scalar) {
      cls = 2;
      et = a.scalar_is_bool ? ET::PRED
           : a.scalar_is_int ? ET::S64
           : a.scalar_is_complex ? ET::C64
           : a.v.et() == ET::F64 ? ET::F32 : a.v.et();
      if (a.scalar_is_float) et = ET::F32;  // default dtype
    } else {
      continue;
    }
    res[cls] = have[cls] ? PromoteET(res[cls], et) : et;
    have[cls] = true;
  }
  ET out = ET::PRED;
  bool any = false;
  for (int cls = 0; cls < 3; ++cls) {
    if (!have[cls]) continue;
    if (!any) {
      out = res[cls];
      any = true;
    } else if (Category(res[cls]) > Category(out)) {
      // a lower-priority class only matters when it raises the category
      ET r = res[cls];
      if (cls == 2) r = Category(r) == 2 ? ET::F32 : Category(r) == 3 ? ET::C64 : r;
      if (Category(r) == 3 && out == ET::F64) r = ET::C128;
      out = r;
    }
  }
  return out;
}

}  // namespace tt::ops

namespace tt::ops {

Value RowGather(Builder& b, Value x, Value idx) {
  int r = x.rank();
  int64_t k = idx.type.numel();
  idx = b.Reshape(Cast(b, idx, ET::S64), {k, 1});
  Dims offs, slice = x.dims();
  slice[0] = 1;
  for (int d = 1; d < r; ++d) offs.push_back(d);
  Dims rd = x.dims();
  rd[0] = k;
  return b.Op1("stablehlo.gather", {x, idx}, Type(x.et(), rd),
               "dimension_numbers = #stablehlo.gather<offset_dims = " + hlo::IntList(offs) +
                   ", collapsed_slice_dims = [0], start_index_map = [0], index_vector_dim = 1>, slice_sizes = " +
                   hlo::I64Array(slice) + ", indices_are_sorted = false");
}

Value WrapIndex(Builder& b, Value idx, int64_t size) {
  idx = Cast(b, idx, ET::S64);
  Value neg = b.Compare(idx, b.Zeros(idx.type), "LT");
  return b.Select(neg, b.Add(idx, b.Splat(idx.type, (double)size)), idx);
}

hlo::Region ScatterCombiner(ET et, const std::string& how) {
  hlo::Region reg;
  reg.arg_types = {Type(et, {}), Type(et, {})};
  reg.body = [how, et](Builder& b, const std::vector<Value>& a) {
    bool p = et == ET::PRED;
    if (how == "add") return std::vector<Value>{p ? b.Binary("or", a[0], a[1]) : b.Add(a[0], a[1])};
    if (how == "multiply") return std::vector<Value>{p ? b.Binary("and", a[0], a[1]) : b.Mul(a[0], a[1])};
    if (how == "max") return std::vector<Value>{p ? b.Binary("or", a[0], a[1]) : b.Max(a[0], a[1])};
    if (how == "min") return std::vector<Value>{p ? b.Binary("and", a[0], a[1]) : b.Min(a[0], a[1])};
    return std::vector<Value>{a[1]};
  };
  return reg;
}

void AvoidSingleWindow(Builder& b, Value& coords, Value& upd, int64_t windows, const std::string& how) {
  if (windows != 1 || coords.rank() < 2 || upd.rank() < 1 || coords.dims()[0] != 1 || upd.dims()[0] != 1) return;
  Value second = upd;
  if (how == "add") second = b.Splat(upd.type, -0.0);
  else if (how == "multiply") second = b.Splat(upd.type, 1.0);
  else if (how != "replace" && how != "max" && how != "min") return;
  coords = b.Concat({coords, coords}, 0);
  upd = b.Concat({upd, second}, 0);
}

std::string PadAttr(const Dims& lo, const Dims& hi) {
  std::string s = "dense<[";
  for (size_t i = 0; i < lo.size(); ++i) {
    if (i) s += ", ";
    s += "[" + std::to_string(lo[i]) + ", " + std::to_string(hi[i]) + "]";
  }
  return s + "]> : tensor<" + std::to_string(lo.size()) + "x2xi64>";
}

}  // namespace tt::ops
