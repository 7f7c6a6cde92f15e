// PJRT runtime: RAII wrappers over the PJRT C API. Torch-free; every failed
// call throws tt::pjrt::Error carrying the plugin's message.
#pragma once
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "pjrt_c_api.h"

namespace tt::pjrt {

class Error : public std::runtime_error {
 public:
  Error(std::string msg, int code = 2) : std::runtime_error(std::move(msg)), code_(code) {}
  int code() const { return code_; }  // PJRT_Error_Code
 private:
  int code_;
};

class Api;

// An event returned by the plugin; Await() blocks, destructor destroys it.
class Event {
 public:
  Event(const Api* api, PJRT_Event* ev) : api_(api), ev_(ev) {}
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  ~Event();
  void Await();  // throws the event's error, if any
  bool IsReady() const;
  // Calls fn once the event completes (possibly at once, on another thread).
  void OnReady(std::function<void()> fn);
 private:
  const Api* api_;
  PJRT_Event* ev_;
};

class Client;

// A device buffer. Shared ownership through std::shared_ptr<Buffer>.
class Buffer {
 public:
  Buffer(const Api* api, PJRT_Buffer* buf, int64_t nbytes);
  // A buffer whose bytes (a dense 1-D array) stay on the host until a program
  // or a device transfer first needs them (get()): strict mode's host-tier
  // results, which printing and other host-side chains read back at once.
  Buffer(Client* client, PJRT_Device* device, std::shared_ptr<const std::string> host,
         PJRT_Buffer_Type type, int64_t numel);
  // A buffer that a queued launch will produce (the executor's launch queue,
  // for programs still compiling): every method but nbytes() and IsReady()
  // waits until Resolve() or Fail() is called, and after Fail() throws.
  struct Pending {};
  Buffer(const Api* api, int64_t nbytes, Pending);
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer();
  // The PJRT buffer (uploading a host-resident buffer's bytes first, waiting
  // for a pending one).
  PJRT_Buffer* get() const {
    PJRT_Buffer* b = buf_.load(std::memory_order_acquire);
    return b ? b : Materialize();
  }
  // Whether the bytes are still only on the host.
  bool host_resident() const;
  // Whether a queued launch has yet to produce this buffer.
  bool pending() const { return pending_.load(std::memory_order_acquire); }
  // A pending buffer's value (takes ownership of b) or its launch's error.
  void Resolve(PJRT_Buffer* b);
  void Fail(const std::string& msg, int code);
  // Gives up the PJRT buffer (the caller owns it now; this one holds nothing).
  PJRT_Buffer* Release() { return buf_.exchange(nullptr); }
  std::vector<int64_t> Dims() const;
  PJRT_Buffer_Type ElementType() const;
  int64_t nbytes() const { return nbytes_; }
  bool IsDeleted() const;
  // Synchronous copy of the whole buffer (row-major) into dst (size bytes).
  void ToHost(void* dst, size_t size) const;
  // Synchronous copy of bytes [offset, offset + size) of the buffer's
  // on-device representation. Only meaningful for plugins whose 1-D buffers
  // are stored linearly (CPU, CUDA); false if the plugin does not implement
  // it (nothing copied).
  bool RawToHost(void* dst, int64_t offset, int64_t size) const;
  void AwaitReady() const;
  // Whether the buffer's value has been computed (non-blocking; false while pending).
  bool IsReady() const;
  // Marks the buffer consumed (donated); destructor will then only destroy.
  void MarkDonated() { donated_ = true; }
  // References held by queued launches (not by the program's own values):
  // the executor's donation checks discount them.
  std::atomic<int> queued_refs{0};
  // The sequence number of the launch that produced this buffer (stamped by
  // the executor; 0: an upload or a host-resident buffer).
  int64_t seq = 0;
  static int64_t live_buffers();
  static int64_t live_bytes();
  // Total time threads waited for pending buffers.
  static int64_t pending_wait_ns();
 private:
  PJRT_Buffer* Materialize() const;  // host-resident: upload; pending: wait
  const Api* api_;
  mutable std::atomic<PJRT_Buffer*> buf_;
  int64_t nbytes_;
  bool donated_ = false;
  // host-resident buffers (see above)
  Client* client_ = nullptr;
  PJRT_Device* device_ = nullptr;
  std::shared_ptr<const std::string> host_;
  PJRT_Buffer_Type type_ = PJRT_Buffer_Type_INVALID;
  int64_t numel_ = 0;
  // pending buffers
  std::atomic<bool> pending_{false};
  std::string error_;
  int error_code_ = 0;
  mutable std::condition_variable cv_;
  mutable std::mutex mu_;
};
using BufferPtr = std::shared_ptr<Buffer>;

class Executable {
 public:
  Executable(const Api* api, PJRT_LoadedExecutable* exe);
  Executable(const Executable&) = delete;
  Executable& operator=(const Executable&) = delete;
  ~Executable();
  size_t num_outputs() const { return num_outputs_; }
  // Runs on `device`; donated inputs are consumed by the plugin. Returns the
  // outputs; completion is asynchronous (buffers carry their ready events).
  std::vector<BufferPtr> Execute(PJRT_Device* device,
                                 const std::vector<PJRT_Buffer*>& args,
                                 const std::vector<int64_t>& non_donatable,
                                 bool wait = false,
                                 std::shared_ptr<Event>* done_out = nullptr);
  std::string Serialize() const;
  PJRT_LoadedExecutable* get() const { return exe_; }
 private:
  const Api* api_;
  PJRT_LoadedExecutable* exe_;
  size_t num_outputs_ = 0;
};
using ExecutablePtr = std::shared_ptr<Executable>;

// The loaded plugin (never unloaded).
class Api {
 public:
  static const Api* Load(const std::string& path);  // throws Error
  const PJRT_Api* raw() const { return api_; }
  std::string path() const { return path_; }
  int major() const { return api_->pjrt_api_version.major_version; }
  int minor() const { return api_->pjrt_api_version.minor_version; }
  std::vector<std::pair<std::string, std::string>> Attributes() const;
  // Converts a PJRT_Error into an exception (destroying it); no-op on null.
  void Check(PJRT_Error* err, const char* what) const;
 private:
  explicit Api(const PJRT_Api* api, std::string path) : api_(api), path_(std::move(path)) {}
  const PJRT_Api* api_;
  std::string path_;
};

struct CreateOption {
  std::string name;
  enum Kind { kInt, kString, kBool, kFloat } kind;
  int64_t i = 0;
  std::string s;
  bool b = false;
  float f = 0;
};

class Client {
 public:
  Client(const Api* api, const std::vector<CreateOption>& options);
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;
  ~Client();
  const Api* api() const { return api_; }
  PJRT_Client* get() const { return client_; }
  const std::vector<PJRT_Device*>& devices() const { return devices_; }
  std::string platform_name() const;
  std::string platform_version() const;
  std::string device_kind(size_t i) const;
  std::string device_description(size_t i) const;
  BufferPtr FromHost(const void* data, PJRT_Buffer_Type type,
                     const std::vector<int64_t>& dims, PJRT_Device* device,
                     int64_t nbytes);
  ExecutablePtr Compile(const std::string& mlir_text, const std::string& options);
  ExecutablePtr Deserialize(const std::string& bytes);
 private:
  const Api* api_;
  PJRT_Client* client_ = nullptr;
  std::vector<PJRT_Device*> devices_;
};

// What a compiled program needs of a device's memory
// (PJRT_Executable_GetCompiledMemoryStats, xla::CompiledMemoryStats).
struct CompiledStats {
  int64_t code = 0, argument = 0, output = 0, alias = 0, temp = 0, peak = 0;
};

// A device topology of a plugin that compiles without devices, such as
// libtpu's compile-only mode: PJRT_TopologyDescription_Create("v5e:2x2"),
// then PJRT_Compile with no client. Nothing runs; the result is the memory
// the program would need (or the plugin's reason it cannot compile).
class Topology {
 public:
  Topology(const Api* api, const std::string& name);  // throws Error
  Topology(const Topology&) = delete;
  Topology& operator=(const Topology&) = delete;
  ~Topology();
  const Api* api() const { return api_; }
  const std::string& name() const { return name_; }
  size_t num_devices() const;
  std::string platform_name() const;
  std::string platform_version() const;
  CompiledStats Compile(const std::string& mlir_text, const std::string& options) const;  // throws Error
 private:
  const Api* api_;
  std::string name_;
  PJRT_TopologyDescription* topo_ = nullptr;
};

// Serialized xla.CompileOptionsProto (num_replicas = num_partitions = 1,
// hand-encoded protobuf wire format) for `platform` (PJRT_Client_PlatformName:
// "cpu", "cuda", "tpu") with the overrides of TORCHTPU_XLA_OPTIONS; `has_dots`:
// the program holds dot_general or convolution ops.
// `legacy_emitters`: XLA:CPU's elemental IR emitter instead of the fusion
// emitters (xla_cpu_use_fusion_emitters=false) unless TORCHTPU_XLA_OPTIONS
// sets that option.
// `num_replicas` > 1: a replicated (SPMD over replicas) program; then not portable.
std::string DefaultCompileOptions(const std::string& platform = "", bool has_dots = true,
                                  bool legacy_emitters = false, int num_replicas = 1);

size_t ElementSize(PJRT_Buffer_Type t);

}  // namespace tt::pjrt
