// Strict mode's op plans (see plan.h).
#include "plan.h"

#include <ATen/EmptyTensor.h>

#include <atomic>
#include <cstdlib>
#include <algorithm>
#include <cstring>
#include <unordered_map>

#include "runtime/runtime.h"
#include "core/device/storage.h"
#include "core/exec/debug.h"

namespace tt {

namespace {

struct OpPlan {
  std::shared_ptr<MetaResult> mr;
  Runtime::ExeFuture exe;  // possibly still compiling
  struct PArg {
    int input = -1;          // the buffer of flat input `input`'s storage
    int scalar = -1;         // scalars[scalar]'s value
    int64_t rng_numel = -1;  // a fresh key from the default generator
    pjrt::BufferPtr constant;
  };
  std::vector<PArg> args;
  // 0-d program arguments taking the call's values: every source of one
  // argument had one value when recorded, and must have one value again.
  struct PScalar {
    std::vector<ScalarSource> sources;
  };
  std::vector<PScalar> scalars;
  struct Target {
    int input = -1, out = -1;  // flat input's storage, or new output tensor `out`
    hlo::ET et;
    int64_t numel;
  };
  std::vector<Target> targets;
  // Arguments whose value the program depends on: (schema index, value key).
  std::vector<std::pair<int, std::string>> checks;
  // The op's index-bounds checks: results after the targets (core/exec/debug.h).
  std::vector<std::shared_ptr<const BoundsCheck>> bounds;
};

std::unordered_map<std::string, std::vector<std::shared_ptr<OpPlan>>> g_plans;
constexpr size_t kMaxPlanKeys = 16384;
constexpr size_t kMaxVariants = 4;

c10::Scalar SourceValue(const ScalarSource& s, const std::vector<c10::IValue>& args) {
  const c10::IValue& v = args[s.arg];
  if (s.elem >= 0) return v.toList().get(s.elem).toScalar();
  if (v.isTensor()) return v.toTensor().item();
  if (v.isDouble()) return c10::Scalar(v.toDouble());
  return v.toScalar();
}

// The value of a Scalar / float / CPU 0-d tensor argument, as bytes.
std::string ValueKey(const c10::IValue& v) {
  c10::Scalar s = v.isTensor() ? v.toTensor().item() : v.isDouble() ? c10::Scalar(v.toDouble()) : v.toScalar();
  std::string k(1, (char)s.type());
  if (s.isComplex()) {
    c10::complex<double> z = s.toComplexDouble();
    k.append(reinterpret_cast<const char*>(&z), sizeof(z));
  } else if (s.isFloatingPoint()) {
    double d = s.toDouble();
    k.append(reinterpret_cast<const char*>(&d), sizeof(d));
  } else {
    int64_t i = s.isBoolean() ? (int64_t)s.toBool() : s.toLong();
    k.append(reinterpret_cast<const char*>(&i), sizeof(i));
  }
  return k;
}

int InputOf(const StorageState* st, const std::vector<at::Tensor>& flat) {
  for (size_t k = 0; k < flat.size(); ++k)
    if (GetState(flat[k].storage().unsafeGetStorageImpl()).get() == st) return (int)k;
  return -1;
}

bool Matches(const OpPlan& p, const std::vector<c10::IValue>& args) {
  for (const auto& c : p.checks)
    if (ValueKey(args[c.first]) != c.second) return false;
  for (const auto& s : p.scalars) {
    if (s.sources.size() < 2) continue;
    std::string first = Region::ScalarKeyOf(SourceValue(s.sources[0], args), s.sources[0].et);
    for (size_t i = 1; i < s.sources.size(); ++i)
      if (Region::ScalarKeyOf(SourceValue(s.sources[i], args), s.sources[i].et) != first) return false;
  }
  return true;
}

}  // namespace

void PlanKey(const std::vector<at::Tensor>& flat_inputs, std::string& key) {
  key += "|plan";
  std::vector<StatePtr> states;
  states.reserve(flat_inputs.size());
  for (const at::Tensor& t : flat_inputs) {
    states.push_back(GetState(t.storage().unsafeGetStorageImpl()));
    AppendStorageKey(key, t, states.back(), states.data(), states.size() - 1);
  }
}

void PlanRecorder::Finish(const std::string& key, const std::shared_ptr<MetaResult>& mr,
                          const Region::Record& rec, const std::vector<c10::IValue>& args,
                          const std::vector<ops::Arg>& lowered, const std::vector<at::Tensor>& flat_inputs,
                          const std::vector<at::Tensor>& outs) {
  if (!active || !rec.exe.valid() || rec.num_extra) return;
  auto plan = std::make_shared<OpPlan>();
  plan->mr = mr;
  plan->exe = rec.exe;
  plan->bounds = rec.checks;
  std::unordered_map<int, int> scalar_of_arg;  // program argument -> plan->scalars index
  for (size_t j = 0; j < rec.args.size(); ++j) {
    const Region::Record::Arg& a = rec.args[j];
    OpPlan::PArg pa;
    if (a.st) {
      pa.input = InputOf(a.st, flat_inputs);
      if (pa.input < 0) return;
    } else if (a.rng_numel >= 0) {
      pa.rng_numel = a.rng_numel;
    } else if (a.constant && a.scalar_input < 0) {
      // a 0-d argument from the call's values, unless the lowering also
      // used it for a number of its own (then it stays a constant and its
      // sources must keep their values)
      std::vector<ScalarSource> sources;
      bool derived = false;
      for (const auto& e : scalars_) {
        if (e.first != (int)j) continue;
        if (e.second.arg < 0) derived = true;
        else sources.push_back(e.second);
      }
      if (sources.empty() || derived) {
        pa.constant = a.constant;
        for (const ScalarSource& s : sources) plan->checks.emplace_back(s.arg, ValueKey(args[s.arg]));
        if (derived && std::any_of(sources.begin(), sources.end(), [](const ScalarSource& s) { return s.elem >= 0; }))
          return;  // a list element baked in: not worth a check of its own
      } else {
        pa.scalar = (int)plan->scalars.size();
        plan->scalars.push_back({std::move(sources)});
      }
    } else {
      return;  // an explicit generator, a graph input: not an eager op's program
    }
    plan->args.push_back(std::move(pa));
  }
  for (const auto& t : rec.targets) {
    OpPlan::Target pt{InputOf(t.st, flat_inputs), -1, t.et, t.numel};
    if (pt.input < 0) {
      for (size_t k = 0; k < outs.size(); ++k)
        if (outs[k].defined() && GetState(outs[k].storage().unsafeGetStorageImpl()).get() == t.st) {
          pt.out = (int)k;
          break;
        }
      if (pt.out < 0) return;
    }
    plan->targets.push_back(pt);
  }
  for (size_t i = 0; i < lowered.size() && i < args.size(); ++i)
    if (lowered[i].used && (lowered[i].kind == ops::Arg::Scalar || lowered[i].kind == ops::Arg::Double))
      plan->checks.emplace_back((int)i, ValueKey(args[i]));
  if (g_plans.size() >= kMaxPlanKeys) g_plans.clear();
  auto& variants = g_plans[key];
  variants.insert(variants.begin(), std::move(plan));
  if (variants.size() > kMaxVariants) variants.pop_back();
  GetMetrics().plans_recorded++;
}

bool ReplayPlan(const std::string& key, const c10::FunctionSchema& schema, const std::string& name,
                const std::vector<c10::IValue>& args, const std::vector<at::Tensor>& flat_inputs,
                torch::jit::Stack* stack) {
  auto it = g_plans.find(key);
  if (it == g_plans.end()) return false;
  const OpPlan* p = nullptr;
  for (const auto& v : it->second)
    if (Matches(*v, args)) {
      p = v.get();
      break;
    }
  if (!p) return false;
  // outputs, as NativeKernel allocates them (plans never resize an argument)
  static const c10::DispatchKeySet kTpuKeys(c10::DispatchKey::PrivateUse1);
  std::vector<at::Tensor> outs;
  std::vector<c10::IValue> rets;
  for (const MetaRet& r : p->mr->rets) {
    if (r.kind == 2) {
      rets.push_back(r.other);
      continue;
    }
    std::vector<at::Tensor> list;
    for (const OutSpec& o : r.tensors) {
      if (o.input >= 0) {
        list.push_back(flat_inputs[o.input]);
      } else {
        list.push_back(at::detail::empty_strided_generic(o.sizes, o.strides, GetAllocator(), kTpuKeys, o.dtype));
      }
      outs.push_back(list.back());
    }
    if (r.kind == 0) rets.push_back(list[0]);
    else rets.push_back(c10::IValue(list));
  }
  std::vector<pjrt::BufferPtr> bufs;
  bufs.reserve(p->args.size());
  for (const OpPlan::PArg& a : p->args) {
    if (a.input >= 0) {
      bufs.push_back(GetState(flat_inputs[a.input].storage().unsafeGetStorageImpl())->buf);
    } else if (a.scalar >= 0) {
      const ScalarSource& s = p->scalars[a.scalar].sources[0];
      bufs.push_back(Region::KeyedScalarBuffer(Region::ScalarKeyOf(SourceValue(s, args), s.et), s.et));
    } else if (a.rng_numel >= 0) {
      bufs.push_back(Region::RngKeyBuffer(c10::nullopt, a.rng_numel));
    } else {
      bufs.push_back(a.constant);
    }
  }
  std::vector<pjrt::BufferPtr> results;
  try {
    std::vector<int64_t> out_nbytes;
    out_nbytes.reserve(p->targets.size());
    for (const OpPlan::Target& t : p->targets)
      out_nbytes.push_back(t.numel * (int64_t)pjrt::ElementSize(ToPjrt(t.et)));
    for (const auto& b : p->bounds) out_nbytes.push_back(BoundsCheckBytes(*b));
    results = Region::Launch(p->exe, bufs, false, out_nbytes);
  } catch (const pjrt::Error& e) {
    TORCH_CHECK(false, "torchtpu: ", name, " failed on the device: ", e.what());
  }
  bufs.clear();
  TORCH_CHECK(results.size() == p->targets.size() + p->bounds.size(), "torchtpu: ", name,
              ": program returned ", results.size(), " results, expected ", p->targets.size() + p->bounds.size());
  for (size_t k = 0; k < p->bounds.size(); ++k)
    AddPendingCheck(std::move(results[p->targets.size() + k]), p->bounds[k]);
  for (size_t i = 0; i < p->targets.size(); ++i) {
    const OpPlan::Target& t = p->targets[i];
    const at::Tensor& owner = t.input >= 0 ? flat_inputs[t.input] : outs[t.out];
    StatePtr st = GetState(owner.storage().unsafeGetStorageImpl());
    st->buf = std::move(results[i]);
    st->et = t.et;
    st->numel = t.numel;
  }
  Metrics& mt = GetMetrics();
  mt.plan_replays++;
  mt.cache_hits++;
  mt.Native(name);
  GetDeferStats().programs++;
  torch::jit::drop(*stack, schema.arguments().size());
  for (auto& v : rets) stack->push_back(std::move(v));
  return true;
}

void ClearPlans() { g_plans.clear(); }

namespace {
std::atomic<bool>& PlansFlag() {
  static std::atomic<bool> on([] {
    const char* e = std::getenv("TORCHTPU_OP_PLANS");
    return !(e && std::strcmp(e, "0") == 0);
  }());
  return on;
}
}  // namespace

bool PlansEnabled() { return PlansFlag().load(std::memory_order_relaxed); }

bool SetPlansEnabled(bool on) {
  std::lock_guard<std::recursive_mutex> g(Region::Lock());
  if (!on) ClearPlans();
  return PlansFlag().exchange(on);
}

}  // namespace tt
