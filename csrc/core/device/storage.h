// Device storage: a storage holds an immutable flat device buffer; a write
// produces a new buffer and rebinds the storage, so every view sees it.
#pragma once
#include <c10/core/Allocator.h>
#include <c10/core/CachingDeviceAllocator.h>
#include <c10/core/StorageImpl.h>

#include <memory>

#include "hlo/builder.h"
#include "runtime/pjrt.h"

namespace tt {

struct StorageState {
  explicit StorageState(int64_t n) : nbytes(n) {}
  int64_t nbytes;
  pjrt::BufferPtr buf;      // flat 1-D value, or null (reads as zeros)
  hlo::ET et = hlo::ET::U8; // element type of buf
  int64_t numel = 0;        // element count of buf
  // Position in the current recording region (see executor.h).
  uint64_t region_epoch = 0;
  int slot = -1;
  // Host copies of byte ranges of buf: the whole of a small storage read to
  // the host or written by strict mode's host tier, or the ranges views of a
  // larger one covered when they were read; valid while mirror_of is still
  // buf (buffers are immutable: any write rebinds buf). See HostMirror() and
  // HostBytes().
  struct HostRange {
    int64_t lo;
    std::shared_ptr<const std::string> bytes;
  };
  std::vector<HostRange> mirror;
  std::weak_ptr<pjrt::Buffer> mirror_of;
};
using StatePtr = std::shared_ptr<StorageState>;

// The DataPtr context (and data pointer) of a tpu storage.
struct StorageCtx {
  StatePtr st;
};

StorageCtx* GetCtx(const c10::StorageImpl* s);
StatePtr GetState(const c10::StorageImpl* s);

class TpuAllocator final : public c10::DeviceAllocator {
 public:
  c10::DataPtr allocate(size_t n) override;
  c10::DeleterFnPtr raw_deleter() const override;
  void copy_data(void* dest, const void* src, std::size_t count) const override;
  bool initialized() override { return true; }
  void emptyCache(c10::MempoolId_t) override {}
  void recordStream(const c10::DataPtr&, c10::Stream) override {}
  c10::CachingDeviceAllocator::DeviceStats getDeviceStats(c10::DeviceIndex) override;
  void resetAccumulatedStats(c10::DeviceIndex) override;
  void resetPeakStats(c10::DeviceIndex) override;
  std::pair<size_t, size_t> getMemoryInfo(c10::DeviceIndex) override;
  // Byte accounting when a storage grows/shrinks in place.
  void Resized(int64_t old_bytes, int64_t new_bytes);
};
TpuAllocator* GetAllocator();

struct MemStats {
  int64_t allocated, peak, num_allocs, num_frees, segments, num_ooms;
};
MemStats GetMemStats();
// The per-process allocation cap (torch.tpu.set_per_process_memory_fraction;
// bytes, 0: none). The device size getMemoryInfo reports stays as it is.
void SetProcessMemoryCap(int64_t bytes);
int64_t ProcessMemoryCap();

c10::DeviceIndex CurrentDeviceIndex();

}  // namespace tt
