// Compiling for a Cloud TPU without one: libtpu's compile-only mode behind
// the PJRT C API (a topology such as "v5e:1x1", PJRT_Compile with no
// client). Two uses:
//   * the TPU check (TORCHTPU_TPU_CHECK=<topology>): every program this
//     process compiles for its own plugin is also compiled for the topology,
//     on a background thread; failures and memory go to TpuCheckReport().
//     Strict (TORCHTPU_TPU_CHECK_STRICT=1): compiled at once, and a failure
//     raises where the program's op runs.
//   * ahead-of-time memory analysis (torchtpu.aot): CompileFor() answers
//     what a program needs of a chip's memory.
// Torch-free; the plugin's path comes from the Python layer.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "pjrt.h"

namespace tt {

struct AotResult {
  bool ok = false;
  std::string error;  // the plugin's reason when !ok
  pjrt::CompiledStats stats;
  double seconds = 0;
};

struct TopologyInfo {
  std::string topology, platform_name, platform_version, plugin_path;
  size_t num_devices = 0;
  std::vector<std::pair<std::string, std::string>> attributes;  // the plugin's (StableHLO versions, ...)
};

// Compiles `text` for `topology` with the plugin at `plugin_path` (loaded once;
// one compile at a time). `num_replicas` > number of the topology's chips is
// refused before the plugin sees it (libtpu aborts the process on it).
AotResult CompileFor(const std::string& plugin_path, const std::string& topology, const std::string& text,
                     int num_replicas = 1);
TopologyInfo DescribeTopology(const std::string& plugin_path, const std::string& topology);

// ---- the TPU check ----
// topology "" turns it off. Throws pjrt::Error if the plugin or topology is unusable.
void ConfigureTpuCheck(const std::string& plugin_path, const std::string& topology, bool strict);
bool TpuCheckOn();
const std::string& TpuCheckTopology();
// A program newly compiled for this process's plugin. Strict: compiles it now
// and throws pjrt::Error naming the topology and the plugin's reason.
void TpuCheckProgram(const std::string& text);

struct TpuCheckFailure {
  std::string error, ops;  // the plugin's reason; the program's distinct StableHLO ops
  std::string text;        // the program (first 64 KiB)
};
struct TpuCheckReport {
  std::string topology;
  int64_t programs = 0, failures = 0, pending = 0;
  double seconds = 0;
  int64_t max_temp = 0, max_argument = 0, max_output = 0, max_peak = 0;
  std::vector<TpuCheckFailure> failed;  // the first 32
  // the programs slowest to compile for the TPU: (seconds, StableHLO ops), the 5 slowest
  std::vector<std::pair<double, std::string>> slowest;
};
// Waits for the queued programs first when `wait`.
TpuCheckReport GetTpuCheckReport(bool wait);
void ResetTpuCheckReport();

// The StableHLO version torchtpu's builder writes: plugins whose current
// version is older cannot be relied on to parse its programs.
extern const int kStableHloWritten[3];
// "" if the plugin's attributes (stablehlo_current_version) admit the
// builder's programs, else the reason, naming both versions.
std::string StableHloVersionProblem(const std::vector<std::pair<std::string, std::string>>& attrs,
                                    const std::string& plugin);

}  // namespace tt
