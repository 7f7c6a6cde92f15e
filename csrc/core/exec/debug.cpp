// Debug-mode checks (see debug.h): bounds of index arguments that XLA clamps
// silently, NaN/Inf detection after each op, synchronous execution.
#include "debug.h"

#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <sstream>

#include "executor.h"

namespace tt {

using hlo::ET;
using hlo::Type;
using hlo::Value;

namespace {
std::atomic<int> g_nans{-1};  // -1: read TORCHTPU_DEBUG_NANS on first use

bool IsTpuT(const at::Tensor& t) {
  return t.defined() && t.device().type() == c10::DeviceType::PrivateUse1;
}

enum class Kind { DimOfSelf, IndexSelect, Take, Target, IndexList };
enum class Err { Index, Runtime };

struct Rule {
  const char* op;     // schema name (no overload)
  Kind kind;
  const char* index;  // argument holding the index tensor
  const char* self;   // argument whose size bounds it
  Err err;
  bool neg_ok;        // negative indices wrap (python-style)
  const char* prefix; // message prefix
};

const Rule kRules[] = {
    {"aten::index_select", Kind::IndexSelect, "index", "self", Err::Index, false, ""},
    {"aten::embedding", Kind::IndexSelect, "indices", "weight", Err::Index, false, ""},
    {"aten::gather", Kind::DimOfSelf, "index", "self", Err::Runtime, false, ""},
    {"aten::scatter", Kind::DimOfSelf, "index", "self", Err::Runtime, false, ""},
    {"aten::scatter_", Kind::DimOfSelf, "index", "self", Err::Runtime, false, ""},
    {"aten::scatter_add", Kind::DimOfSelf, "index", "self", Err::Runtime, false, ""},
    {"aten::scatter_add_", Kind::DimOfSelf, "index", "self", Err::Runtime, false, ""},
    {"aten::scatter_reduce", Kind::DimOfSelf, "index", "self", Err::Runtime, false, ""},
    {"aten::scatter_reduce_", Kind::DimOfSelf, "index", "self", Err::Runtime, false, ""},
    {"aten::index_add", Kind::DimOfSelf, "index", "self", Err::Runtime, false, ""},
    {"aten::index_add_", Kind::DimOfSelf, "index", "self", Err::Runtime, false, ""},
    {"aten::index_copy", Kind::DimOfSelf, "index", "self", Err::Index, false, "index_copy_(): "},
    {"aten::index_copy_", Kind::DimOfSelf, "index", "self", Err::Index, false, "index_copy_(): "},
    {"aten::index_fill", Kind::DimOfSelf, "index", "self", Err::Index, true, ""},
    {"aten::index_fill_", Kind::DimOfSelf, "index", "self", Err::Index, true, ""},
    {"aten::take", Kind::Take, "index", "self", Err::Index, true, ""},
    {"aten::nll_loss_forward", Kind::Target, "target", "self", Err::Index, false, ""},
    {"aten::nll_loss2d_forward", Kind::Target, "target", "self", Err::Index, false, ""},
    {"aten::nll_loss_backward", Kind::Target, "target", "self", Err::Index, false, ""},
    {"aten::nll_loss2d_backward", Kind::Target, "target", "self", Err::Index, false, ""},
    {"aten::index", Kind::IndexList, "indices", "self", Err::Index, true, ""},
    {"aten::index_put", Kind::IndexList, "indices", "self", Err::Index, true, ""},
    {"aten::index_put_", Kind::IndexList, "indices", "self", Err::Index, true, ""},
    {"aten::_index_put_impl", Kind::IndexList, "indices", "self", Err::Index, true, ""},
    {"aten::_index_put_impl_", Kind::IndexList, "indices", "self", Err::Index, true, ""},
};

const Rule* FindRule(const std::string& op) {
  for (const Rule& r : kRules)
    if (op == r.op) return &r;
  return nullptr;
}

int ArgIndex(const c10::FunctionSchema& s, const char* name) {
  for (size_t i = 0; i < s.arguments().size(); ++i)
    if (s.arguments()[i].name() == name) return (int)i;
  return -1;
}

// One bound check: values of `idx` (optionally skipping `ignore`) must lie in
// [lo, hi).
struct Check {
  at::Tensor idx;
  int64_t lo, hi;
  bool has_ignore = false;
  int64_t ignore = 0;
  int64_t dim = 0, size = 0;  // for the message
};

[[noreturn]] void Raise(const Rule& rule, const Check& c, int64_t bad) {
  std::ostringstream m;
  switch (rule.kind) {
    case Kind::IndexSelect: m << "index out of range in self"; break;
    case Kind::Take:
      m << "out of range: tried to access index " << bad << " on a tensor of " << c.size
        << " elements.";
      break;
    case Kind::Target: m << "Target " << bad << " is out of bounds."; break;
    default:
      m << rule.prefix << "index " << bad << " is out of bounds for dimension " << c.dim
        << " with size " << c.size;
  }
  if (rule.err == Err::Index) TORCH_CHECK_INDEX(false, m.str());
  TORCH_CHECK(false, m.str());
}

// First offending value in iteration order (the error path only).
int64_t FirstBad(const Check& c) {
  at::Tensor h = c.idx.to(c10::kCPU).to(c10::kLong).contiguous();
  const int64_t* p = h.data_ptr<int64_t>();
  for (int64_t i = 0; i < h.numel(); ++i) {
    if (c.has_ignore && p[i] == c.ignore) continue;
    if (p[i] < c.lo || p[i] >= c.hi) return p[i];
  }
  return c.lo - 1;
}
}  // namespace

bool DebugNans() {
  int v = g_nans.load();
  if (v < 0) {
    const char* e = std::getenv("TORCHTPU_DEBUG_NANS");
    v = e && *e && std::strcmp(e, "0") != 0 ? 1 : 0;
    g_nans = v;
  }
  return v == 1;
}

void SetDebugNans(bool on) { g_nans = on ? 1 : 0; }

void DebugBoundsCheck(const c10::FunctionSchema& schema, const std::vector<c10::IValue>& args) {
  const Rule* rule = FindRule(schema.name());
  if (!rule) return;
  int ii = ArgIndex(schema, rule->index), si = ArgIndex(schema, rule->self);
  if (ii < 0 || si < 0 || ii >= (int)args.size() || si >= (int)args.size()) return;
  if (!args[si].isTensor()) return;
  const at::Tensor& self = args[si].toTensor();
  std::vector<Check> checks;
  auto integral = [](const at::Tensor& t) {
    return IsTpuT(t) && t.numel() > 0 && c10::isIntegralType(t.scalar_type(), false);
  };
  auto dim_size = [&](int64_t d) { return self.dim() == 0 ? (int64_t)1 : self.size(d); };
  if (rule->kind == Kind::IndexList) {
    if (!args[ii].isList()) return;
    auto l = args[ii].toList();
    int64_t ordinal = 0;  // CPU names the position among the index tensors
    for (size_t k = 0; k < l.size() && (int64_t)k < std::max<int64_t>(self.dim(), 1); ++k) {
      c10::IValue e = l.get(k);
      if (!e.isTensor() || !e.toTensor().defined()) continue;
      int64_t pos = ordinal++;
      if (!integral(e.toTensor())) continue;
      Check c;
      c.idx = e.toTensor();
      c.dim = pos;
      c.size = dim_size(k);
      c.lo = -c.size;
      c.hi = c.size;
      checks.push_back(c);
    }
  } else {
    if (!args[ii].isTensor() || !integral(args[ii].toTensor())) return;
    Check c;
    c.idx = args[ii].toTensor();
    if (rule->kind == Kind::Take) {
      c.size = self.numel();
    } else if (rule->kind == Kind::Target) {
      c.size = self.dim() <= 1 ? self.size(0) : self.size(1);
      if (self.dim() == 0) return;
      int gi = ArgIndex(schema, "ignore_index");
      if (gi >= 0 && args[gi].isInt()) {
        c.has_ignore = true;
        c.ignore = args[gi].toInt();
      }
    } else if (rule->kind == Kind::IndexSelect && schema.name() == "aten::embedding") {
      c.size = self.size(0);
    } else {
      int di = ArgIndex(schema, "dim");
      if (di < 0 || !args[di].isInt()) return;
      c.dim = c10::maybe_wrap_dim(args[di].toInt(), std::max<int64_t>(self.dim(), 1));
      c.size = dim_size(c.dim);
    }
    c.lo = rule->neg_ok ? -c.size : 0;
    c.hi = c.size;
    checks.push_back(c);
  }
  if (checks.empty()) return;

  // min/max of every index tensor, computed on the device: 2 values each.
  std::vector<int64_t> mm(2 * checks.size());
  {
    std::lock_guard<std::recursive_mutex> g(Region::Lock());
    Region& r = Region::Current();
    hlo::Builder& b = r.b();
    std::vector<Value> parts;
    for (const Check& c : checks) {
      Value v = b.Convert(r.Read(c.idx), ET::S64);
      v = b.Reshape(v, {c.idx.numel()});
      if (c.has_ignore) {
        // ignored entries read as a valid value (lo)
        Value ign = b.Broadcast(b.Constant(Type(ET::S64, {}), std::to_string(c.ignore)), {c.idx.numel()}, {});
        Value lo = b.Broadcast(b.Constant(Type(ET::S64, {}), std::to_string(c.lo)), {c.idx.numel()}, {});
        v = b.Select(b.Compare(v, ign, "EQ"), lo, v);
      }
      Value mn = b.Reduce(v, b.Constant(Type(ET::S64, {}), "9223372036854775807"), {0}, "minimum");
      Value mx = b.Reduce(v, b.Constant(Type(ET::S64, {}), "-9223372036854775808"), {0}, "maximum");
      parts.push_back(b.Reshape(mn, {1}));
      parts.push_back(b.Reshape(mx, {1}));
    }
    r.AddResult(b.Concat(parts, 0));
    auto extra = r.Flush(true, "debug_check");
    TORCH_CHECK(!extra.empty(), "torchtpu: debug bounds check produced no result");
    extra.back()->ToHost(mm.data(), mm.size() * sizeof(int64_t));
  }
  for (size_t k = 0; k < checks.size(); ++k) {
    const Check& c = checks[k];
    if (mm[2 * k] >= c.lo && mm[2 * k + 1] < c.hi) continue;
    Raise(*rule, c, FirstBad(c));
  }
}

void DebugFinish(const std::string& name, const std::vector<at::Tensor>& outs) {
  std::lock_guard<std::recursive_mutex> g(Region::Lock());
  Region& r = Region::Current();
  std::vector<int> checked;
  if (DebugNans()) {
    hlo::Builder& b = r.b();
    std::vector<Value> flags;
    for (size_t i = 0; i < outs.size(); ++i) {
      const at::Tensor& t = outs[i];
      if (!IsTpuT(t) || !c10::isFloatingType(t.scalar_type()) || t.numel() == 0) continue;
      Value v = r.Read(t);
      v = b.Reshape(v, {t.numel()});
      Value fin = b.Op1("stablehlo.is_finite", {v}, v.type.with_et(ET::PRED));
      Value all = b.Reduce(fin, b.Constant(Type(ET::PRED, {}), "true"), {0}, "and");
      flags.push_back(b.Reshape(b.Convert(all, ET::U8), {1}));
      checked.push_back((int)i);
    }
    if (!flags.empty()) r.AddResult(b.Concat(flags, 0));
  }
  r.CountOp();
  auto extra = r.Flush(true, "debug");
  if (checked.empty() || extra.empty()) return;
  std::vector<uint8_t> ok(checked.size());
  extra.back()->ToHost(ok.data(), ok.size());
  for (size_t k = 0; k < checked.size(); ++k) {
    if (ok[k]) continue;
    const at::Tensor& t = outs[checked[k]];
    TORCH_CHECK(false, "torchtpu debug: ", name, " produced a non-finite value (NaN or Inf) in output ",
                checked[k], " (shape ", t.sizes(), ", dtype ", t.scalar_type(),
                "); this is the first op that produced one (TORCHTPU_DEBUG_NANS)");
  }
}

}  // namespace tt
