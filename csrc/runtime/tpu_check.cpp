#include "tpu_check.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <thread>
#include <unordered_set>

namespace tt {

// Every program is tested against the XLA CPU plugin of CI, whose StableHLO
// is 1.13.3 (libtpu 0.0.51 has 1.23.0); an older plugin is refused.
const int kStableHloWritten[3] = {1, 13, 3};

namespace {

std::vector<int> ParseVersion(const std::string& s) {
  std::vector<int> v;
  size_t i = 0;
  while (i < s.size()) {
    size_t j = s.find('.', i);
    if (j == std::string::npos) j = s.size();
    v.push_back(std::atoi(s.substr(i, j - i).c_str()));
    i = j + 1;
  }
  return v;
}

double Seconds(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// One loaded plugin + topology. libtpu compiles are serialized (it keeps
// process-wide state), which also bounds the check's share of the host.
struct Target {
  const pjrt::Api* api = nullptr;
  std::unique_ptr<pjrt::Topology> topo;
  size_t num_devices = 0;
  std::mutex mu;
};

std::mutex g_targets_mu;
std::map<std::pair<std::string, std::string>, std::unique_ptr<Target>> g_targets;

Target& GetTarget(const std::string& plugin_path, const std::string& topology) {
  std::lock_guard<std::mutex> g(g_targets_mu);
  auto key = std::make_pair(plugin_path, topology);
  auto it = g_targets.find(key);
  if (it != g_targets.end()) return *it->second;
  if (plugin_path.empty()) throw pjrt::Error("no TPU compiler: install libtpu (pip install 'torchtpu[tpu]')");
  // libtpu on a host that is no TPU VM: without this its initialisation asks
  // the cloud metadata server, retrying for minutes.
  setenv("TPU_SKIP_MDS_QUERY", "1", 0);
  auto t = std::make_unique<Target>();
  t->api = pjrt::Api::Load(plugin_path);
  std::string problem = StableHloVersionProblem(t->api->Attributes(), plugin_path);
  if (!problem.empty()) throw pjrt::Error(problem);
  try {
    t->topo = std::make_unique<pjrt::Topology>(t->api, topology);
  } catch (const pjrt::Error& e) {
    throw pjrt::Error("TPU topology '" + topology + "': " + e.what() +
                      " (names look like v5e:1x1, v5e:2x2, v6e:2x2, v5p:2x2x1, tpu7x:2x2x1)");
  }
  t->num_devices = t->topo->num_devices();
  return *g_targets.emplace(key, std::move(t)).first->second;
}

// The distinct StableHLO ops of a program, for a report a person can read.
std::string OpsOf(const std::string& text) {
  std::set<std::string> ops;
  size_t p = 0;
  while ((p = text.find("\"stablehlo.", p)) != std::string::npos) {
    size_t e = text.find('"', p + 1);
    if (e == std::string::npos) break;
    ops.insert(text.substr(p + 11, e - p - 11));
    p = e + 1;
  }
  std::string out;
  for (const auto& o : ops) out += (out.empty() ? "" : ",") + o;
  return out;
}

// ---- the TPU check's state ----
struct Check {
  std::mutex mu;
  std::condition_variable cv, idle;
  std::string plugin_path, topology;
  bool strict = false;
  std::atomic<bool> on{false};
  std::deque<std::string> queue;
  std::unordered_set<size_t> seen;  // program text hashes already checked
  bool busy = false;
  std::thread worker;
  TpuCheckReport report;
};

Check& TheCheck() {
  static Check* c = new Check();  // lives with the process (its thread too)
  return *c;
}

void Record(Check& c, const std::string& text, const AotResult& r) {
  // under c.mu
  TpuCheckReport& rep = c.report;
  rep.programs++;
  rep.seconds += r.seconds;
  if (rep.slowest.size() < 5 || r.seconds > rep.slowest.back().first) {
    rep.slowest.emplace_back(r.seconds, OpsOf(text));
    std::sort(rep.slowest.begin(), rep.slowest.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
    if (rep.slowest.size() > 5) rep.slowest.pop_back();
  }
  if (r.ok) {
    rep.max_temp = std::max(rep.max_temp, r.stats.temp);
    rep.max_argument = std::max(rep.max_argument, r.stats.argument);
    rep.max_output = std::max(rep.max_output, r.stats.output);
    rep.max_peak = std::max(rep.max_peak, r.stats.peak);
    return;
  }
  rep.failures++;
  if (rep.failed.size() < 32) rep.failed.push_back({r.error, OpsOf(text), text.substr(0, 64 << 10)});
}

void Worker() {
  Check& c = TheCheck();
  for (;;) {
    std::string text;
    {
      std::unique_lock<std::mutex> g(c.mu);
      c.cv.wait(g, [&] { return !c.queue.empty(); });
      text = std::move(c.queue.front());
      c.queue.pop_front();
      c.busy = true;
    }
    AotResult r = CompileFor(c.plugin_path, c.topology, text);
    {
      std::lock_guard<std::mutex> g(c.mu);
      Record(c, text, r);
      c.busy = false;
    }
    c.idle.notify_all();
  }
}

}  // namespace

std::string StableHloVersionProblem(const std::vector<std::pair<std::string, std::string>>& attrs,
                                    const std::string& plugin) {
  for (const auto& kv : attrs) {
    if (kv.first != "stablehlo_current_version") continue;
    std::vector<int> have = ParseVersion(kv.second);
    std::vector<int> need(kStableHloWritten, kStableHloWritten + 3);
    if (have < need)
      return "PJRT plugin '" + plugin + "' parses StableHLO up to " + kv.second + ", older than the " +
             std::to_string(need[0]) + "." + std::to_string(need[1]) + "." + std::to_string(need[2]) +
             " torchtpu writes: upgrade the plugin";
  }
  return "";
}

AotResult CompileFor(const std::string& plugin_path, const std::string& topology, const std::string& text,
                     int num_replicas) {
  AotResult r;
  auto t0 = std::chrono::steady_clock::now();
  try {
    Target& t = GetTarget(plugin_path, topology);
    if (num_replicas < 1 || (size_t)num_replicas > t.num_devices) {
      r.error = "the program needs " + std::to_string(num_replicas) + " chips, topology " + topology + " has " +
                std::to_string(t.num_devices);
      r.seconds = Seconds(t0);
      return r;
    }
    bool has_dots = text.find("stablehlo.dot") != std::string::npos ||
                    text.find("stablehlo.convolution") != std::string::npos;
    std::string options = pjrt::DefaultCompileOptions("tpu", has_dots, false, num_replicas);
    std::lock_guard<std::mutex> g(t.mu);
    r.stats = t.topo->Compile(text, options);
    r.ok = true;
  } catch (const pjrt::Error& e) {
    r.error = e.what();
  }
  r.seconds = Seconds(t0);
  return r;
}

TopologyInfo DescribeTopology(const std::string& plugin_path, const std::string& topology) {
  Target& t = GetTarget(plugin_path, topology);
  TopologyInfo info;
  info.topology = topology;
  info.plugin_path = plugin_path;
  info.num_devices = t.num_devices;
  info.platform_name = t.topo->platform_name();
  info.platform_version = t.topo->platform_version();
  info.attributes = t.api->Attributes();
  return info;
}

void ConfigureTpuCheck(const std::string& plugin_path, const std::string& topology, bool strict) {
  Check& c = TheCheck();
  if (!topology.empty()) GetTarget(plugin_path, topology);  // fails here, not in the worker
  std::lock_guard<std::mutex> g(c.mu);
  c.plugin_path = plugin_path;
  c.topology = topology;
  c.strict = strict;
  c.report.topology = topology;
  c.on = !topology.empty();
  if (c.on && !c.worker.joinable()) {
    c.worker = std::thread(Worker);
    c.worker.detach();
  }
}

bool TpuCheckOn() { return TheCheck().on.load(std::memory_order_relaxed); }

const std::string& TpuCheckTopology() { return TheCheck().topology; }

void TpuCheckProgram(const std::string& text) {
  Check& c = TheCheck();
  if (!c.on.load(std::memory_order_relaxed)) return;
  std::string plugin, topology;
  {
    std::lock_guard<std::mutex> g(c.mu);
    if (!c.seen.insert(std::hash<std::string>()(text)).second) return;
    if (!c.strict) {
      c.queue.push_back(text);
      c.cv.notify_one();
      return;
    }
    plugin = c.plugin_path;
    topology = c.topology;
  }
  AotResult r = CompileFor(plugin, topology, text);
  {
    std::lock_guard<std::mutex> g(c.mu);
    Record(c, text, r);
    if (!r.ok) c.seen.erase(std::hash<std::string>()(text));  // raises again next time
  }
  if (!r.ok)
    throw pjrt::Error("the program does not compile for TPU " + topology +
                      " (TORCHTPU_TPU_CHECK_STRICT=1): " + r.error);
}

TpuCheckReport GetTpuCheckReport(bool wait) {
  Check& c = TheCheck();
  std::unique_lock<std::mutex> g(c.mu);
  if (wait) c.idle.wait(g, [&] { return c.queue.empty() && !c.busy; });
  TpuCheckReport r = c.report;
  r.pending = (int64_t)c.queue.size() + (c.busy ? 1 : 0);
  return r;
}

void ResetTpuCheckReport() {
  Check& c = TheCheck();
  std::lock_guard<std::mutex> g(c.mu);
  std::string topology = c.report.topology;
  c.report = TpuCheckReport();
  c.report.topology = topology;
}

}  // namespace tt
