#include "storage.h"

#include <c10/util/Exception.h>

#include <unistd.h>

#include <atomic>

#include "runtime/runtime.h"

namespace tt {

namespace {
std::atomic<int64_t> g_allocated{0}, g_peak{0}, g_allocs{0}, g_frees{0}, g_live{0}, g_ooms{0};

void Account(int64_t delta) {
  int64_t now = g_allocated.fetch_add(delta) + delta;
  int64_t p = g_peak.load();
  while (now > p && !g_peak.compare_exchange_weak(p, now)) {
  }
}

void Delete(void* p) {
  auto* ctx = static_cast<StorageCtx*>(p);
  Account(-ctx->st->nbytes);
  g_frees++;
  g_live--;
  delete ctx;
}

std::string Human(int64_t b) {
  char buf[64];
  if (b >= (1ll << 30)) std::snprintf(buf, sizeof buf, "%.2f GiB", b / double(1ll << 30));
  else if (b >= (1 << 20)) std::snprintf(buf, sizeof buf, "%.2f MiB", b / double(1 << 20));
  else std::snprintf(buf, sizeof buf, "%lld bytes", (long long)b);
  return buf;
}
int64_t PhysicalBytes() {
  static int64_t b = (int64_t)sysconf(_SC_PHYS_PAGES) * (int64_t)sysconf(_SC_PAGE_SIZE);
  return b;
}

// TORCHTPU_MEMORY_LIMIT, else the device capacity (host memory for the CPU
// plugin): an allocation past it can never be materialized.
int64_t Limit() {
  int64_t limit = GetConfig().memory_limit;
  return limit > 0 ? limit : PhysicalBytes();
}

std::string LimitName() {
  return GetConfig().memory_limit > 0 ? " (TORCHTPU_MEMORY_LIMIT)" : " (device capacity)";
}

// torch.tpu.set_per_process_memory_fraction's cap (0: none). As on CUDA it
// caps this process's allocations; the device's size (getMemoryInfo) stays.
std::atomic<int64_t> g_process_cap{0};

// Throws torch.OutOfMemoryError when `grow` more bytes do not fit.
void CheckFits(int64_t grow, const std::string& what) {
  int64_t limit = Limit();
  const int64_t cap = g_process_cap.load();
  const bool capped = cap > 0 && cap < limit;
  if (capped) limit = cap;
  int64_t have = g_allocated.load();
  if (grow <= 0 || have + grow <= limit) return;
  g_ooms++;
  TORCH_CHECK_WITH(OutOfMemoryError, false, "tpu out of memory: tried to ", what, "; ", Human(have),
                   " already allocated, ", Human(std::max<int64_t>(0, limit - have)), " free; limit ",
                   Human(limit), capped ? " (torch.tpu.set_per_process_memory_fraction)" : LimitName(),
                   ". Free tensors (del, torch.tpu.empty_cache()) or raise TORCHTPU_MEMORY_LIMIT.");
}
}  // namespace

c10::DeviceIndex CurrentDeviceIndex() { return 0; }

StorageCtx* GetCtx(const c10::StorageImpl* s) {
  TORCH_INTERNAL_ASSERT(s->data_ptr().get_deleter() == GetAllocator()->raw_deleter(),
                        "torchtpu: storage was not allocated by the tpu allocator");
  return static_cast<StorageCtx*>(s->data_ptr().get_context());
}

StatePtr GetState(const c10::StorageImpl* s) { return GetCtx(s)->st; }

c10::DataPtr TpuAllocator::allocate(size_t n) {
  CheckFits((int64_t)n, "allocate " + Human((int64_t)n));
  auto* ctx = new StorageCtx{std::make_shared<StorageState>((int64_t)n)};
  Account((int64_t)n);
  g_allocs++;
  g_live++;
  return c10::DataPtr(ctx, ctx, &Delete, c10::Device(c10::DeviceType::PrivateUse1, CurrentDeviceIndex()));
}

c10::DeleterFnPtr TpuAllocator::raw_deleter() const { return &Delete; }

void TpuAllocator::copy_data(void* dest, const void* src, std::size_t count) const {
  // Buffers are immutable: sharing the source's buffer is a copy.
  auto* d = static_cast<StorageCtx*>(dest);
  auto* s = static_cast<const StorageCtx*>(src);
  d->st->buf = s->st->buf;
  d->st->et = s->st->et;
  d->st->numel = s->st->numel;
  (void)count;
}

void TpuAllocator::Resized(int64_t old_bytes, int64_t new_bytes) {
  int64_t grow = new_bytes - old_bytes;
  CheckFits(grow, "grow a storage from " + Human(old_bytes) + " to " + Human(new_bytes));
  Account(grow);
}

c10::CachingDeviceAllocator::DeviceStats TpuAllocator::getDeviceStats(c10::DeviceIndex) {
  c10::CachingDeviceAllocator::DeviceStats s;
  auto set = [](auto& arr, int64_t cur, int64_t peak, int64_t a, int64_t f) {
    for (auto& st : arr) {
      st.current = cur;
      st.peak = peak;
      st.allocated = a;
      st.freed = f;
    }
  };
  set(s.allocated_bytes, g_allocated, g_peak, g_allocated, 0);
  set(s.reserved_bytes, g_allocated, g_peak, g_allocated, 0);
  set(s.active_bytes, g_allocated, g_peak, g_allocated, 0);
  set(s.requested_bytes, g_allocated, g_peak, g_allocated, 0);
  set(s.allocation, g_live, g_live, g_allocs, g_frees);
  set(s.segment, g_live, g_live, g_allocs, g_frees);
  set(s.active, g_live, g_live, g_allocs, g_frees);
  s.num_alloc_retries = 0;
  s.num_ooms = g_ooms.load();
  return s;
}

void TpuAllocator::resetAccumulatedStats(c10::DeviceIndex) {
  g_allocs = 0;
  g_frees = 0;
  g_ooms = 0;
}

void TpuAllocator::resetPeakStats(c10::DeviceIndex) { g_peak = g_allocated.load(); }

std::pair<size_t, size_t> TpuAllocator::getMemoryInfo(c10::DeviceIndex) {
  int64_t limit = Limit();
  int64_t used = g_allocated.load();
  return {(size_t)std::max<int64_t>(0, limit - used), (size_t)limit};
}

TpuAllocator* GetAllocator() {
  static TpuAllocator a;
  return &a;
}

void SetProcessMemoryCap(int64_t bytes) { g_process_cap = std::max<int64_t>(0, bytes); }
int64_t ProcessMemoryCap() { return g_process_cap.load(); }

MemStats GetMemStats() {
  return {g_allocated.load(), g_peak.load(), g_allocs.load(), g_frees.load(), g_live.load(), g_ooms.load()};
}

REGISTER_ALLOCATOR(c10::DeviceType::PrivateUse1, GetAllocator());

}  // namespace tt
