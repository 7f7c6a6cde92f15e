// Compiled graphs (torch.compile backend): an ATen FX graph, converted by
// torchtpu/_compile.py into a list of nodes, is replayed through the SAME
// lowering registry as eager ops into one region and flushed as one program.
// The module text is the cache key, so every call after the first is a hit.
#include <torch/extension.h>

#include <atomic>
#include <functional>

#include "ops/registry.h"
#include "executor.h"
#include "runtime/runtime.h"

namespace py = pybind11;

namespace tt {

using hlo::ET;
using hlo::Type;
using hlo::Value;

namespace {

struct GArg {
  ops::Arg proto;              // non-tensor payload
  int tensor = -1;             // Tensor: value id
  std::vector<int> list;       // TensorList / OptTensorList (-1 = None)
  bool scalar = false;         // Scalar: a program argument
  c10::Scalar scalar_value;
};

struct GNode {
  std::string op;
  const ops::Lowering* lw = nullptr;
  std::vector<GArg> args;
  std::vector<Type> outs;
  std::vector<int> out_ids;
  std::vector<std::string> names;  // schema argument names
};

struct OutMeta {
  std::vector<int64_t> sizes, strides;
  ET et;
};

// A lowered-and-compiled form of the graph for one input signature: the
// executable plus where each argument comes from and where each result goes,
// so a call with the same signature runs without lowering again.
struct Plan {
  std::string key;
  struct Arg {
    int input = -1;            // the buffer of this input's storage
    pjrt::BufferPtr constant;  // a scalar constant of the graph
    int64_t rng_numel = -1;    // a fresh key from the default generator
    int scalar_input = -1;     // a Python number input
    ET scalar_et = ET::F32;
  };
  struct Target {
    int input = -1, output = -1;  // storage of a (mutated) input, or of an output tensor
    ET et;
    int64_t numel;
  };
  Runtime::ExeFuture exe;  // possibly still compiling
  std::vector<Arg> args;
  std::vector<Target> targets;
};

struct Graph {
  int num_values = 0;
  std::vector<int> input_ids;          // value id of each graph input (-1: non-tensor input)
  std::vector<GNode> nodes;
  std::vector<int> outputs;            // value ids
  std::vector<OutMeta> out_meta;
  std::vector<std::pair<int, int>> mutations;  // (input index, value id written into it)
  std::string name;
  std::vector<std::shared_ptr<Plan>> plans;  // most recent first (a few input signatures)
  int64_t replays = 0, lowerings = 0;
};

ET EtFromCode(int64_t code) { return (ET)code; }

GArg ParseArg(const py::handle& spec) {
  py::tuple t = py::reinterpret_borrow<py::tuple>(spec);
  std::string kind = t[0].cast<std::string>();
  GArg g;
  ops::Arg& a = g.proto;
  if (kind == "t") {
    a.kind = ops::Arg::Tensor;
    g.tensor = t[1].cast<int>();
  } else if (kind == "tl") {
    a.kind = ops::Arg::TensorList;
    g.list = t[1].cast<std::vector<int>>();
  } else if (kind == "otl") {
    a.kind = ops::Arg::OptTensorList;
    g.list = t[1].cast<std::vector<int>>();
  } else if (kind == "n") {
    a.kind = ops::Arg::None;
  } else if (kind == "i") {
    a.kind = ops::Arg::Int;
    a.i = t[1].cast<int64_t>();
  } else if (kind == "f") {
    a.kind = ops::Arg::Double;
    a.d = t[1].cast<double>();
  } else if (kind == "b") {
    a.kind = ops::Arg::Bool;
    a.b = t[1].cast<bool>();
  } else if (kind == "il") {
    a.kind = ops::Arg::IntList;
    a.ints = t[1].cast<std::vector<int64_t>>();
  } else if (kind == "fl") {
    a.kind = ops::Arg::DoubleList;
    a.doubles = t[1].cast<std::vector<double>>();
  } else if (kind == "bl") {
    a.kind = ops::Arg::BoolList;
    a.bools = t[1].cast<std::vector<bool>>();
  } else if (kind == "str") {
    a.kind = ops::Arg::String;
    a.s = t[1].cast<std::string>();
  } else if (kind == "dt") {
    a.kind = ops::Arg::Int;
    a.i = t[1].cast<int64_t>();
  } else if (kind == "s") {
    a.kind = ops::Arg::Scalar;
    g.scalar = true;
    std::string sk = t[2].cast<std::string>();
    if (sk == "b") {
      g.scalar_value = c10::Scalar(t[1].cast<bool>());
      a.scalar_is_bool = true;
    } else if (sk == "i") {
      g.scalar_value = c10::Scalar(t[1].cast<int64_t>());
      a.scalar_is_int = true;
    } else {
      g.scalar_value = c10::Scalar(t[1].cast<double>());
      a.scalar_is_float = true;
    }
    a.scalar_value = g.scalar_value.toDouble();
  } else {
    a.kind = ops::Arg::Other;
  }
  return g;
}

}  // namespace

std::shared_ptr<Graph> BuildGraph(const std::string& name, int num_values, std::vector<int> input_ids,
                                  const py::list& nodes, std::vector<int> outputs, const py::list& out_meta,
                                  std::vector<std::pair<int, int>> mutations) {
  auto g = std::make_shared<Graph>();
  g->name = name;
  g->num_values = num_values;
  g->input_ids = std::move(input_ids);
  g->outputs = std::move(outputs);
  g->mutations = std::move(mutations);
  for (auto item : nodes) {
    py::tuple n = py::reinterpret_borrow<py::tuple>(item);
    GNode node;
    node.op = n[0].cast<std::string>();
    node.lw = ops::Find(node.op);
    TORCH_CHECK(node.lw, "torchtpu.compile: no lowering for ", node.op);
    for (auto a : n[1].cast<py::list>()) node.args.push_back(ParseArg(a));
    for (auto o : n[2].cast<py::list>()) {
      py::tuple ot = py::reinterpret_borrow<py::tuple>(o);
      node.outs.push_back(Type(EtFromCode(ot[0].cast<int64_t>()), ot[1].cast<std::vector<int64_t>>()));
    }
    node.out_ids = n[3].cast<std::vector<int>>();
    node.names = n[4].cast<std::vector<std::string>>();
    g->nodes.push_back(std::move(node));
  }
  for (auto o : out_meta) {
    py::tuple ot = py::reinterpret_borrow<py::tuple>(o);
    g->out_meta.push_back({ot[1].cast<std::vector<int64_t>>(), ot[2].cast<std::vector<int64_t>>(),
                           EtFromCode(ot[0].cast<int64_t>())});
  }
  return g;
}

namespace {

std::atomic<int64_t> g_replays{0}, g_lowerings{0};

// A number input: a Python bool/int/float, or a 0-d CPU tensor (e.g. an
// optimizer's step count), which enters the program as a scalar argument.
bool IsCpuScalar(py::handle o) {
  if (!THPVariable_Check(o.ptr())) return false;
  const at::Tensor& t = THPVariable_Unpack(o.ptr());
  auto st = t.scalar_type();
  return t.device().is_cpu() && t.dim() == 0 &&
         (st == at::kBool || st == at::kFloat || st == at::kDouble || st == at::kLong || st == at::kInt);
}

ET ScalarInputEt(const py::object& o) {
  if (THPVariable_Check(o.ptr())) return ToET(THPVariable_Unpack(o.ptr()).scalar_type());
  if (py::isinstance<py::bool_>(o)) return ET::PRED;
  if (py::isinstance<py::int_>(o)) return ET::S64;
  return ET::F32;
}

c10::Scalar ScalarInputValue(const py::object& o, ET et) {
  if (THPVariable_Check(o.ptr())) return THPVariable_Unpack(o.ptr()).item();
  if (et == ET::PRED) return c10::Scalar(o.cast<bool>());
  if (et == ET::S64) return c10::Scalar(o.cast<int64_t>());
  return c10::Scalar(o.cast<double>());
}

void PutI(std::string& k, int64_t v) { k.append(reinterpret_cast<const char*>(&v), sizeof v); }

// Everything the lowered program text depends on besides the graph itself:
// per input its view geometry, dtype, the storage's flat buffer type, which
// inputs share a storage, and whether its buffer may be donated.
std::string SignatureKey(const Graph& g, const std::vector<py::object>& inputs, std::vector<at::Tensor>& in_tensors,
                         std::vector<StatePtr>& states) {
  std::string k;
  k.reserve(inputs.size() * 64);
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (g.input_ids[i] < 0) {
      PutI(k, -1);
      continue;
    }
    py::handle o = inputs[i];
    if (!THPVariable_Check(o.ptr()) || IsCpuScalar(o)) {
      PutI(k, -2 - (int64_t)ScalarInputEt(inputs[i]));
      continue;
    }
    at::Tensor t = THPVariable_Unpack(o.ptr());
    TORCH_CHECK(t.device().type() == c10::DeviceType::PrivateUse1, "torchtpu.compile: graph input ", i, " is on ",
                t.device(), ", expected tpu");
    in_tensors[i] = t;
    StatePtr st = GetState(t.storage().unsafeGetStorageImpl());
    states[i] = st;
    PutI(k, (int64_t)t.scalar_type());
    PutI(k, t.dim());
    for (int64_t d = 0; d < t.dim(); ++d) {
      PutI(k, t.size(d));
      PutI(k, t.stride(d));
    }
    AppendStorageKey(k, t, st, states.data(), i);
  }
  return k;
}

// Maps a Region::Record of the call that lowered the graph onto input and
// output positions; null if some argument or result has another origin.
std::shared_ptr<Plan> MakePlan(std::string key, const Region::Record& rec, const std::vector<StatePtr>& states,
                               const std::vector<py::object>& inputs, const std::vector<at::Tensor>& results) {
  if (!rec.exe.valid() || rec.num_extra || !rec.checks.empty()) return nullptr;
  auto plan = std::make_shared<Plan>();
  plan->key = std::move(key);
  plan->exe = rec.exe;
  auto input_of = [&](const StorageState* st) {
    for (size_t i = 0; i < states.size(); ++i)
      if (states[i].get() == st) return (int)i;
    return -1;
  };
  for (const auto& a : rec.args) {
    Plan::Arg pa;
    if (a.st) {
      pa.input = input_of(a.st);
      if (pa.input < 0) return nullptr;
    } else if (a.scalar_input >= 0) {
      pa.scalar_input = a.scalar_input;
      pa.scalar_et = ScalarInputEt(inputs[a.scalar_input]);
    } else if (a.rng_numel >= 0) {
      pa.rng_numel = a.rng_numel;
    } else if (a.constant) {
      pa.constant = a.constant;
    } else {
      return nullptr;
    }
    plan->args.push_back(std::move(pa));
  }
  for (const auto& t : rec.targets) {
    Plan::Target pt{input_of(t.st), -1, t.et, t.numel};
    if (pt.input < 0) {
      for (size_t k = 0; k < results.size(); ++k)
        if (results[k].defined() && GetState(results[k].storage().unsafeGetStorageImpl()).get() == t.st) {
          pt.output = (int)k;
          break;
        }
      if (pt.output < 0) return nullptr;
    }
    plan->targets.push_back(pt);
  }
  return plan;
}

// The graph's output tensors: None stays undefined, an output that is a graph
// input is that input tensor, any other is a new tensor (fresh[k]) whose
// storage the program's results fill.
std::vector<at::Tensor> MakeOutputs(const Graph& g, const std::vector<at::Tensor>& in_tensors,
                                    std::vector<bool>* fresh = nullptr) {
  std::vector<at::Tensor> results;
  if (fresh) fresh->assign(g.outputs.size(), false);
  for (size_t k = 0; k < g.outputs.size(); ++k) {
    int id = g.outputs[k];
    if (id < 0) {
      results.push_back(at::Tensor());
      continue;
    }
    auto it = std::find(g.input_ids.begin(), g.input_ids.end(), id);
    if (it != g.input_ids.end() && in_tensors[it - g.input_ids.begin()].defined()) {
      results.push_back(in_tensors[it - g.input_ids.begin()]);
      continue;
    }
    const OutMeta& om = g.out_meta[k];
    results.push_back(at::detail::empty_strided_generic(om.sizes, om.strides, GetAllocator(),
                                                        c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                                        ToScalarType(om.et)));
    if (fresh) (*fresh)[k] = true;
  }
  return results;
}

std::vector<at::Tensor> Replay(Graph& g, const Plan& p, const std::vector<py::object>& inputs,
                               const std::vector<at::Tensor>& in_tensors, const std::vector<StatePtr>& states) {
  std::vector<pjrt::BufferPtr> args;
  args.reserve(p.args.size());
  for (const auto& a : p.args) {
    if (a.input >= 0) args.push_back(states[a.input]->buf);
    else if (a.scalar_input >= 0) args.push_back(Region::ScalarBuffer(ScalarInputValue(inputs[a.scalar_input], a.scalar_et), a.scalar_et));
    else if (a.rng_numel >= 0) args.push_back(Region::RngKeyBuffer(c10::nullopt, a.rng_numel));
    else args.push_back(a.constant);
  }
  std::vector<at::Tensor> results = MakeOutputs(g, in_tensors);
  auto& ds = GetDeferStats();
  ds.flushes++;
  ds.flush_reasons["compiled_graph"]++;
  ds.programs++;
  GetMetrics().cache_hits++;
  std::vector<pjrt::BufferPtr> outs;
  try {
    std::vector<int64_t> out_nbytes;
    out_nbytes.reserve(p.targets.size());
    for (const Plan::Target& t : p.targets) out_nbytes.push_back(t.numel * (int64_t)pjrt::ElementSize(ToPjrt(t.et)));
    outs = Region::Launch(p.exe, args, GetMode() == Mode::Debug, out_nbytes);
  } catch (const pjrt::Error& e) {
    TORCH_CHECK(false, "torchtpu.compile: ", e.what());
  }
  args.clear();
  TORCH_CHECK(outs.size() == p.targets.size(), "torchtpu.compile: program returned ", outs.size(),
              " results, expected ", p.targets.size());
  for (size_t i = 0; i < outs.size(); ++i) {
    const Plan::Target& t = p.targets[i];
    StatePtr st = t.input >= 0 ? states[t.input] : GetState(results[t.output].storage().unsafeGetStorageImpl());
    st->buf = outs[i];
    st->et = t.et;
    st->numel = t.numel;
  }
  g.replays++;
  g_replays++;
  return results;
}


// Replays the graph's nodes through their lowerings into b: vals/have hold
// the inputs on entry and every node's results on return. A Scalar argument
// and a random op's key come from the caller (program arguments).
void LowerNodes(const Graph& g, hlo::Builder& b, std::vector<Value>& vals, std::vector<bool>& have,
                const std::function<Value(const c10::Scalar&, ET)>& scalar,
                const std::function<Value(int64_t)>& rng_key) {
  for (const GNode& n : g.nodes) {
    ops::LowerCtx c{b, n.op, {}, n.names, n.outs, {}};
    for (const GArg& ga : n.args) {
      ops::Arg a = ga.proto;
      if (a.kind == ops::Arg::Tensor) {
        TORCH_CHECK(have[ga.tensor], "torchtpu.compile: value ", ga.tensor, " used before definition in ", n.op);
        a.v = vals[ga.tensor];
      } else if (a.kind == ops::Arg::TensorList) {
        for (int id : ga.list) a.vs.push_back(vals[id]);
      } else if (a.kind == ops::Arg::OptTensorList) {
        for (int id : ga.list) {
          if (id < 0) a.ovs.push_back(std::nullopt);
          else a.ovs.push_back(vals[id]);
        }
      } else if (ga.scalar) {
        ET et = a.scalar_is_bool ? ET::PRED : a.scalar_is_int ? ET::S64 : ET::F32;
        if (!n.outs.empty() && n.outs[0].et == ET::F64 && a.scalar_is_float) et = ET::F64;
        a.v = scalar(ga.scalar_value, et);
      }
      c.args.push_back(std::move(a));
    }
    if (n.lw->random) {
      int64_t numel = 1;
      for (auto& t : n.outs) numel = std::max<int64_t>(numel, t.numel());
      c.rng_key = [&rng_key, numel] { return rng_key(numel); };
    }
    std::vector<Value> outs = n.lw->fn(c);
    TORCH_CHECK(outs.size() >= n.out_ids.size(), "torchtpu.compile: lowering of ", n.op, " returned ", outs.size(),
                " values, the graph uses ", n.out_ids.size());
    for (size_t k = 0; k < n.out_ids.size(); ++k) {
      int id = n.out_ids[k];
      if (id < 0) continue;
      vals[id] = ops::Cast(b, outs[k], n.outs[k].et);
      have[id] = true;
    }
  }
}

}  // namespace

std::vector<at::Tensor> RunGraph(Graph& g, const std::vector<py::object>& inputs) {
  std::vector<at::Tensor> results;
  std::lock_guard<std::recursive_mutex> lock(Region::Lock());
  Region& r = Region::Current();
  if (!r.empty()) r.Flush(false, "compiled_graph");
  TORCH_CHECK(inputs.size() == g.input_ids.size(), "torchtpu.compile: graph takes ", g.input_ids.size(),
              " inputs, got ", inputs.size());
  std::vector<at::Tensor> in_tensors(inputs.size());
  std::vector<StatePtr> states(inputs.size());
  std::string key = SignatureKey(g, inputs, in_tensors, states);
  key += Region::MatmulPrecisionKey();
  GetMetrics().Native("compiled_graph");
  for (size_t i = 0; i < g.plans.size() && !CapturingPrograms(); ++i) {
    if (g.plans[i]->key != key) continue;
    std::shared_ptr<Plan> p = g.plans[i];
    if (i) std::rotate(g.plans.begin(), g.plans.begin() + i, g.plans.begin() + i + 1);
    return Replay(g, *p, inputs, in_tensors, states);
  }
  std::vector<Value> vals(g.num_values);
  std::vector<bool> have(g.num_values, false);
  Region::Record rec;
  try {
    for (size_t i = 0; i < inputs.size(); ++i) {
      int id = g.input_ids[i];
      if (id < 0) continue;
      if (in_tensors[i].defined()) {
        vals[id] = r.Read(in_tensors[i]);
      } else {
        ET et = ScalarInputEt(inputs[i]);
        vals[id] = r.ScalarInput(ScalarInputValue(inputs[i], et), et, (int)i);
      }
      have[id] = true;
    }
    r.FollowMatmulPrecision();
    LowerNodes(
        g, r.b(), vals, have, [&r](const c10::Scalar& s, ET et) { return r.Scalar(s, et); },
        [&r](int64_t numel) { return r.RngKey(c10::nullopt, numel); });
    for (auto& m : g.mutations) {
      TORCH_CHECK(in_tensors[m.first].defined(), "torchtpu.compile: mutated input is not a tensor");
      r.Write(in_tensors[m.first], vals[m.second]);
    }
    std::vector<bool> fresh;
    results = MakeOutputs(g, in_tensors, &fresh);
    for (size_t k = 0; k < g.outputs.size(); ++k) {
      if (!fresh[k]) continue;
      int id = g.outputs[k];
      TORCH_CHECK(have[id], "torchtpu.compile: output value ", id, " was never computed");
      r.Write(results[k], ops::Cast(r.b(), vals[id], g.out_meta[k].et));
    }
    r.RecordNextFlush(&rec);
    r.Flush(GetMode() == Mode::Debug, "compiled_graph");
    g.lowerings++;
    g_lowerings++;
  } catch (const ops::LowerError& e) {
    r.Abandon();
    throw;  // torchtpu._C._LowerError (a RuntimeError): the Python side runs the graph eagerly
  } catch (const pjrt::Error& e) {
    r.Abandon();
    TORCH_CHECK(false, "torchtpu.compile: ", e.what());
  } catch (...) {
    r.Abandon();
    throw;
  }
  if (auto plan = MakePlan(std::move(key), rec, states, inputs, results)) {
    g.plans.insert(g.plans.begin(), std::move(plan));
    if (g.plans.size() > 8) g.plans.pop_back();
  }
  return results;
}

// The graph's program for inputs of the given types, lowered and never run
// (torchtpu.aot.graph_text: a TPU memory report for shapes no device holds).
// inputs[i]: None (not a tensor), (dtype code, sizes) for a tensor, or (dtype
// code,) for a number. Each tensor input, Scalar and random key is a program
// argument; results are the graph's new outputs then the mutated inputs.
std::string GraphText(const Graph& g, const py::list& inputs, bool tpu_target) {
  TORCH_CHECK(inputs.size() == g.input_ids.size(), "torchtpu.aot.graph_text: graph takes ", g.input_ids.size(),
              " inputs, got ", inputs.size());
  hlo::Builder b;
  Region::ApplyMatmulPrecision(b);
  b.set_tpu_target(tpu_target);
  std::vector<Value> vals(g.num_values);
  std::vector<bool> have(g.num_values, false);
  for (size_t i = 0; i < inputs.size(); ++i) {
    int id = g.input_ids[i];
    if (id < 0 || inputs[i].is_none()) continue;
    py::tuple t = inputs[i].cast<py::tuple>();
    ET et = EtFromCode(t[0].cast<int64_t>());
    vals[id] = b.Arg(Type(et, t.size() > 1 ? t[1].cast<std::vector<int64_t>>() : std::vector<int64_t>{}));
    have[id] = true;
  }
  LowerNodes(
      g, b, vals, have, [&b](const c10::Scalar&, ET et) { return b.Arg(Type(et, {})); },
      [&b](int64_t) { return b.Arg(Type(ET::U64, {2})); });
  std::vector<Value> results;
  for (size_t k2 = 0; k2 < g.outputs.size(); ++k2) {
    int id = g.outputs[k2];
    if (id < 0 || std::find(g.input_ids.begin(), g.input_ids.end(), id) != g.input_ids.end()) continue;
    TORCH_CHECK(have[id], "torchtpu.aot.graph_text: output value ", id, " was never computed");
    results.push_back(ops::Cast(b, vals[id], g.out_meta[k2].et));
  }
  for (auto& m : g.mutations) results.push_back(vals[m.second]);
  return b.Finish(results);
}

void BindGraph(py::module& m) {
  py::class_<Graph, std::shared_ptr<Graph>>(m, "_Graph")
      .def_readonly("name", &Graph::name)
      .def_readonly("replays", &Graph::replays)
      .def_readonly("lowerings", &Graph::lowerings);
  py::register_exception<ops::LowerError>(m, "_LowerError", PyExc_RuntimeError);
  m.def("_build_graph", &BuildGraph);
  m.def("_run_graph", &RunGraph);
  m.def("_graph_text", &GraphText);
  m.def("_graph_counts", [] { return std::make_pair(g_lowerings.load(), g_replays.load()); });
  m.def("_et_name", [](int64_t code) { return std::string(hlo::ETName((ET)code)); });
  m.def("_has_lowering", [](const std::string& op) { return ops::Find(op) != nullptr; });
}

}  // namespace tt
