#if defined(__x86_64__)
#include <xmmintrin.h>
#endif
#include "runtime.h"
#include "tpu_check.h"

#include <dirent.h>
#include <fcntl.h>
#include <sched.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <thread>
#include <unordered_set>

#include "disk_cache.h"

namespace tt {

namespace {
Config g_config;
std::atomic<bool> g_started{false};
std::mutex g_start_mu;
Runtime* g_runtime = nullptr;
}  // namespace

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

void Configure(const Config& c) {
  std::lock_guard<std::mutex> g(g_start_mu);
  if (g_started) {
    // Only the cache dir and memory limit may change after start.
    g_config.memory_limit = c.memory_limit;
    g_config.cache_dir = c.cache_dir;
    return;
  }
  g_config = c;
}
const Config& GetConfig() { return g_config; }
bool Started() { return g_started.load(); }

Metrics& GetMetrics() {
  static Metrics m;
  return m;
}

void Metrics::Reset() {
  std::lock_guard<std::mutex> g(mu);
  native_ops.clear();
  fallback_ops.clear();
  host_tier_ops.clear();
  python_meta_ops.clear();
  cpp_meta_rules = 0; plan_replays = 0; plans_recorded = 0;
  compiles = 0; cache_hits = 0; cache_misses = 0; disk_hits = 0;
  compile_ns = 0; executions = 0; disk_load_ns = 0; disk_store_ns = 0; h2d_bytes = 0; d2h_bytes = 0;
  finish_ns = 0; lookup_ns = 0; launch_ns = 0;
  queued_launches = 0; queue_wait_ns = 0; host_build_ns = 0;
  pending_wait_base = pjrt::Buffer::pending_wait_ns();
}

double Metrics::HostWaitSeconds() const {
  return (host_build_ns.load() + queue_wait_ns.load() + pjrt::Buffer::pending_wait_ns() -
          pending_wait_base.load()) / 1e9;
}

Runtime& Runtime::Get() {
  if (g_started.load(std::memory_order_acquire)) return *g_runtime;
  std::lock_guard<std::mutex> g(g_start_mu);
  if (!g_started) {
    g_runtime = new Runtime();  // lives for the process (plugin teardown order)
    g_started.store(true, std::memory_order_release);
  }
  return *g_runtime;
}

Runtime::Runtime() {
  const Config& c = g_config;
  if (c.plugin_path.empty())
    throw pjrt::Error(c.plugin_error.empty()
                          ? "torchtpu: no PJRT plugin configured (import torchtpu first)"
                          : c.plugin_error);
  // Plugins log start-up chatter to stderr; keep import quiet unless asked
  // (TORCHTPU_VERBOSE=1). Errors still arrive as PJRT_Error messages.
  struct QuietStderr {
    int saved = -1;
    QuietStderr() {
      const char* v = std::getenv("TORCHTPU_VERBOSE");
      if (v && *v && *v != '0') return;
      std::fflush(stderr);
      saved = dup(2);
      int devnull = open("/dev/null", O_WRONLY);
      if (devnull >= 0) {
        dup2(devnull, 2);
        close(devnull);
      }
    }
    ~QuietStderr() {
      if (saved < 0) return;
      std::fflush(stderr);
      dup2(saved, 2);
      close(saved);
    }
  } quiet;
  try {
    Start(c);
  } catch (const pjrt::Error& e) {
    if (c.plugin_name == "tpu")
      throw pjrt::Error(std::string(e.what()) +
                        " (TORCHTPU_PLUGIN=tpu needs a Cloud TPU host with libtpu installed and no "
                        "other process holding the TPU; on other machines use TORCHTPU_PLUGIN=cpu "
                        "or cuda)",
                        e.code());
    if (c.plugin_name == "cuda") {
      // Without a GPU the plugin fails to load (its CUDA libraries or the driver's
      // libcuda.so.1 are missing) or finds no device: say what it needs.
      const char* ver = c.plugin_path.find("cuda12") != std::string::npos ? "12" : "13";
      throw pjrt::Error(std::string("torchtpu: TORCHTPU_PLUGIN=cuda could not start the CUDA PJRT "
                                    "plugin: ") +
                            e.what() + " (it needs an NVIDIA GPU, its driver "
                            "(libcuda.so.1) and the CUDA " + ver + " libraries of the nvidia-* "
                            "wheels: cuda-runtime, cublas, cudnn, cuda-nvrtc, cuda-cupti; on a "
                            "machine without one use TORCHTPU_PLUGIN=cpu)",
                        e.code());
    }
    throw;
  }
}

namespace {
// TORCHTPU_XLA_THREADS=N: the XLA CPU client's intra-op (Eigen) pool gets N
// threads. The plugin has no create option for it: it sizes the pool by the
// CPUs the creating thread may run on (sched_getaffinity), so the client is
// created with this thread's affinity narrowed to N CPUs; afterwards this
// thread and the pool's threads ("tf_XLAEigen...") get the full set back, so
// nothing stays pinned. 0 / unset: the plugin's default (every CPU).
class XlaThreadLimit {
 public:
  explicit XlaThreadLimit(int n) {
    if (n <= 0 || sched_getaffinity(0, sizeof(saved_), &saved_) != 0 || CPU_COUNT(&saved_) <= n) return;
    cpu_set_t narrow;
    CPU_ZERO(&narrow);
    for (int cpu = 0, left = n; cpu < CPU_SETSIZE && left > 0; ++cpu)
      if (CPU_ISSET(cpu, &saved_)) { CPU_SET(cpu, &narrow); --left; }
    active_ = sched_setaffinity(0, sizeof(narrow), &narrow) == 0;
  }
  ~XlaThreadLimit() {
    if (!active_) return;
    sched_setaffinity(0, sizeof(saved_), &saved_);
    if (DIR* d = opendir("/proc/self/task")) {
      while (dirent* e = readdir(d)) {
        if (e->d_name[0] == '.') continue;
        char comm[64] = {0};
        std::string path = std::string("/proc/self/task/") + e->d_name + "/comm";
        if (FILE* f = std::fopen(path.c_str(), "r")) {
          if (!std::fgets(comm, sizeof(comm), f)) comm[0] = 0;
          std::fclose(f);
        }
        if (std::strncmp(comm, "tf_XLA", 6) == 0)
          sched_setaffinity((pid_t)std::atoi(e->d_name), sizeof(saved_), &saved_);
      }
      closedir(d);
    }
  }

 private:
  cpu_set_t saved_;
  bool active_ = false;
};
}  // namespace

void Runtime::Start(const Config& c) {
  const pjrt::Api* api = pjrt::Api::Load(c.plugin_path);
  if (std::string problem = StableHloVersionProblem(api->Attributes(), c.plugin_path); !problem.empty())
    throw pjrt::Error("torchtpu: " + problem);
  std::vector<pjrt::CreateOption> opts;
  int xla_threads = 0;
  if (c.plugin_name == "cpu") {
    pjrt::CreateOption o;
    o.name = "cpu_device_count";
    o.kind = pjrt::CreateOption::kInt;
    o.i = c.device_count;
    opts.push_back(o);
    if (const char* e = std::getenv("TORCHTPU_XLA_THREADS")) xla_threads = std::atoi(e);
  }
  {
    XlaThreadLimit limit(xla_threads);
    client_ = std::make_unique<pjrt::Client>(api, opts);
  }
  const auto& devs = client_->devices();
  if (devs.empty()) throw pjrt::Error("torchtpu: the PJRT plugin reports no devices");
  if (c.device_index < 0 || c.device_index >= (int64_t)devs.size())
    throw pjrt::Error("torchtpu: device index " + std::to_string(c.device_index) +
                      " is out of range: valid indices are 0.." + std::to_string(devs.size() - 1));
  device_ = devs[c.device_index];
  fingerprint_ = client_->platform_name() + "|" + client_->platform_version() + "|api" +
                 std::to_string(api->major()) + "." + std::to_string(api->minor()) + "|tt" +
                 c.version;
}

static std::atomic<int>& HostTierRunsVar() {
  static std::atomic<int> n{[] {
    const char* e = std::getenv("TORCHTPU_HOST_TIER");
    return e && *e ? std::max(0, std::atoi(e)) : 2;
  }()};
  return n;
}
HostTierFloatEnv::HostTierFloatEnv() {
#if defined(__x86_64__)
  static const bool flush = [] {
    const std::string p = Runtime::Get().client().platform_name();
    return p == "cpu" || p == "tpu";
  }();
  if (flush) {
    saved_ = _mm_getcsr();
    _mm_setcsr(saved_ | 0x8040);  // FTZ | DAZ
    set_ = true;
  }
#endif
}
HostTierFloatEnv::~HostTierFloatEnv() {
#if defined(__x86_64__)
  if (set_) _mm_setcsr(saved_);
#endif
}

int HostTierRuns() { return HostTierRunsVar().load(std::memory_order_relaxed); }
int SetHostTierRuns(int n) { return HostTierRunsVar().exchange(std::max(0, n)); }

namespace {
// StableHLO ops whose XLA:CPU code is bit-identical with and without the
// fusion emitters (xla_cpu_use_fusion_emitters=false: the legacy elemental IR
// emitter). Measured with tools/compare_compile_options.py on the programs of
// the transformers battery (947) and of a unary/binary op sweep over
// f32/bf16/f16/f64 with zeros, infinities, NaNs, large, small and subnormal
// inputs (546). Left out: erf, tan, asinh (their approximations differ),
// 8-, 6- and 4-bit float types (e5m2 data movement changed NaN and
// subnormal bits: tests/test_lowp.py),
// reduce (layer-norm backward's fused reductions differ), and everything not
// measured (dots, sorts, scatters, windows, random bits, ...).
bool LegacyEmitterExact(const std::string& text) {
  static const std::unordered_set<std::string> ok = {
      "abs", "add", "and", "broadcast_in_dim", "ceil", "compare", "concatenate", "constant", "convert",
      "cosine", "divide", "dynamic_update_slice", "exponential", "exponential_minus_one", "floor", "iota",
      "is_finite", "log", "log_plus_one", "logistic", "maximum", "minimum", "multiply", "negate", "not", "or",
      "power", "remainder", "reshape", "return", "round_nearest_even", "rsqrt", "select", "sign", "sine",
      "slice", "sqrt", "subtract", "tanh", "transpose", "gather", "pad"};
  // Small programs only: the legacy emitter's code is as fast for most ops,
  // but converts to bf16 of millions of elements took 2x as long; below
  // kMaxElements a run costs microseconds, and the compile saved ~13 ms.
  constexpr int64_t kMaxElements = 1 << 16;
  static const std::unordered_set<std::string> kTypes = {"f32", "f64", "bf16", "f16", "i1", "i8", "i16",
                                                         "i32", "i64", "ui8", "ui16", "ui32", "ui64"};
  for (size_t t = text.find("tensor<"); t != std::string::npos; t = text.find("tensor<", t + 7)) {
    int64_t n = 1, d = 0;
    for (size_t i = t + 7; i < text.size(); ++i) {
      char ch = text[i];
      if (ch >= '0' && ch <= '9') {
        d = d * 10 + (ch - '0');
      } else if (ch == 'x') {
        n *= d;
        d = 0;
      } else {
        // the element type: only those measured (f8/f6/f4 formats change bits:
        // XLA:CPU's legacy emitter moves e5m2 through a wider float)
        size_t e = text.find('>', i);
        if (e == std::string::npos || !kTypes.count(text.substr(i, e - i))) return false;
        break;
      }
      if (n > kMaxElements || d > kMaxElements) return false;
    }
  }
  size_t pos = 0;
  bool any = false;
  for (;;) {
    size_t q = text.find("\"stablehlo.", pos);
    size_t c = text.find("\"chlo.", pos);
    if (c != std::string::npos && (q == std::string::npos || c < q)) return false;  // chlo: not measured
    if (q == std::string::npos) return any;
    size_t b = q + 11, e = text.find('"', b);
    if (e == std::string::npos || !ok.count(text.substr(b, e - b))) return false;
    any = true;
    pos = e;
  }
}
}  // namespace

const std::string& Runtime::DefaultOptionsFor(const std::string& text, bool op_program) {
  static const std::string platform = client_->platform_name();
  static const std::string with_dots = pjrt::DefaultCompileOptions(platform, true),
                           elementwise = pjrt::DefaultCompileOptions(platform, false),
                           legacy = pjrt::DefaultCompileOptions(platform, false, true);
  if (text.find("dot_general") != std::string::npos || text.find("convolution") != std::string::npos)
    return with_dots;
  if (op_program && platform == "cpu" && legacy != elementwise && LegacyEmitterExact(text)) return legacy;
  return elementwise;
}

namespace {
thread_local bool t_compile_thread = false;
// Threads that compile (or load from disk) the programs strict mode's ops and
// regions need, so that the host goes on dispatching while XLA compiles: the
// executor queues the launch (see LaunchQueue). First in, first out.
class CompilePool {
 public:
  static CompilePool& Get() {
    static CompilePool* p = [] {
      auto* q = new CompilePool();  // never destroyed (see Stop)
      g_compile_pool.store(q);
      return q;
    }();
    return *p;
  }
  static std::atomic<CompilePool*> g_compile_pool;
  void Push(std::function<void(bool cancelled)> job) {
    {
      std::lock_guard<std::mutex> g(mu_);
      q_.push_back(std::move(job));
    }
    cv_.notify_one();
  }
  // At exit: jobs not started are cancelled; waits for those running.
  void Stop() {
    std::deque<std::function<void(bool)>> left;
    {
      std::lock_guard<std::mutex> g(mu_);
      if (stopping_) return;
      stopping_ = true;
      left.swap(q_);
    }
    for (auto& j : left) j(true);
    std::unique_lock<std::mutex> l(mu_);
    idle_cv_.wait(l, [this] { return running_ == 0; });
  }
 private:
  CompilePool() {
    for (int i = 0; i < Runtime::CompileThreads(); ++i) std::thread([this] { Run(); }).detach();
    std::atexit([] { CompilePool::Get().Stop(); });
  }
  void Run() {
    t_compile_thread = true;
    for (;;) {
      std::function<void(bool)> job;
      {
        std::unique_lock<std::mutex> l(mu_);
        cv_.wait(l, [this] { return !q_.empty() && !stopping_; });
        job = std::move(q_.front());
        q_.pop_front();
        running_++;
      }
      job(false);
      {
        std::lock_guard<std::mutex> g(mu_);
        running_--;
      }
      idle_cv_.notify_all();
    }
  }
  std::mutex mu_;
  std::condition_variable cv_, idle_cv_;
  std::deque<std::function<void(bool)>> q_;
  int running_ = 0;
  bool stopping_ = false;
};
std::atomic<CompilePool*> CompilePool::g_compile_pool{nullptr};
}  // namespace

void Runtime::CancelCompiles() {
  if (CompilePool* p = CompilePool::g_compile_pool.load()) p->Stop();
}

int Runtime::CompileThreads() {
  static const int n = [] {
    if (const char* e = std::getenv("TORCHTPU_COMPILE_THREADS"); e && *e) return std::max(0, std::atoi(e));
    return (int)std::min(8u, std::max(1u, std::thread::hardware_concurrency()));
  }();
  return n;
}

pjrt::ExecutablePtr Runtime::Build(const std::string& text, bool op_program) {
  const std::string& options = DefaultOptionsFor(text, op_program);
  if (const char* dump = std::getenv("TORCHTPU_DUMP_DIR"); dump && *dump) {
    // every newly compiled program, for debugging
    static std::atomic<int> n{0};
    std::string path = std::string(dump) + "/program_" + std::to_string(getpid()) + "_" +
                       std::to_string(n++) + ".mlir";
    if (FILE* f = std::fopen(path.c_str(), "w")) {
      std::fwrite(text.data(), 1, text.size(), f);
      std::fclose(f);
    }
  }
  pjrt::ExecutablePtr exe;
  int64_t t0 = NowNs();
  exe = DiskCacheLoad(GetConfig().cache_dir, *client_, fingerprint_, text, options);
  if (exe) {
    GetMetrics().disk_hits++;
    GetMetrics().disk_load_ns += NowNs() - t0;
  } else {
    exe = client_->Compile(text, options);
    GetMetrics().compiles++;
    GetMetrics().compile_ns += NowNs() - t0;
    int64_t t1 = NowNs();
    DiskCacheStore(GetConfig().cache_dir, *exe, fingerprint_, text, options);
    GetMetrics().disk_store_ns += NowNs() - t1;
  }
  TpuCheckProgram(text);  // TORCHTPU_TPU_CHECK: also for a TPU topology (tpu_check.h)
  if (!t_compile_thread) GetMetrics().host_build_ns += NowNs() - t0;
  return exe;
}

Runtime::ExeFuture Runtime::ExecutableAsync(const std::string& text, bool op_program) {
  std::shared_ptr<std::promise<pjrt::ExecutablePtr>> promise;
  ExeFuture fut;
  {
    std::lock_guard<std::mutex> g(mu_);
    if (Lookup(text, &fut)) return fut;
    GetMetrics().cache_misses++;
    promise = std::make_shared<std::promise<pjrt::ExecutablePtr>>();
    fut = promise->get_future().share();
    inflight_.emplace(text, fut);
  }
  auto job = [this, promise, text, op_program](bool cancelled) {
    pjrt::ExecutablePtr exe;
    try {
      if (cancelled) throw pjrt::Error("compile cancelled: the process is exiting", 1);
      exe = Build(text, op_program);
    } catch (...) {
      {
        std::lock_guard<std::mutex> g(mu_);
        inflight_.erase(text);
      }
      promise->set_exception(std::current_exception());
      return;
    }
    {
      std::lock_guard<std::mutex> g(mu_);
      cache_[text] = exe;
      inflight_.erase(text);
    }
    promise->set_value(exe);
  };
  if (CompileThreads() == 0) job(false);
  else CompilePool::Get().Push(std::move(job));
  return fut;
}

bool Runtime::Lookup(const std::string& text, ExeFuture* out) {
  auto it = cache_.find(text);
  if (it != cache_.end()) {
    *out = Ready(it->second);
  } else {
    auto in = inflight_.find(text);
    if (in == inflight_.end()) return false;
    *out = in->second;
  }
  GetMetrics().cache_hits++;
  return true;
}

Runtime::ExeFuture Runtime::Ready(pjrt::ExecutablePtr exe) {
  std::promise<pjrt::ExecutablePtr> p;
  p.set_value(std::move(exe));
  return p.get_future().share();
}

pjrt::ExecutablePtr Runtime::Executable(const std::string& text, bool op_program) {
  ExeFuture found;
  bool hit;
  {
    std::lock_guard<std::mutex> g(mu_);
    hit = Lookup(text, &found);
  }
  if (hit) return found.get();  // waits for a compile in flight
  // compiled here, on the calling thread (no wait behind queued compiles)
  GetMetrics().cache_misses++;
  pjrt::ExecutablePtr exe = Build(text, op_program);
  std::lock_guard<std::mutex> g(mu_);
  cache_[text] = exe;
  return exe;
}

pjrt::BufferPtr Runtime::Upload(const void* data, PJRT_Buffer_Type type,
                                const std::vector<int64_t>& dims, int64_t nbytes) {
  GetMetrics().h2d_bytes += nbytes;
  return client_->FromHost(data, type, dims, device_, nbytes);
}

pjrt::BufferPtr Runtime::HostResident(std::shared_ptr<const std::string> bytes, PJRT_Buffer_Type type,
                                      int64_t numel) {
  return std::make_shared<pjrt::Buffer>(client_.get(), device_, std::move(bytes), type, numel);
}

size_t Runtime::cache_size() {
  std::lock_guard<std::mutex> g(mu_);
  return cache_.size();
}

void Runtime::ClearCache() {
  std::lock_guard<std::mutex> g(mu_);
  cache_.clear();
}

}  // namespace tt
