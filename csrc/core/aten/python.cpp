// The Python extension module torchtpu._C.
#include <torch/extension.h>

#include "ops/registry.h"
#include "core/exec/debug.h"
#include "core/exec/events.h"
#include "core/exec/executor.h"
#include "core/device/generator.h"
#include "plan.h"
#include "runtime/runtime.h"
#include "runtime/tpu_check.h"
#include "core/device/storage.h"

#include <torch/csrc/autograd/autograd.h>

namespace {
// The autograd engine's tpu thread drops a finished backward pass (its
// GraphTask, which holds the caller's thread-local state, Python objects among
// it) at the end of its loop turn. If the caller has moved on and that turn
// ends only once the interpreter finalizes (a loaded machine can delay it that
// long), the thread takes the GIL, Python ends it with pthread_exit, and the
// unwinding through torch's noexcept code aborts the process ("terminate
// called without an active exception" at the exit of torchrun jobs; CUDA's
// device threads have the same race). One more pass through that thread, a
// zero-element view (nothing compiles or runs), makes it finish the earlier
// turn while the interpreter is intact (at exit, before finalization).
void SettleAutogradThread() {
  if (!tt::Started()) return;  // no tpu tensor ever made: no device thread ran for it
  try {
    auto opts = at::TensorOptions().device(c10::Device(c10::kPrivateUse1, tt::CurrentDeviceIndex()));
    for (int i = 0; i < 2; ++i) {
      at::Tensor x = at::empty({0}, opts).requires_grad_(true);
      torch::autograd::backward({x.view({0})}, {at::empty({0}, opts)});
    }
  } catch (...) {  // at exit: nothing to report to
  }
}
}  // namespace

namespace tt {
void RegisterNativeKernels();
void PushWarmup();  // kernels.cpp: torchtpu.warmup()
void PopWarmup();
void BindGraph(pybind11::module& m);
void BindDistributed(pybind11::module& m);
}

namespace py = pybind11;

PYBIND11_MODULE(_C, m) {
  m.doc() = "torchtpu C++ core";
  m.def("_configure", [](const std::string& plugin_path, const std::string& plugin_name,
                         int64_t device_count, int64_t device_index, int64_t memory_limit,
                         const std::string& cache_dir, const std::string& version,
                         const std::string& plugin_error) {
    tt::Config c;
    c.plugin_path = plugin_path;
    c.plugin_name = plugin_name;
    c.device_count = device_count;
    c.device_index = device_index;
    c.memory_limit = memory_limit;
    c.cache_dir = cache_dir;
    c.version = version;
    c.plugin_error = plugin_error;
    tt::Configure(c);
  }, py::arg("plugin_path"), py::arg("plugin_name"), py::arg("device_count"), py::arg("device_index"),
     py::arg("memory_limit"), py::arg("cache_dir"), py::arg("version"), py::arg("plugin_error") = "");
  // Compiles StableHLO module text through the plugin (diagnostics / tests).
  m.def("_compile", [](const std::string& text) {
    try {
      tt::Runtime::Get().Executable(text);
    } catch (const tt::pjrt::Error& e) {
      throw std::runtime_error(std::string("torchtpu: PJRT compile failed: ") + e.what());
    }
  });
  // Diagnostics (tools/compare_compile_options.py): compiles module text and
  // runs it on host tensors (one per argument, contiguous), returning each
  // result's bytes.
  m.def("_run_program", [](const std::string& text, const std::vector<at::Tensor>& args) {
    auto& rt = tt::Runtime::Get();
    std::vector<tt::pjrt::BufferPtr> outs;
    try {
      tt::pjrt::ExecutablePtr exe = rt.Executable(text);
      std::vector<tt::pjrt::BufferPtr> bufs;
      std::vector<PJRT_Buffer*> raw;
      for (const at::Tensor& a : args) {
        at::Tensor c = a.contiguous();
        bufs.push_back(rt.Upload(c.data_ptr(), tt::ToPjrt(tt::ToET(c.scalar_type())), c.sizes().vec(),
                                 (int64_t)c.nbytes()));
        raw.push_back(bufs.back()->get());
      }
      outs = exe->Execute(rt.device(), raw, {}, true);
    } catch (const tt::pjrt::Error& e) {
      throw std::runtime_error(std::string("torchtpu: _run_program: ") + e.what());
    }
    py::list res;
    for (auto& o : outs) {
      std::string b((size_t)o->nbytes(), '\0');
      o->ToHost(b.data(), b.size());
      res.append(py::bytes(b));
    }
    return res;
  });
  m.def("_register_kernels", &tt::RegisterNativeKernels);
  m.def("_started", &tt::Started);
  m.def("_start", []() {
    try {
      auto& rt = tt::Runtime::Get();
      return rt.device_count();
    } catch (const tt::pjrt::Error& e) {
      throw std::runtime_error(e.what());
    }
  });
  m.def("_device_info", []() {
    auto& rt = tt::Runtime::Get();
    py::dict d;
    auto& c = rt.client();
    d["platform_name"] = c.platform_name();
    d["platform_version"] = c.platform_version();
    d["device_kind"] = c.device_kind(tt::GetConfig().device_index);
    d["description"] = c.device_description(tt::GetConfig().device_index);
    d["num_devices"] = rt.device_count();
    d["fingerprint"] = rt.fingerprint();
    py::dict attrs;
    for (auto& kv : c.api()->Attributes()) attrs[py::str(kv.first)] = kv.second;
    d["plugin_attributes"] = attrs;
    d["api_version"] = std::to_string(c.api()->major()) + "." + std::to_string(c.api()->minor());
    return d;
  });
  m.def("_set_mode", [](int mode) { tt::SetMode((tt::Mode)mode); });
  m.def("_set_defer_chunk_ops", &tt::SetDeferChunkOps);
  m.def("_set_debug_nans", &tt::SetDebugNans);
  m.def("_get_debug_nans", &tt::DebugNans);
  m.def("_get_mode", []() { return (int)tt::GetMode(); });
  m.def("_set_thread_mode", &tt::SetThreadMode);
  m.def("_push_thread_mode", &tt::PushThreadMode);
  m.def("_pop_thread_mode", &tt::PopThreadMode);
  m.def("_synchronize", []() { tt::SynchronizeDevice(); });
  m.def("_shutdown", []() {
    SettleAutogradThread();
    tt::Runtime::CancelCompiles();
    try {
      tt::DrainLaunches();
    } catch (...) {  // an unread queued launch's error: nobody is left to read it
    }
  }, py::call_guard<py::gil_scoped_release>());
  m.def("_launches_queued", &tt::LaunchesQueued, "Whether launches wait behind compiles (strict mode's launch queue)");
  m.def("_flush", []() {
    std::lock_guard<std::recursive_mutex> g(tt::Region::Lock());
    if (!tt::Region::Current().empty()) tt::Region::Current().Flush();
  });
  m.def("_memory_stats", []() {
    auto s = tt::GetMemStats();
    py::dict d;
    d["allocated_bytes"] = s.allocated;
    d["peak_allocated_bytes"] = s.peak;
    d["num_allocs"] = s.num_allocs;
    d["num_frees"] = s.num_frees;
    d["live_storages"] = s.segments;
    d["num_ooms"] = s.num_ooms;
    d["limit_bytes"] = tt::GetConfig().memory_limit;
    d["process_cap_bytes"] = tt::ProcessMemoryCap();
    return d;
  });
  // torch.tpu.set_per_process_memory_fraction: the allocation cap in bytes (0: none).
  m.def("_set_sync_debug_mode", [](int v) { tt::SyncDebugMode() = v; });
  m.def("_get_sync_debug_mode", []() { return tt::SyncDebugMode().load(); });
  m.def("_set_process_memory_cap", [](int64_t bytes) { tt::SetProcessMemoryCap(bytes); });
  m.def("_reset_peak", []() { tt::GetAllocator()->resetPeakStats(0); });
  m.def("_mem_get_info", []() { return tt::GetAllocator()->getMemoryInfo(0); });
  m.def("_metrics", []() {
    auto& mt = tt::GetMetrics();
    py::dict d;
    {
      std::lock_guard<std::mutex> g(mt.mu);
      py::dict native, fb, host;
      for (auto& kv : mt.native_ops) native[py::str(kv.first)] = kv.second;
      for (auto& kv : mt.fallback_ops) fb[py::str(kv.first)] = kv.second;
      for (auto& kv : mt.host_tier_ops) host[py::str(kv.first)] = kv.second;
      d["native_ops"] = native;
      d["cpu_fallbacks"] = fb;
      d["host_tier_ops"] = host;
      py::dict pm;
      for (auto& kv : mt.python_meta_ops) pm[py::str(kv.first)] = kv.second;
      d["python_meta_ops"] = pm;
    }
    d["compiles"] = mt.compiles.load();
    d["compile_seconds"] = mt.compile_ns.load() / 1e9;
    d["cache_load_seconds"] = mt.disk_load_ns.load() / 1e9;
    d["cache_store_seconds"] = mt.disk_store_ns.load() / 1e9;
    d["compile_threads"] = tt::Runtime::CompileThreads();
    d["queued_launches"] = mt.queued_launches.load();
    d["host_wait_seconds"] = mt.HostWaitSeconds();
    d["cache_hits"] = mt.cache_hits.load();
    d["cache_misses"] = mt.cache_misses.load();
    d["disk_cache_hits"] = mt.disk_hits.load();
    d["executions"] = mt.executions.load();
    d["cpp_meta_rules"] = mt.cpp_meta_rules.load();
    d["plan_replays"] = mt.plan_replays.load();
    d["plans_recorded"] = mt.plans_recorded.load();
    d["flush_host_seconds"] = py::dict(py::arg("build_text") = mt.finish_ns.load() / 1e9,
                                       py::arg("find_executable") = mt.lookup_ns.load() / 1e9,
                                       py::arg("launch") = mt.launch_ns.load() / 1e9);
    d["bytes_host_to_device"] = mt.h2d_bytes.load();
    d["bytes_device_to_host"] = mt.d2h_bytes.load();
    d["live_buffers"] = tt::pjrt::Buffer::live_buffers();
    d["live_buffer_bytes"] = tt::pjrt::Buffer::live_bytes();
    {
      std::lock_guard<std::recursive_mutex> g(tt::Region::Lock());
      auto& ds = tt::GetDeferStats();
      py::dict reasons;
      for (auto& kv : ds.flush_reasons) reasons[py::str(kv.first)] = kv.second;
      d["flushes"] = ds.flushes;
      d["flush_reasons"] = reasons;
      d["programs"] = ds.programs;
      d["ops_per_program"] = ds.programs ? (double)ds.ops_flushed / ds.programs : 0.0;
      d["loops_detected"] = ds.periods_detected;
    }
    d["executable_cache_entries"] = tt::Started() ? (int64_t)tt::Runtime::Get().cache_size() : 0;
    return d;
  });
  // ---- compiling for a TPU topology (runtime/tpu_check.h) ----
  auto stats_dict = [](const tt::pjrt::CompiledStats& st) {
    py::dict d;
    d["code_bytes"] = st.code;
    d["argument_bytes"] = st.argument;
    d["output_bytes"] = st.output;
    d["alias_bytes"] = st.alias;
    d["temp_bytes"] = st.temp;
    d["peak_bytes"] = st.peak;
    return d;
  };
  m.def("_tpu_check_configure", [](const std::string& plugin, const std::string& topology, bool strict) {
    py::gil_scoped_release nogil;
    try {
      tt::ConfigureTpuCheck(plugin, topology, strict);
    } catch (const tt::pjrt::Error& e) {
      throw std::runtime_error(e.what());
    }
  });
  m.def("_tpu_check_report", [](bool wait) {
    tt::TpuCheckReport r;
    {
      py::gil_scoped_release nogil;
      r = tt::GetTpuCheckReport(wait);
    }
    py::dict d;
    d["topology"] = r.topology;
    d["programs"] = r.programs;
    d["failures"] = r.failures;
    d["pending"] = r.pending;
    d["seconds"] = r.seconds;
    d["max_temp_bytes"] = r.max_temp;
    d["max_argument_bytes"] = r.max_argument;
    d["max_output_bytes"] = r.max_output;
    d["max_peak_bytes"] = r.max_peak;
    py::list failed;
    for (auto& f : r.failed)
      failed.append(py::dict(py::arg("error") = f.error, py::arg("ops") = f.ops, py::arg("program") = f.text));
    d["failed"] = failed;
    py::list slowest;
    for (auto& sl : r.slowest) slowest.append(py::make_tuple(sl.first, sl.second));
    d["slowest"] = slowest;
    return d;
  });
  m.def("_tpu_check_reset", &tt::ResetTpuCheckReport);
  m.def("_tpu_compile", [stats_dict](const std::string& plugin, const std::string& topology, const std::string& text,
                                     int num_replicas) {
    tt::AotResult r;
    {
      py::gil_scoped_release nogil;
      r = tt::CompileFor(plugin, topology, text, num_replicas);
    }
    py::dict d = stats_dict(r.stats);
    d["ok"] = r.ok;
    d["error"] = r.error;
    d["seconds"] = r.seconds;
    return d;
  });
  m.def("_tpu_describe", [](const std::string& plugin, const std::string& topology) {
    tt::TopologyInfo info;
    try {
      py::gil_scoped_release nogil;
      info = tt::DescribeTopology(plugin, topology);
    } catch (const tt::pjrt::Error& e) {
      throw std::runtime_error(e.what());
    }
    py::dict d, attrs;
    d["topology"] = info.topology;
    d["num_devices"] = info.num_devices;
    d["platform_name"] = info.platform_name;
    d["platform_version"] = info.platform_version;
    d["plugin_path"] = info.plugin_path;
    for (auto& kv : info.attributes) attrs[py::str(kv.first)] = kv.second;
    d["plugin_attributes"] = attrs;
    return d;
  });
  m.def("_capture_programs_start", &tt::StartProgramCapture);
  m.def("_capture_programs_stop", &tt::StopProgramCapture);
  m.def("_push_warmup", &tt::PushWarmup);
  m.def("_pop_warmup", &tt::PopWarmup);
  m.def("_set_host_tier_runs", &tt::SetHostTierRuns);
  m.def("_host_tier_runs", &tt::HostTierRuns, "TORCHTPU_HOST_TIER's value in effect");
  m.def("_set_op_plans", &tt::SetPlansEnabled, "Turns strict mode's op plans on or off; returns the previous setting");
  m.def("_reset_metrics", []() {
    tt::GetMetrics().Reset();
    std::lock_guard<std::recursive_mutex> g(tt::Region::Lock());
    tt::GetDeferStats() = tt::DeferStats();
  });
  m.def("_lowered_ops", &tt::ops::RegisteredOps);
  tt::BindGraph(m);
  tt::BindDistributed(m);
  m.def("_default_generator", []() { return tt::DefaultGenerator(0); });
}
