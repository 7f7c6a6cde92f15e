// PrivateUse1 hooks, device guard, generator.
#include <ATen/core/CachingHostAllocator.h>
#include <ATen/core/GeneratorForPrivateuseone.h>
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/Exception.h>

#include <ATen/ops/empty.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/alloc_cpu.h>

#include <map>
#include <mutex>

#include "core/exec/events.h"
#include "core/exec/executor.h"
#include "core/device/generator.h"
#include "runtime/runtime.h"
#include "core/device/storage.h"

namespace tt {

// ---------------------------------------------------------------- generator
TpuGenerator::TpuGenerator(c10::DeviceIndex idx)
    : c10::GeneratorImpl(c10::Device(c10::DeviceType::PrivateUse1, idx),
                         c10::DispatchKeySet(c10::DispatchKey::PrivateUse1)) {}

void TpuGenerator::set_current_seed(uint64_t seed) {
  seed_ = seed;
  offset_ = 0;
}

uint64_t TpuGenerator::seed() {
  uint64_t s = c10::detail::getNonDeterministicRandom();
  set_current_seed(s);
  return s;
}

// State layout (uint8 CPU tensor of 16 bytes): seed (u64), offset (u64).
void TpuGenerator::set_state(const c10::TensorImpl& new_state) {
  TORCH_CHECK(new_state.numel() == 16 && new_state.dtype() == caffe2::TypeMeta::Make<uint8_t>(),
              "torchtpu: RNG state must be a uint8 tensor of 16 bytes");
  const uint8_t* p = static_cast<const uint8_t*>(new_state.data());
  std::memcpy(&seed_, p, 8);
  std::memcpy(&offset_, p + 8, 8);
}

c10::intrusive_ptr<c10::TensorImpl> TpuGenerator::get_state() const {
  auto t = at::empty({16}, at::TensorOptions().dtype(at::kByte));
  uint8_t* p = t.data_ptr<uint8_t>();
  std::memcpy(p, &seed_, 8);
  std::memcpy(p + 8, &offset_, 8);
  return t.getIntrusivePtr();
}

std::pair<uint64_t, uint64_t> TpuGenerator::Next(uint64_t n) {
  auto r = std::make_pair(seed_, offset_);
  offset_ += (n + 3) / 4 * 4;
  return r;
}

TpuGenerator* TpuGenerator::clone_impl() const {
  auto* g = new TpuGenerator(device().index());
  g->seed_ = seed_;
  g->offset_ = offset_;
  return g;
}

const at::Generator& DefaultGenerator(c10::DeviceIndex idx) {
  static at::Generator g = at::make_generator<TpuGenerator>(idx);
  (void)idx;
  return g;
}

// ---------------------------------------------------------------- pinned host memory
// Host memory handed out for pin_memory=True. PJRT copies from any host
// memory, so "pinned" buffers are ordinary allocations that we remember, so
// that Tensor.is_pinned() answers truthfully. Never takes the GIL.
namespace {
std::mutex g_pinned_mu;
std::map<uintptr_t, size_t>& PinnedMap() {
  static auto* m = new std::map<uintptr_t, size_t>();
  return *m;
}

void FreePinned(void* p) {
  if (!p) return;
  {
    std::lock_guard<std::mutex> g(g_pinned_mu);
    PinnedMap().erase((uintptr_t)p);
  }
  c10::free_cpu(p);
}

bool IsPinned(const void* p) {
  if (!p) return false;
  std::lock_guard<std::mutex> g(g_pinned_mu);
  auto& m = PinnedMap();
  auto it = m.upper_bound((uintptr_t)p);
  if (it == m.begin()) return false;
  --it;
  return (uintptr_t)p < it->first + std::max<size_t>(it->second, 1);
}

// Also the PrivateUse1 host allocator (at::getHostAllocator): what
// torch.accelerator.empty_host_cache()/host_memory_stats() and pinned-memory
// bookkeeping reach (without one they dereference null: vLLM calls
// empty_host_cache at every engine shutdown). Nothing is cached, so emptying
// the cache frees nothing; there are no streams whose use to record.
struct TpuPinnedAllocator final : public at::HostAllocator {
  c10::DataPtr allocate(size_t n) override {
    void* p = c10::alloc_cpu(std::max<size_t>(n, 1));
    {
      std::lock_guard<std::mutex> g(g_pinned_mu);
      PinnedMap()[(uintptr_t)p] = n;
    }
    return c10::DataPtr(p, p, &FreePinned, c10::Device(c10::DeviceType::CPU));
  }
  c10::DeleterFnPtr raw_deleter() const override { return &FreePinned; }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }
  bool record_event(void*, void*, c10::Stream) override { return true; }
  void empty_cache() override {}
  at::HostStats get_stats() override { return {}; }
  void reset_accumulated_stats() override {}
  void reset_peak_stats() override {}
};

TpuPinnedAllocator* PinnedAllocator() {
  static TpuPinnedAllocator a;
  return &a;
}
}  // namespace

REGISTER_HOST_ALLOCATOR(at::kPrivateUse1, PinnedAllocator())

// ---------------------------------------------------------------- hooks
struct TpuHooks final : public at::PrivateUse1HooksInterface {
  bool isBuilt() const override { return true; }
  bool isAvailable() const override { return !GetConfig().plugin_path.empty(); }
  const at::Generator& getDefaultGenerator(c10::DeviceIndex idx) const override {
    return DefaultGenerator(idx < 0 ? 0 : idx);
  }
  at::Generator getNewGenerator(c10::DeviceIndex idx) const override {
    return at::make_generator<TpuGenerator>(idx < 0 ? 0 : idx);
  }
  at::Device getDeviceFromPtr(void*) const override {
    return at::Device(c10::DeviceType::PrivateUse1, 0);
  }
  bool isPinnedPtr(const void* p) const override { return IsPinned(p); }
  at::Allocator* getPinnedMemoryAllocator() const override { return PinnedAllocator(); }
  bool hasPrimaryContext(c10::DeviceIndex) const override { return Started(); }
  c10::DeviceIndex deviceCount() const override { return 1; }
  void setCurrentDevice(c10::DeviceIndex d) const override {
    TORCH_CHECK(d == 0 || d == -1, "torchtpu: invalid device index ", d,
                ": this process drives one tpu device (index 0)");
  }
  c10::DeviceIndex getCurrentDevice() const override { return 0; }
  c10::DeviceIndex exchangeDevice(c10::DeviceIndex d) const override {
    setCurrentDevice(d);
    return 0;
  }
  c10::DeviceIndex maybeExchangeDevice(c10::DeviceIndex d) const override { return exchangeDevice(d); }
  void resizePrivateUse1Bytes(const c10::Storage& storage, size_t newsize) const override {
    c10::StorageImpl* impl = storage.unsafeGetStorageImpl();
    StatePtr st = GetState(impl);
    int64_t old = st->nbytes;
    GetAllocator()->Resized(old, (int64_t)newsize);  // may throw OutOfMemoryError
    st->nbytes = (int64_t)newsize;
    impl->set_nbytes(newsize);
  }
  void init() const override {}
};

// ---------------------------------------------------------------- guard
struct TpuGuardImpl final : public c10::impl::DeviceGuardImplInterface {
  static constexpr c10::DeviceType D = c10::DeviceType::PrivateUse1;
  c10::DeviceType type() const override { return D; }
  c10::Device exchangeDevice(c10::Device d) const override {
    check(d);
    return c10::Device(D, 0);
  }
  c10::Device getDevice() const override { return c10::Device(D, 0); }
  void setDevice(c10::Device d) const override { check(d); }
  void uncheckedSetDevice(c10::Device) const noexcept override {}
  c10::Stream getStream(c10::Device d) const override { return CurrentStream(d.index()); }
  c10::Stream getDefaultStream(c10::Device d) const override {
    return c10::Stream(c10::Stream::DEFAULT, c10::Device(D, 0));
  }
  c10::Stream getNewStream(c10::Device d, int priority) const override { return NewStream(priority); }
  c10::Stream getStreamFromGlobalPool(c10::Device d, bool high) const override {
    return NewStream(high ? -1 : 0);
  }
  c10::Stream exchangeStream(c10::Stream s) const override { return ExchangeStream(s); }
  c10::DeviceIndex deviceCount() const noexcept override { return 1; }
#if __has_include(<c10/core/DeviceCapability.h>)
  // torch.accelerator.get_device_capability(): the dtypes tpu tensors are
  // allocated in and converted between (tests/test_device.py checks each).
  // Not: the sub-byte and bit types, complex32, float4 (allocated, but no
  // conversion), quantized types.
  c10::DeviceCapability getDeviceCapability(c10::Device) const override {
    c10::DeviceCapability cap;
    uint64_t bits = 0;
    for (int i : {c10::kIndex_Byte, c10::kIndex_Char, c10::kIndex_Short, c10::kIndex_Int, c10::kIndex_Long,
                  c10::kIndex_Half, c10::kIndex_Float, c10::kIndex_Double, c10::kIndex_ComplexFloat,
                  c10::kIndex_ComplexDouble, c10::kIndex_Bool, c10::kIndex_BFloat16, c10::kIndex_Float8_e5m2,
                  c10::kIndex_Float8_e4m3fn, c10::kIndex_Float8_e5m2fnuz, c10::kIndex_Float8_e4m3fnuz,
                  c10::kIndex_Float8_e8m0fnu, c10::kIndex_UInt16, c10::kIndex_UInt32, c10::kIndex_UInt64})
      bits |= 1ULL << i;
    cap.capability_data.capability_bits = bits;
    return cap;
  }
#endif
  void record(void** event, const c10::Stream& stream, const c10::DeviceIndex,
              const c10::EventFlag flag) const override {
    RecordEvent(event, stream, flag);
  }
  void block(void* event, const c10::Stream& stream) const override { BlockEvent(event, stream); }
  bool queryEvent(void* event) const override { return QueryEvent(event); }
  void destroyEvent(void* event, const c10::DeviceIndex) const noexcept override {
    DestroyEvent(event);
  }
  bool queryStream(const c10::Stream& s) const override { return QueryStream(s); }
  void synchronizeStream(const c10::Stream& s) const override { SynchronizeStream(s); }
  void synchronizeEvent(void* event) const override { SynchronizeEvent(event); }
  void synchronizeDevice(const c10::DeviceIndex) const override { SynchronizeDevice(); }
  double elapsedTime(void* a, void* b, const c10::DeviceIndex) const override {
    return ElapsedTime(a, b);
  }
  void recordDataPtrOnStream(const c10::DataPtr&, const c10::Stream&) const override {}
 private:
  static void check(c10::Device d) {
    TORCH_CHECK(d.type() == D, "torchtpu: expected a tpu device, got ", d);
    TORCH_CHECK(!d.has_index() || d.index() == 0 || d.index() == -1, "torchtpu: invalid device index ",
                (int)d.index(), ": this process drives one tpu device, index 0 (select the "
                "physical device with TORCHTPU_VISIBLE_DEVICES or torch.tpu.set_device before first use)");
  }
};

C10_REGISTER_GUARD_IMPL(PrivateUse1, TpuGuardImpl);

static bool g_hooks = [] {
  static TpuHooks hooks;
  at::RegisterPrivateUse1HooksInterface(&hooks);
  return true;
}();

}  // namespace tt
