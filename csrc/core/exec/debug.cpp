// Debug-mode checks (see debug.h): bounds of index arguments that XLA clamps
// silently, NaN/Inf detection after each op, synchronous execution.
#include "debug.h"

#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <mutex>
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

std::string Message(const Rule& rule, int64_t dim, int64_t size, int64_t bad) {
  std::ostringstream m;
  switch (rule.kind) {
    case Kind::IndexSelect: m << "index out of range in self"; break;
    case Kind::Take:
      m << "out of range: tried to access index " << bad << " on a tensor of " << size << " elements.";
      break;
    case Kind::Target: m << "Target " << bad << " is out of bounds."; break;
    default:
      m << rule.prefix << "index " << bad << " is out of bounds for dimension " << dim << " with size " << size;
  }
  return m.str();
}

[[noreturn]] void Raise(const Rule& rule, int64_t dim, int64_t size, int64_t bad, const std::string& suffix = "") {
  std::string m = Message(rule, dim, size, bad) + suffix;
  if (rule.err == Err::Index) TORCH_CHECK_INDEX(false, m);
  TORCH_CHECK(false, m);
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

// The bound checks of an op's device index tensors. Index tensors on the CPU
// (indexing accepts them) are checked here, at once, on the host.
std::vector<Check> CollectChecks(const Rule& rule, const c10::FunctionSchema& schema,
                                 const std::vector<c10::IValue>& args) {
  std::vector<Check> checks;
  int ii = ArgIndex(schema, rule.index), si = ArgIndex(schema, rule.self);
  if (ii < 0 || si < 0 || ii >= (int)args.size() || si >= (int)args.size()) return checks;
  if (!args[si].isTensor()) return checks;
  const at::Tensor& self = args[si].toTensor();
  auto integral = [](const at::Tensor& t) {
    return t.defined() && t.numel() > 0 && c10::isIntegralType(t.scalar_type(), false) &&
           (IsTpuT(t) || t.device().is_cpu());
  };
  auto dim_size = [&](int64_t d) { return self.dim() == 0 ? (int64_t)1 : self.size(d); };
  if (rule.kind == Kind::IndexList) {
    if (!args[ii].isList()) return checks;
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
    if (!args[ii].isTensor() || !integral(args[ii].toTensor())) return checks;
    Check c;
    c.idx = args[ii].toTensor();
    if (rule.kind == Kind::Take) {
      c.size = self.numel();
    } else if (rule.kind == Kind::Target) {
      if (self.dim() == 0) return checks;
      c.size = self.dim() <= 1 ? self.size(0) : self.size(1);
      int gi = ArgIndex(schema, "ignore_index");
      if (gi >= 0 && args[gi].isInt()) {
        c.has_ignore = true;
        c.ignore = args[gi].toInt();
      }
    } else if (rule.kind == Kind::IndexSelect && schema.name() == "aten::embedding") {
      c.size = self.size(0);
    } else {
      int di = ArgIndex(schema, "dim");
      if (di < 0 || !args[di].isInt()) return checks;
      c.dim = c10::maybe_wrap_dim(args[di].toInt(), std::max<int64_t>(self.dim(), 1));
      c.size = dim_size(c.dim);
    }
    c.lo = rule.neg_ok ? -c.size : 0;
    c.hi = c.size;
    checks.push_back(c);
  }
  // CPU index tensors: checked now (cheap, and CPU's exact first offender)
  std::vector<Check> device;
  for (Check& c : checks) {
    if (IsTpuT(c.idx)) {
      device.push_back(std::move(c));
      continue;
    }
    int64_t bad = FirstBad(c);
    if (bad != c.lo - 1) Raise(rule, c.dim, c.size, bad);
  }
  return device;
}

// min/max of every index tensor, computed in region r: S64[2 * checks].
Value EmitMinMax(Region& r, const std::vector<Check>& checks) {
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
  return parts.size() == 1 ? parts[0] : b.Concat(parts, 0);
}

// ---------------------------------------------------------------- pending checks
struct Pending {
  pjrt::BufferPtr buf;
  std::shared_ptr<const BoundsCheck> what;
};
std::mutex g_pending_mu;
std::deque<Pending> g_pending;
// Pending checks kept before the ready ones are read on their own (a loop
// that never synchronizes must not grow the list without bound).
constexpr size_t kMaxPending = 4096;
}  // namespace

struct BoundsCheck {
  const Rule* rule;
  std::string op;
  struct Bound {
    int64_t lo, hi, dim, size;
  };
  std::vector<Bound> bounds;
};

struct PendingCheckValue {
  Value v;
  std::shared_ptr<const BoundsCheck> what;
};

int64_t BoundsCheckBytes(const BoundsCheck& c) { return (int64_t)(2 * c.bounds.size() * sizeof(int64_t)); }

namespace {
// The error of a finished check's min/max pairs ("" if in range).
std::string Violation(const BoundsCheck& c, const int64_t* mm) {
  for (size_t k = 0; k < c.bounds.size(); ++k) {
    const auto& bd = c.bounds[k];
    int64_t mn = mm[2 * k], mx = mm[2 * k + 1];
    if (mn >= bd.lo && mx < bd.hi) continue;
    return Message(*c.rule, bd.dim, bd.size, mn < bd.lo ? mn : mx);
  }
  return "";
}

// Reads a finished check; returns its error or "" (also for a failed program:
// the op's own error is reported where its results are read).
std::string ReadCheck(const Pending& p) {
  std::vector<int64_t> mm(2 * p.what->bounds.size());
  try {
    p.buf->ToHost(mm.data(), mm.size() * sizeof(int64_t));
  } catch (const pjrt::Error&) {
    return "";
  }
  return Violation(*p.what, mm.data());
}

// Drops the finished checks that passed (keeps failures for the next sync).
void PruneLocked() {
  std::deque<Pending> keep;
  for (auto& p : g_pending) {
    if (p.buf->IsReady() && ReadCheck(p).empty()) continue;
    keep.push_back(std::move(p));
  }
  g_pending.swap(keep);
  while (g_pending.size() > kMaxPending) {  // nothing finished: wait for the oldest
    Pending p = std::move(g_pending.front());
    g_pending.pop_front();
    if (!ReadCheck(p).empty()) {
      g_pending.push_front(std::move(p));
      break;
    }
  }
}
}  // namespace

std::shared_ptr<PendingCheckValue> RecordBoundsCheck(Region& r, const c10::FunctionSchema& schema,
                                                     const std::vector<c10::IValue>& args) {
  static const bool on = [] {  // TORCHTPU_BOUNDS_CHECKS=0: off (to measure their cost)
    const char* e = std::getenv("TORCHTPU_BOUNDS_CHECKS");
    return !(e && std::strcmp(e, "0") == 0);
  }();
  if (!on) return nullptr;
  const Rule* rule = FindRule(schema.name());
  // nll_loss's backward reads the target its forward checked already
  if (!rule || rule->kind == Kind::Target && std::strstr(rule->op, "_backward")) return nullptr;
  std::vector<Check> checks = CollectChecks(*rule, schema, args);
  if (checks.empty()) return nullptr;
  auto what = std::make_shared<BoundsCheck>();
  what->rule = rule;
  what->op = schema.name();
  for (const Check& c : checks) what->bounds.push_back({c.lo, c.hi, c.dim, c.size});
  auto pc = std::make_shared<PendingCheckValue>();
  pc->v = EmitMinMax(r, checks);
  pc->what = std::move(what);
  return pc;
}

void AttachBoundsCheck(Region& r, const std::shared_ptr<PendingCheckValue>& c) {
  if (c) r.AddCheck(c->v, c->what);
}

void AddPendingCheck(pjrt::BufferPtr buf, std::shared_ptr<const BoundsCheck> what) {
  std::lock_guard<std::mutex> g(g_pending_mu);
  g_pending.push_back({std::move(buf), std::move(what)});
  if (g_pending.size() > kMaxPending) PruneLocked();
}

void RaisePendingChecks(int64_t upto) {
  std::vector<Pending> todo;
  {
    std::lock_guard<std::mutex> g(g_pending_mu);
    if (g_pending.empty()) return;
    std::deque<Pending> keep;
    for (auto& p : g_pending) {
      if (p.buf->seq <= upto || p.buf->IsReady()) todo.push_back(std::move(p));
      else keep.push_back(std::move(p));
    }
    g_pending.swap(keep);
  }
  for (const Pending& p : todo) {
    std::string err = ReadCheck(p);
    if (err.empty()) continue;
    {
      // the first error is the one reported (CUDA's sticky error, once)
      std::lock_guard<std::mutex> g(g_pending_mu);
      g_pending.clear();
    }
    err += " (torchtpu: raised at this synchronization point for " + p.what->op +
           ", which ran asynchronously, as CUDA reports a device-side assert; "
           "TORCHTPU_MODE=debug raises at the op itself)";
    if (p.what->rule->err == Err::Index) TORCH_CHECK_INDEX(false, err);
    TORCH_CHECK(false, err);
  }
}

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
  std::vector<Check> checks = CollectChecks(*rule, schema, args);
  if (checks.empty()) return;
  std::vector<int64_t> mm(2 * checks.size());
  {
    std::lock_guard<std::recursive_mutex> g(Region::Lock());
    Region& r = Region::Current();
    r.AddResult(EmitMinMax(r, checks));
    auto extra = r.Flush(true, "debug_check");
    TORCH_CHECK(!extra.empty(), "torchtpu: debug bounds check produced no result");
    extra.back()->ToHost(mm.data(), mm.size() * sizeof(int64_t));
  }
  for (size_t k = 0; k < checks.size(); ++k) {
    const Check& c = checks[k];
    if (mm[2 * k] >= c.lo && mm[2 * k + 1] < c.hi) continue;
    Raise(*rule, c.dim, c.size, FirstBad(c));
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
