// Compiled graphs (torch.compile backend): an ATen FX graph, converted by
// torchtpu/_compile.py into a list of nodes, is replayed through the SAME
// lowering registry as eager ops into one region and flushed as one program.
// The module text is the cache key, so every call after the first is a hit.
#include <torch/extension.h>

#include "../ops/registry.h"
#include "executor.h"
#include "runtime.h"

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

struct Graph {
  int num_values = 0;
  std::vector<int> input_ids;          // value id of each graph input (-1: non-tensor input)
  std::vector<GNode> nodes;
  std::vector<int> outputs;            // value ids
  std::vector<OutMeta> out_meta;
  std::vector<std::pair<int, int>> mutations;  // (input index, value id written into it)
  std::string name;
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
    a.scalar_hint = g.scalar_value.toDouble();
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

std::vector<at::Tensor> RunGraph(const Graph& g, const std::vector<py::object>& inputs) {
  std::vector<at::Tensor> results;
  std::lock_guard<std::recursive_mutex> lock(Region::Lock());
  Region& r = Region::Current();
  if (!r.empty()) r.Flush(false, "compiled_graph");
  std::vector<Value> vals(g.num_values);
  std::vector<bool> have(g.num_values, false);
  std::vector<at::Tensor> in_tensors(inputs.size());
  try {
    for (size_t i = 0; i < inputs.size(); ++i) {
      int id = g.input_ids[i];
      if (id < 0) continue;
      py::object o = inputs[i];
      if (THPVariable_Check(o.ptr())) {
        at::Tensor t = THPVariable_Unpack(o.ptr());
        TORCH_CHECK(t.device().type() == c10::DeviceType::PrivateUse1,
                    "torchtpu.compile: graph input ", i, " is on ", t.device(), ", expected tpu");
        in_tensors[i] = t;
        vals[id] = r.Read(t);
      } else if (py::isinstance<py::bool_>(o)) {
        vals[id] = r.Scalar(c10::Scalar(o.cast<bool>()), ET::PRED);
      } else if (py::isinstance<py::int_>(o)) {
        vals[id] = r.Scalar(c10::Scalar(o.cast<int64_t>()), ET::S64);
      } else {
        vals[id] = r.Scalar(c10::Scalar(o.cast<double>()), ET::F32);
      }
      have[id] = true;
    }
    for (const GNode& n : g.nodes) {
      ops::LowerCtx c{r.b(), n.op, {}, n.names, n.outs, {}};
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
          a.v = r.Scalar(ga.scalar_value, et);
        }
        c.args.push_back(std::move(a));
      }
      if (n.lw->random) {
        int64_t numel = 1;
        for (auto& t : n.outs) numel = std::max<int64_t>(numel, t.numel());
        c.rng_key = [&r, numel] { return r.RngKey(c10::nullopt, numel); };
      }
      std::vector<Value> outs = n.lw->fn(c);
      TORCH_CHECK(outs.size() >= n.out_ids.size(), "torchtpu.compile: lowering of ", n.op, " returned ",
                  outs.size(), " values, the graph uses ", n.out_ids.size());
      for (size_t k = 0; k < n.out_ids.size(); ++k) {
        int id = n.out_ids[k];
        if (id < 0) continue;
        vals[id] = ops::Cast(r.b(), outs[k], n.outs[k].et);
        have[id] = true;
      }
    }
    for (auto& m : g.mutations) {
      TORCH_CHECK(in_tensors[m.first].defined(), "torchtpu.compile: mutated input is not a tensor");
      r.Write(in_tensors[m.first], vals[m.second]);
    }
    for (size_t k = 0; k < g.outputs.size(); ++k) {
      int id = g.outputs[k];
      if (id < 0) {  // None
        results.push_back(at::Tensor());
        continue;
      }
      // an output that is a graph input is returned as that tensor
      auto it = std::find(g.input_ids.begin(), g.input_ids.end(), id);
      if (it != g.input_ids.end() && in_tensors[it - g.input_ids.begin()].defined()) {
        results.push_back(in_tensors[it - g.input_ids.begin()]);
        continue;
      }
      const OutMeta& om = g.out_meta[k];
      at::Tensor t = at::detail::empty_strided_generic(om.sizes, om.strides, GetAllocator(),
                                                       c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                                       ToScalarType(om.et));
      TORCH_CHECK(have[id], "torchtpu.compile: output value ", id, " was never computed");
      r.Write(t, ops::Cast(r.b(), vals[id], om.et));
      results.push_back(t);
    }
    GetMetrics().Native("compiled_graph");
    r.Flush(GetMode() == Mode::Debug, "compiled_graph");
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
  return results;
}

void BindGraph(py::module& m) {
  py::class_<Graph, std::shared_ptr<Graph>>(m, "_Graph").def_readonly("name", &Graph::name);
  py::register_exception<ops::LowerError>(m, "_LowerError", PyExc_RuntimeError);
  m.def("_build_graph", &BuildGraph);
  m.def("_run_graph", &RunGraph);
  m.def("_et_name", [](int64_t code) { return std::string(hlo::ETName((ET)code)); });
  m.def("_has_lowering", [](const std::string& op) { return ops::Find(op) != nullptr; });
}

}  // namespace tt
