// Process-wide device state: configuration, the PJRT client for this
// process's device, the executable cache and the metrics. Torch-free.
#pragma once
#include <atomic>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <unordered_set>

#include "pjrt.h"

namespace tt {

struct Config {
  std::string plugin_path;   // resolved by the Python layer
  std::string plugin_name = "cpu";
  int64_t device_count = 1;  // CPU plugin: devices to create
  int64_t device_index = 0;  // the one device this process drives
  int64_t memory_limit = 0;  // bytes; 0 = none (CPU) / device capacity
  std::string cache_dir;     // persistent executable cache; empty = off
  std::string version = "0";
  std::string plugin_error;  // why no plugin could be found (reported on first use)
};

void Configure(const Config& c);
const Config& GetConfig();
bool Started();

class Metrics {
 public:
  std::mutex mu;
  std::map<std::string, int64_t> native_ops, fallback_ops, host_tier_ops;
  // ops whose output metadata came from PyTorch's (mostly Python) meta kernels
  std::map<std::string, int64_t> python_meta_ops;
  // output metadata from C++ rules; strict-mode op plans replayed / recorded
  std::atomic<int64_t> cpp_meta_rules{0}, plan_replays{0}, plans_recorded{0};
  std::atomic<int64_t> compiles{0}, cache_hits{0}, cache_misses{0}, disk_hits{0};
  std::atomic<int64_t> compile_ns{0}, executions{0}, disk_load_ns{0}, disk_store_ns{0};
  std::atomic<int64_t> h2d_bytes{0}, d2h_bytes{0};
  // host time of flushes: building the module text, finding its executable, launching it
  std::atomic<int64_t> finish_ns{0}, lookup_ns{0}, launch_ns{0};
  // launches queued behind a compile (see LaunchQueue), and the time the
  // host waited for queued work (pending buffers, drains)
  std::atomic<int64_t> queued_launches{0}, queue_wait_ns{0};
  // compiles and disk loads done on the calling thread, not a compile thread
  std::atomic<int64_t> host_build_ns{0};
  // pjrt::Buffer::pending_wait_ns() at the last Reset
  std::atomic<int64_t> pending_wait_base{0};
  // Seconds the calling threads spent blocked on programs: compiling or
  // loading them, waiting for queued launches and their pending results.
  double HostWaitSeconds() const;
  void Native(const std::string& op) { std::lock_guard<std::mutex> g(mu); native_ops[op]++; }
  void Fallback(const std::string& op) { std::lock_guard<std::mutex> g(mu); fallback_ops[op]++; }
  void HostTier(const std::string& op) { std::lock_guard<std::mutex> g(mu); host_tier_ops[op]++; }
  void PythonMeta(const std::string& op) { std::lock_guard<std::mutex> g(mu); python_meta_ops[op]++; }
  void Reset();
};
Metrics& GetMetrics();

class Runtime {
 public:
  static Runtime& Get();  // starts the client on first use (throws pjrt::Error)
  pjrt::Client& client() { return *client_; }
  PJRT_Device* device() const { return device_; }
  int64_t device_count() const { return (int64_t)client_->devices().size(); }
  // Compiled executable for module text (in-memory, then on-disk cache).
  // `op_program`: the program of one eager op (strict or debug mode), which
  // may take cheaper compile options (see DefaultOptionsFor).
  pjrt::ExecutablePtr Executable(const std::string& text, bool op_program = false);
  // The same, without waiting: ready at once when cached in memory, else
  // loaded or compiled by the compile threads (TORCHTPU_COMPILE_THREADS;
  // 0: on the calling thread, ready on return). Its error is the compile's.
  using ExeFuture = std::shared_future<pjrt::ExecutablePtr>;
  ExeFuture ExecutableAsync(const std::string& text, bool op_program = false);
  static ExeFuture Ready(pjrt::ExecutablePtr exe);
  // Compile threads in use (0: compiles run on the calling thread).
  static int CompileThreads();
  // At exit: compiles not started fail ("cancelled"); waits for those running.
  static void CancelCompiles();
  pjrt::BufferPtr Upload(const void* data, PJRT_Buffer_Type type, const std::vector<int64_t>& dims,
                         int64_t nbytes);
  // A buffer whose bytes stay on the host until the device needs them
  // (pjrt::Buffer's host-resident form).
  pjrt::BufferPtr HostResident(std::shared_ptr<const std::string> bytes, PJRT_Buffer_Type type, int64_t numel);
  size_t cache_size();
  // Compile options for a program: those with dots/convolutions differ (see
  // DefaultCompileOptions). On XLA:CPU an eager op's small program made only of ops
  // whose code the legacy elemental emitter generates bit for bit as the
  // fusion emitters do compiles without the fusion emitters (~35% less
  // compile time; tools/compare_compile_options.py is the evidence).
  const std::string& DefaultOptionsFor(const std::string& text, bool op_program = false);
  void ClearCache();
  std::string fingerprint() const { return fingerprint_; }
 private:
  Runtime();
  void Start(const Config& c);
  std::unique_ptr<pjrt::Client> client_;
  PJRT_Device* device_ = nullptr;
  std::mutex mu_;
  std::unordered_map<std::string, pjrt::ExecutablePtr> cache_;
  std::unordered_map<std::string, ExeFuture> inflight_;  // being compiled
  std::string fingerprint_;
  pjrt::ExecutablePtr Build(const std::string& text, bool op_program);  // disk cache or compile
  // The executable for text, cached or compiling (mu_ held); false on a miss.
  bool Lookup(const std::string& text, ExeFuture* out);
};

int64_t NowNs();
// TORCHTPU_HOST_TIER: how many times strict mode runs an op on the host before
// compiling its program (0: never on the host). Default 2.
int HostTierRuns();
int SetHostTierRuns(int n);  // returns the previous value
// While alive, host code computes with subnormals flushed to zero (inputs and
// results) where the device's programs do (XLA:CPU, TPU), so an op run on the
// host gives the device's bits. A no-op elsewhere (CUDA keeps subnormals).
class HostTierFloatEnv {
 public:
  HostTierFloatEnv();
  ~HostTierFloatEnv();
  HostTierFloatEnv(const HostTierFloatEnv&) = delete;
  HostTierFloatEnv& operator=(const HostTierFloatEnv&) = delete;
 private:
  unsigned saved_ = 0;
  bool set_ = false;
};

}  // namespace tt
