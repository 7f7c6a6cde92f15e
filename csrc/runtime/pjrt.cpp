#include "pjrt.h"

#include <dlfcn.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <thread>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <unordered_map>

namespace tt::pjrt {

namespace {
std::atomic<int64_t> g_live_buffers{0};
std::atomic<int64_t> g_live_bytes{0};
std::atomic<int64_t> g_pending_wait_ns{0};

template <typename T>
T MakeArgs(size_t size) {
  T a;
  std::memset(&a, 0, sizeof(T));
  a.struct_size = size;
  return a;
}
#define ARGS(T) MakeArgs<T##_Args>(T##_Args_STRUCT_SIZE)

// A StableHLO module's text as a PJRT program (borrows `text`).
PJRT_Program MlirProgram(const std::string& text) {
  auto p = MakeArgs<PJRT_Program>(PJRT_Program_STRUCT_SIZE);
  p.code = const_cast<char*>(text.data());
  p.code_size = text.size();
  static const char kFormat[] = "mlir";
  p.format = kFormat;
  p.format_size = 4;
  return p;
}

// True if the plugin's PJRT_Api struct is large enough to contain `field`.
#define HAS_FN(api, field) \
  (offsetof(PJRT_Api, field) + sizeof(void*) <= (api)->struct_size && (api)->field != nullptr)
}  // namespace

// ---------------------------------------------------------------- Api
const Api* Api::Load(const std::string& path) {
  static std::mutex mu;
  static std::unordered_map<std::string, Api*> loaded;
  std::lock_guard<std::mutex> lock(mu);
  auto it = loaded.find(path);
  if (it != loaded.end()) return it->second;
  void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!h) throw Error(std::string("cannot load PJRT plugin '") + path + "': " + dlerror());
  using GetFn = const PJRT_Api* (*)();
  auto get = reinterpret_cast<GetFn>(dlsym(h, "GetPjrtApi"));
  if (!get) throw Error("'" + path + "' is not a PJRT plugin (no GetPjrtApi symbol)");
  const PJRT_Api* raw = get();
  if (!raw) throw Error("GetPjrtApi of '" + path + "' returned null");
  if (raw->pjrt_api_version.major_version != PJRT_API_MAJOR)
    throw Error("PJRT plugin '" + path + "' has API major version " +
                std::to_string(raw->pjrt_api_version.major_version) + ", torchtpu was built against " +
                std::to_string(PJRT_API_MAJOR));
  auto* api = new Api(raw, path);  // never freed, like the plugin
  if (HAS_FN(raw, PJRT_Plugin_Initialize)) {
    auto a = ARGS(PJRT_Plugin_Initialize);
    api->Check(raw->PJRT_Plugin_Initialize(&a), "PJRT_Plugin_Initialize");
  }
  loaded[path] = api;
  return api;
}

void Api::Check(PJRT_Error* err, const char* what) const {
  if (!err) return;
  auto m = ARGS(PJRT_Error_Message);
  m.error = err;
  api_->PJRT_Error_Message(&m);
  std::string msg(m.message, m.message_size);
  auto c = ARGS(PJRT_Error_GetCode);
  c.error = err;
  int code = 2;
  if (!api_->PJRT_Error_GetCode(&c)) code = c.code;
  auto d = ARGS(PJRT_Error_Destroy);
  d.error = err;
  api_->PJRT_Error_Destroy(&d);
  throw Error(std::string(what) + " failed: " + msg, code);
}

std::vector<std::pair<std::string, std::string>> Api::Attributes() const {
  std::vector<std::pair<std::string, std::string>> out;
  if (!HAS_FN(api_, PJRT_Plugin_Attributes)) return out;
  auto a = ARGS(PJRT_Plugin_Attributes);
  Check(api_->PJRT_Plugin_Attributes(&a), "PJRT_Plugin_Attributes");
  for (size_t i = 0; i < a.num_attributes; ++i) {
    const PJRT_NamedValue& nv = a.attributes[i];
    std::string name(nv.name, nv.name_size), val;
    switch (nv.type) {
      case PJRT_NamedValue_kString: val.assign(nv.string_value, nv.value_size); break;
      case PJRT_NamedValue_kInt64: val = std::to_string(nv.int64_value); break;
      case PJRT_NamedValue_kInt64List:
        for (size_t k = 0; k < nv.value_size; ++k)
          val += (k ? "." : "") + std::to_string(nv.int64_array_value[k]);
        break;
      case PJRT_NamedValue_kFloat: val = std::to_string(nv.float_value); break;
      case PJRT_NamedValue_kBool: val = nv.bool_value ? "true" : "false"; break;
    }
    out.emplace_back(name, val);
  }
  return out;
}

// ---------------------------------------------------------------- Event
Event::~Event() {
  if (!ev_) return;
  auto a = ARGS(PJRT_Event_Destroy);
  a.event = ev_;
  api_->raw()->PJRT_Event_Destroy(&a);
}

void Event::Await() {
  auto a = ARGS(PJRT_Event_Await);
  a.event = ev_;
  api_->Check(api_->raw()->PJRT_Event_Await(&a), "PJRT_Event_Await");
}

bool Event::IsReady() const {
  auto a = ARGS(PJRT_Event_IsReady);
  a.event = ev_;
  api_->Check(api_->raw()->PJRT_Event_IsReady(&a), "PJRT_Event_IsReady");
  return a.is_ready;
}

namespace {
void OnReadyTrampoline(PJRT_Error* error, void* user_arg) {
  auto* fn = static_cast<std::function<void()>*>(user_arg);
  (*fn)();
  delete fn;
  if (error) {
    // The error is reported again by Await; destroy this copy.
    (void)error;
  }
}
}  // namespace

void Event::OnReady(std::function<void()> fn) {
  auto a = ARGS(PJRT_Event_OnReady);
  a.event = ev_;
  a.callback = &OnReadyTrampoline;
  a.user_arg = new std::function<void()>(std::move(fn));
  api_->Check(api_->raw()->PJRT_Event_OnReady(&a), "PJRT_Event_OnReady");
}

// ---------------------------------------------------------------- Buffer
Buffer::Buffer(const Api* api, PJRT_Buffer* buf, int64_t nbytes)
    : api_(api), buf_(buf), nbytes_(nbytes) {
  g_live_buffers++;
  g_live_bytes += nbytes_;
}

Buffer::Buffer(Client* client, PJRT_Device* device, std::shared_ptr<const std::string> host,
               PJRT_Buffer_Type type, int64_t numel)
    : api_(client->api()), buf_(nullptr), nbytes_((int64_t)host->size()), client_(client),
      device_(device), host_(std::move(host)), type_(type), numel_(numel) {
  g_live_buffers++;
  g_live_bytes += nbytes_;
}

Buffer::Buffer(const Api* api, int64_t nbytes, Pending)
    : api_(api), buf_(nullptr), nbytes_(nbytes), pending_(true) {
  g_live_buffers++;
  g_live_bytes += nbytes_;
}

PJRT_Buffer* Buffer::Materialize() const {
  std::unique_lock<std::mutex> l(mu_);
  if (pending_.load(std::memory_order_acquire)) {
    auto t0 = std::chrono::steady_clock::now();
    cv_.wait(l, [this] { return !pending_.load(std::memory_order_acquire); });
    g_pending_wait_ns += std::chrono::duration_cast<std::chrono::nanoseconds>(
                             std::chrono::steady_clock::now() - t0).count();
  }
  if (PJRT_Buffer* b = buf_.load(std::memory_order_acquire)) return b;
  if (!error_.empty()) throw Error(error_, error_code_);
  if (!host_) throw Error("buffer has no value (deleted)", 9);
  BufferPtr up = client_->FromHost(host_->data(), type_, {numel_}, device_, nbytes_);
  PJRT_Buffer* b = up->buf_.exchange(nullptr);  // ours now
  buf_.store(b, std::memory_order_release);
  return b;
}

void Buffer::Resolve(PJRT_Buffer* b) {
  {
    std::lock_guard<std::mutex> g(mu_);
    buf_.store(b, std::memory_order_release);
    pending_.store(false, std::memory_order_release);
  }
  cv_.notify_all();
}

void Buffer::Fail(const std::string& msg, int code) {
  {
    std::lock_guard<std::mutex> g(mu_);
    error_ = msg.empty() ? std::string("launch failed") : msg;
    error_code_ = code;
    pending_.store(false, std::memory_order_release);
  }
  cv_.notify_all();
}

int64_t Buffer::pending_wait_ns() { return g_pending_wait_ns.load(); }

bool Buffer::host_resident() const {
  // an ordinary buffer (host_ is fixed at construction), or uploaded already
  return host_ && !buf_.load(std::memory_order_acquire);
}

namespace {
// Destroying a buffer waits for the executions still reading it; a
// background thread does it so the host never blocks on the device here.
class Reaper {
 public:
  static Reaper& Get() {
    static Reaper* r = new Reaper();  // never destroyed: runs until exit
    return *r;
  }
  void Push(const Api* api, PJRT_Buffer* b) {
    {
      std::lock_guard<std::mutex> g(mu_);
      q_.emplace_back(api, b);
    }
    cv_.notify_one();
  }
 private:
  Reaper() : th_([this] { Run(); }) { th_.detach(); }
  void Run() {
    for (;;) {
      std::vector<std::pair<const Api*, PJRT_Buffer*>> batch;
      {
        std::unique_lock<std::mutex> l(mu_);
        cv_.wait(l, [this] { return !q_.empty(); });
        batch.swap(q_);
      }
      for (auto& [api, b] : batch) {
        auto a = ARGS(PJRT_Buffer_Destroy);
        a.buffer = b;
        PJRT_Error* e = api->raw()->PJRT_Buffer_Destroy(&a);
        if (e) {
          try { api->Check(e, "PJRT_Buffer_Destroy"); } catch (...) {}
        }
      }
    }
  }
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::pair<const Api*, PJRT_Buffer*>> q_;
  std::thread th_;
};
}  // namespace

Buffer::~Buffer() {
  g_live_buffers--;
  g_live_bytes -= nbytes_;
  PJRT_Buffer* b = buf_.load();
  if (!b) return;
  Reaper::Get().Push(api_, b);
}

int64_t Buffer::live_buffers() { return g_live_buffers.load(); }
int64_t Buffer::live_bytes() { return g_live_bytes.load(); }

std::vector<int64_t> Buffer::Dims() const {
  if (host_resident()) return {numel_};
  auto a = ARGS(PJRT_Buffer_Dimensions);
  a.buffer = get();
  api_->Check(api_->raw()->PJRT_Buffer_Dimensions(&a), "PJRT_Buffer_Dimensions");
  return std::vector<int64_t>(a.dims, a.dims + a.num_dims);
}

PJRT_Buffer_Type Buffer::ElementType() const {
  if (host_resident()) return type_;
  auto a = ARGS(PJRT_Buffer_ElementType);
  a.buffer = get();
  api_->Check(api_->raw()->PJRT_Buffer_ElementType(&a), "PJRT_Buffer_ElementType");
  return a.type;
}

bool Buffer::IsDeleted() const {
  if (host_resident()) return false;
  auto a = ARGS(PJRT_Buffer_IsDeleted);
  a.buffer = get();
  api_->Check(api_->raw()->PJRT_Buffer_IsDeleted(&a), "PJRT_Buffer_IsDeleted");
  return a.is_deleted;
}

bool Buffer::IsReady() const {
  if (pending()) return false;
  if (host_resident()) return true;
  auto a = ARGS(PJRT_Buffer_ReadyEvent);
  a.buffer = get();
  api_->Check(api_->raw()->PJRT_Buffer_ReadyEvent(&a), "PJRT_Buffer_ReadyEvent");
  Event ev(api_, a.event);
  auto r = ARGS(PJRT_Event_IsReady);
  r.event = a.event;
  api_->Check(api_->raw()->PJRT_Event_IsReady(&r), "PJRT_Event_IsReady");
  return r.is_ready;
}

void Buffer::AwaitReady() const {
  if (host_resident()) return;
  auto a = ARGS(PJRT_Buffer_ReadyEvent);
  a.buffer = get();
  api_->Check(api_->raw()->PJRT_Buffer_ReadyEvent(&a), "PJRT_Buffer_ReadyEvent");
  Event ev(api_, a.event);
  ev.Await();
}

void Buffer::ToHost(void* dst, size_t size) const {
  if (size == 0) return;
  if (host_resident()) {
    std::memcpy(dst, host_->data(), std::min(size, host_->size()));
    return;
  }
  // Ask for a dense row-major host layout (minor_to_major = n-1..0).
  std::vector<int64_t> dims = Dims();
  std::vector<int64_t> m2m(dims.size());
  for (size_t i = 0; i < dims.size(); ++i) m2m[i] = (int64_t)dims.size() - 1 - (int64_t)i;
  PJRT_Buffer_MemoryLayout layout;
  std::memset(&layout, 0, sizeof(layout));
  layout.struct_size = PJRT_Buffer_MemoryLayout_STRUCT_SIZE;
  layout.type = PJRT_Buffer_MemoryLayout_Type_Tiled;
  layout.tiled.struct_size = PJRT_Buffer_MemoryLayout_Tiled_STRUCT_SIZE;
  layout.tiled.minor_to_major = m2m.data();
  layout.tiled.minor_to_major_size = m2m.size();
  layout.tiled.num_tiles = 0;
  auto a = ARGS(PJRT_Buffer_ToHostBuffer);
  a.src = get();
  a.host_layout = dims.size() > 1 ? &layout : nullptr;
  a.dst = dst;
  a.dst_size = size;
  api_->Check(api_->raw()->PJRT_Buffer_ToHostBuffer(&a), "PJRT_Buffer_ToHostBuffer");
  Event ev(api_, a.event);
  ev.Await();
}

bool Buffer::RawToHost(void* dst, int64_t offset, int64_t size) const {
  if (host_resident()) {
    if (offset < 0 || offset + size > (int64_t)host_->size()) return false;
    std::memcpy(dst, host_->data() + offset, size);
    return true;
  }
  if (!HAS_FN(api_->raw(), PJRT_Buffer_CopyRawToHost)) return false;
  // The value first: XLA:CPU's raw copy of an output whose execution was
  // launched a moment ago (its device memory not yet allocated) crashes in
  // the plugin (CpuRawBuffer::GetOnDeviceSizeInBytes); the copy waits for the
  // value anyway.
  AwaitReady();
  auto a = ARGS(PJRT_Buffer_CopyRawToHost);
  a.buffer = get();
  a.dst = dst;
  a.offset = offset;
  a.transfer_size = size;
  try {
    api_->Check(api_->raw()->PJRT_Buffer_CopyRawToHost(&a), "PJRT_Buffer_CopyRawToHost");
  } catch (const Error& e) {
    if (e.code() == 12 /* UNIMPLEMENTED */) return false;
    throw;
  }
  Event ev(api_, a.event);
  ev.Await();
  return true;
}

// ---------------------------------------------------------------- Executable
Executable::Executable(const Api* api, PJRT_LoadedExecutable* exe) : api_(api), exe_(exe) {
  auto g = ARGS(PJRT_LoadedExecutable_GetExecutable);
  g.loaded_executable = exe_;
  api_->Check(api_->raw()->PJRT_LoadedExecutable_GetExecutable(&g),
              "PJRT_LoadedExecutable_GetExecutable");
  auto n = ARGS(PJRT_Executable_NumOutputs);
  n.executable = g.executable;
  PJRT_Error* e = api_->raw()->PJRT_Executable_NumOutputs(&n);
  num_outputs_ = n.num_outputs;
  auto d = ARGS(PJRT_Executable_Destroy);
  d.executable = g.executable;
  api_->raw()->PJRT_Executable_Destroy(&d);
  api_->Check(e, "PJRT_Executable_NumOutputs");
}

Executable::~Executable() {
  auto a = ARGS(PJRT_LoadedExecutable_Destroy);
  a.executable = exe_;
  PJRT_Error* e = api_->raw()->PJRT_LoadedExecutable_Destroy(&a);
  if (e) {
    try { api_->Check(e, "PJRT_LoadedExecutable_Destroy"); } catch (...) {}
  }
}

std::vector<BufferPtr> Executable::Execute(PJRT_Device* device,
                                           const std::vector<PJRT_Buffer*>& args,
                                           const std::vector<int64_t>& non_donatable,
                                           bool wait, std::shared_ptr<Event>* done_out) {
  auto opts = MakeArgs<PJRT_ExecuteOptions>(PJRT_ExecuteOptions_STRUCT_SIZE);
  opts.non_donatable_input_indices = non_donatable.data();
  opts.num_non_donatable_input_indices = non_donatable.size();
  std::vector<PJRT_Buffer*> outs(num_outputs_ ? num_outputs_ : 1, nullptr);
  PJRT_Buffer* const* arg_list = args.data();
  PJRT_Buffer** out_list = outs.data();
  PJRT_Event* done = nullptr;
  auto a = ARGS(PJRT_LoadedExecutable_Execute);
  a.executable = exe_;
  a.options = &opts;
  a.argument_lists = &arg_list;
  a.num_devices = 1;
  a.num_args = args.size();
  a.output_lists = &out_list;
  a.device_complete_events = (wait || done_out) ? &done : nullptr;
  a.execute_device = device;
  api_->Check(api_->raw()->PJRT_LoadedExecutable_Execute(&a), "PJRT_LoadedExecutable_Execute");
  std::vector<BufferPtr> result;
  result.reserve(num_outputs_);
  for (size_t i = 0; i < num_outputs_; ++i) {
    auto sz = ARGS(PJRT_Buffer_OnDeviceSizeInBytes);
    sz.buffer = outs[i];
    int64_t nbytes = 0;
    if (!api_->raw()->PJRT_Buffer_OnDeviceSizeInBytes(&sz)) nbytes = sz.on_device_size_in_bytes;
    result.push_back(std::make_shared<Buffer>(api_, outs[i], nbytes));
  }
  if (done) {
    auto ev = std::make_shared<Event>(api_, done);
    if (wait) ev->Await();
    if (done_out) *done_out = ev;
  }
  return result;
}

std::string Executable::Serialize() const {
  auto g = ARGS(PJRT_LoadedExecutable_GetExecutable);
  g.loaded_executable = exe_;
  api_->Check(api_->raw()->PJRT_LoadedExecutable_GetExecutable(&g),
              "PJRT_LoadedExecutable_GetExecutable");
  auto s = ARGS(PJRT_Executable_Serialize);
  s.executable = g.executable;
  PJRT_Error* e = api_->raw()->PJRT_Executable_Serialize(&s);
  std::string out;
  if (!e) {
    out.assign(s.serialized_bytes, s.serialized_bytes_size);
    if (s.serialized_executable_deleter) s.serialized_executable_deleter(s.serialized_executable);
  }
  auto d = ARGS(PJRT_Executable_Destroy);
  d.executable = g.executable;
  api_->raw()->PJRT_Executable_Destroy(&d);
  api_->Check(e, "PJRT_Executable_Serialize");
  return out;
}

// ---------------------------------------------------------------- Client
Client::Client(const Api* api, const std::vector<CreateOption>& options) : api_(api) {
  std::vector<PJRT_NamedValue> nvs;
  for (const auto& o : options) {
    PJRT_NamedValue nv;
    std::memset(&nv, 0, sizeof(nv));
    nv.struct_size = PJRT_NamedValue_STRUCT_SIZE;
    nv.name = o.name.c_str();
    nv.name_size = o.name.size();
    switch (o.kind) {
      case CreateOption::kInt: nv.type = PJRT_NamedValue_kInt64; nv.int64_value = o.i; nv.value_size = 1; break;
      case CreateOption::kString:
        nv.type = PJRT_NamedValue_kString; nv.string_value = o.s.c_str(); nv.value_size = o.s.size(); break;
      case CreateOption::kBool: nv.type = PJRT_NamedValue_kBool; nv.bool_value = o.b; nv.value_size = 1; break;
      case CreateOption::kFloat: nv.type = PJRT_NamedValue_kFloat; nv.float_value = o.f; nv.value_size = 1; break;
    }
    nvs.push_back(nv);
  }
  auto a = ARGS(PJRT_Client_Create);
  a.create_options = nvs.data();
  a.num_options = nvs.size();
  api_->Check(api_->raw()->PJRT_Client_Create(&a), "PJRT_Client_Create");
  client_ = a.client;
  auto d = ARGS(PJRT_Client_AddressableDevices);
  d.client = client_;
  api_->Check(api_->raw()->PJRT_Client_AddressableDevices(&d), "PJRT_Client_AddressableDevices");
  devices_.assign(d.addressable_devices, d.addressable_devices + d.num_addressable_devices);
}

Client::~Client() {
  auto a = ARGS(PJRT_Client_Destroy);
  a.client = client_;
  PJRT_Error* e = api_->raw()->PJRT_Client_Destroy(&a);
  if (e) {
    try { api_->Check(e, "PJRT_Client_Destroy"); } catch (...) {}
  }
}

std::string Client::platform_name() const {
  auto a = ARGS(PJRT_Client_PlatformName);
  a.client = client_;
  api_->Check(api_->raw()->PJRT_Client_PlatformName(&a), "PJRT_Client_PlatformName");
  return std::string(a.platform_name, a.platform_name_size);
}

std::string Client::platform_version() const {
  auto a = ARGS(PJRT_Client_PlatformVersion);
  a.client = client_;
  api_->Check(api_->raw()->PJRT_Client_PlatformVersion(&a), "PJRT_Client_PlatformVersion");
  return std::string(a.platform_version, a.platform_version_size);
}

static PJRT_DeviceDescription* Describe(const Api* api, PJRT_Device* dev) {
  auto a = ARGS(PJRT_Device_GetDescription);
  a.device = dev;
  api->Check(api->raw()->PJRT_Device_GetDescription(&a), "PJRT_Device_GetDescription");
  return a.device_description;
}

std::string Client::device_kind(size_t i) const {
  auto a = ARGS(PJRT_DeviceDescription_Kind);
  a.device_description = Describe(api_, devices_.at(i));
  api_->Check(api_->raw()->PJRT_DeviceDescription_Kind(&a), "PJRT_DeviceDescription_Kind");
  return std::string(a.device_kind, a.device_kind_size);
}

std::string Client::device_description(size_t i) const {
  auto a = ARGS(PJRT_DeviceDescription_DebugString);
  a.device_description = Describe(api_, devices_.at(i));
  api_->Check(api_->raw()->PJRT_DeviceDescription_DebugString(&a),
              "PJRT_DeviceDescription_DebugString");
  return std::string(a.debug_string, a.debug_string_size);
}

BufferPtr Client::FromHost(const void* data, PJRT_Buffer_Type type,
                           const std::vector<int64_t>& dims, PJRT_Device* device,
                           int64_t nbytes) {
  auto a = ARGS(PJRT_Client_BufferFromHostBuffer);
  a.client = client_;
  a.data = data;
  a.type = type;
  a.dims = dims.data();
  a.num_dims = dims.size();
  a.host_buffer_semantics = PJRT_HostBufferSemantics_kImmutableOnlyDuringCall;
  a.device = device;
  api_->Check(api_->raw()->PJRT_Client_BufferFromHostBuffer(&a),
              "PJRT_Client_BufferFromHostBuffer");
  if (a.done_with_host_buffer) {
    Event ev(api_, a.done_with_host_buffer);
    ev.Await();
  }
  return std::make_shared<Buffer>(api_, a.buffer, nbytes);
}

ExecutablePtr Client::Compile(const std::string& text, const std::string& options) {
  PJRT_Program p = MlirProgram(text);
  auto a = ARGS(PJRT_Client_Compile);
  a.client = client_;
  a.program = &p;
  a.compile_options = options.data();
  a.compile_options_size = options.size();
  api_->Check(api_->raw()->PJRT_Client_Compile(&a), "PJRT_Client_Compile");
  return std::make_shared<Executable>(api_, a.executable);
}

ExecutablePtr Client::Deserialize(const std::string& bytes) {
  auto a = ARGS(PJRT_Executable_DeserializeAndLoad);
  a.client = client_;
  a.serialized_executable = bytes.data();
  a.serialized_executable_size = bytes.size();
  api_->Check(api_->raw()->PJRT_Executable_DeserializeAndLoad(&a),
              "PJRT_Executable_DeserializeAndLoad");
  return std::make_shared<Executable>(api_, a.loaded_executable);
}

// ---------------------------------------------------------------- Topology
Topology::Topology(const Api* api, const std::string& name) : api_(api), name_(name) {
  if (!HAS_FN(api->raw(), PJRT_TopologyDescription_Create) || !HAS_FN(api->raw(), PJRT_Compile))
    throw Error("PJRT plugin '" + api->path() + "' cannot compile for a topology without devices");
  auto a = ARGS(PJRT_TopologyDescription_Create);
  a.topology_name = name.data();
  a.topology_name_size = name.size();
  api->Check(api->raw()->PJRT_TopologyDescription_Create(&a), "PJRT_TopologyDescription_Create");
  topo_ = a.topology;
}

Topology::~Topology() {
  if (!topo_) return;
  auto a = ARGS(PJRT_TopologyDescription_Destroy);
  a.topology = topo_;
  api_->raw()->PJRT_TopologyDescription_Destroy(&a);
}

size_t Topology::num_devices() const {
  auto a = ARGS(PJRT_TopologyDescription_GetDeviceDescriptions);
  a.topology = topo_;
  api_->Check(api_->raw()->PJRT_TopologyDescription_GetDeviceDescriptions(&a),
              "PJRT_TopologyDescription_GetDeviceDescriptions");
  return a.num_descriptions;
}

std::string Topology::platform_name() const {
  auto a = ARGS(PJRT_TopologyDescription_PlatformName);
  a.topology = topo_;
  api_->Check(api_->raw()->PJRT_TopologyDescription_PlatformName(&a), "PJRT_TopologyDescription_PlatformName");
  return std::string(a.platform_name, a.platform_name_size);
}

std::string Topology::platform_version() const {
  auto a = ARGS(PJRT_TopologyDescription_PlatformVersion);
  a.topology = topo_;
  api_->Check(api_->raw()->PJRT_TopologyDescription_PlatformVersion(&a),
              "PJRT_TopologyDescription_PlatformVersion");
  return std::string(a.platform_version, a.platform_version_size);
}

CompiledStats Topology::Compile(const std::string& text, const std::string& options) const {
  PJRT_Program p = MlirProgram(text);
  auto a = ARGS(PJRT_Compile);
  a.topology = topo_;
  a.program = &p;
  a.compile_options = options.data();
  a.compile_options_size = options.size();
  a.client = nullptr;
  api_->Check(api_->raw()->PJRT_Compile(&a), "PJRT_Compile");
  CompiledStats st;
  PJRT_Error* err = nullptr;
  if (HAS_FN(api_->raw(), PJRT_Executable_GetCompiledMemoryStats)) {
    auto m = ARGS(PJRT_Executable_GetCompiledMemoryStats);
    m.executable = a.executable;
    err = api_->raw()->PJRT_Executable_GetCompiledMemoryStats(&m);
    if (!err) {
      st.code = m.generated_code_size_in_bytes;
      st.argument = m.argument_size_in_bytes;
      st.output = m.output_size_in_bytes;
      st.alias = m.alias_size_in_bytes;
      st.temp = m.temp_size_in_bytes;
      st.peak = m.peak_memory_in_bytes;
    }
  }
  auto d = ARGS(PJRT_Executable_Destroy);
  d.executable = a.executable;
  api_->raw()->PJRT_Executable_Destroy(&d);
  api_->Check(err, "PJRT_Executable_GetCompiledMemoryStats");
  return st;
}

std::string DefaultCompileOptions(const std::string& platform, bool has_dots, bool legacy_emitters,
                                  int num_replicas) {
  // CompileOptionsProto { executable_build_options (3) { num_replicas (4) = 1,
  //                                                      num_partitions (5) = 1 },
  //                       compile_portable_executable (4) = true }
  // Portable: the executable runs on the device given at execution, which is
  // the one device this process drives (not necessarily device 0).
  static const char kBytes[] = {0x1a, 0x04, 0x20, 0x01, 0x28, 0x01, 0x20, 0x01};
  std::string out(kBytes, sizeof(kBytes));
  if (num_replicas > 1) {  // a replicated program runs on the device assignment's devices: not portable
    if (num_replicas > 127) throw Error("num_replicas " + std::to_string(num_replicas) + " > 127");
    out[3] = (char)num_replicas;
    out.resize(6);
  }
  // XLA debug-option overrides: TORCHTPU_XLA_OPTIONS="name=value,name=value"
  // (env_option_overrides, field 7: map<string, OptionOverrideProto>).
  std::string spec;
  if (const char* env = std::getenv("TORCHTPU_XLA_OPTIONS")) spec = env;
  // XLA:CPU keeps to 256-bit vectors by default (a guard against the clock
  // throttling of early AVX-512 parts); on a host with AVX-512 the fused
  // elementwise loops of defer_and_fuse regions run up to 2x faster with
  // 512-bit vectors. Programs with dots or convolutions keep the default (no
  // gain measured on the GPT training step, sometimes a loss). An explicit
  // setting wins.
  if (platform == "cpu" && !has_dots && spec.find("xla_cpu_prefer_vector_width") == std::string::npos &&
      __builtin_cpu_supports("avx512f"))
    spec += std::string(spec.empty() ? "" : ",") + "xla_cpu_prefer_vector_width=512";
  if (platform == "cpu" && legacy_emitters && spec.find("xla_cpu_use_fusion_emitters") == std::string::npos)
    spec += std::string(spec.empty() ? "" : ",") + "xla_cpu_use_fusion_emitters=false";
  if (!spec.empty()) {
    size_t pos = 0;
    while (pos < spec.size()) {
      size_t end = spec.find(',', pos);
      if (end == std::string::npos) end = spec.size();
      std::string item = spec.substr(pos, end - pos);
      pos = end + 1;
      size_t eq = item.find('=');
      if (eq == std::string::npos) continue;
      std::string key = item.substr(0, eq), val = item.substr(eq + 1);
      std::string ov;  // OptionOverrideProto
      auto varint = [](std::string& o, uint64_t v) {
        do {
          uint8_t b = v & 0x7f;
          v >>= 7;
          o.push_back((char)(b | (v ? 0x80 : 0)));
        } while (v);
      };
      if (val == "true" || val == "false") {
        ov.push_back(0x10);
        varint(ov, val == "true");
      } else if (!val.empty() && (isdigit((unsigned char)val[0]) || val[0] == '-') &&
                 val.find_first_not_of("-0123456789") == std::string::npos) {
        ov.push_back(0x18);
        varint(ov, (uint64_t)std::stoll(val));
      } else {
        ov.push_back(0x0a);
        varint(ov, val.size());
        ov += val;
      }
      std::string entry;
      entry.push_back(0x0a);
      varint(entry, key.size());
      entry += key;
      entry.push_back(0x12);
      varint(entry, ov.size());
      entry += ov;
      out.push_back(0x3a);
      varint(out, entry.size());
      out += entry;
    }
  }
  return out;
}

size_t ElementSize(PJRT_Buffer_Type t) {
  switch (t) {
    case PJRT_Buffer_Type_PRED: case PJRT_Buffer_Type_S8: case PJRT_Buffer_Type_U8:
    case PJRT_Buffer_Type_F8E5M2: case PJRT_Buffer_Type_F8E4M3FN: case PJRT_Buffer_Type_F8E8M0FNU:
    case PJRT_Buffer_Type_F8E4M3FNUZ: case PJRT_Buffer_Type_F8E5M2FNUZ:
      return 1;
    case PJRT_Buffer_Type_S16: case PJRT_Buffer_Type_U16: case PJRT_Buffer_Type_F16:
    case PJRT_Buffer_Type_BF16:
      return 2;
    case PJRT_Buffer_Type_S32: case PJRT_Buffer_Type_U32: case PJRT_Buffer_Type_F32:
      return 4;
    case PJRT_Buffer_Type_S64: case PJRT_Buffer_Type_U64: case PJRT_Buffer_Type_F64:
    case PJRT_Buffer_Type_C64:
      return 8;
    case PJRT_Buffer_Type_C128:
      return 16;
    default:
      return 0;
  }
}

}  // namespace tt::pjrt
