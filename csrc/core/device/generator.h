#pragma once
#include <ATen/core/Generator.h>
#include <c10/core/GeneratorImpl.h>

namespace tt {

// Counter-based generator: (seed, offset). Each random op consumes `offset`
// increments; programs receive (seed, offset) as a u64[2] key argument.
struct TpuGenerator : public c10::GeneratorImpl {
  explicit TpuGenerator(c10::DeviceIndex idx = 0);
  void set_current_seed(uint64_t seed) override;
  uint64_t current_seed() const override { return seed_; }
  uint64_t seed() override;
  void set_offset(uint64_t offset) override { offset_ = offset; }
  uint64_t get_offset() const override { return offset_; }
  void set_state(const c10::TensorImpl& new_state) override;
  c10::intrusive_ptr<c10::TensorImpl> get_state() const override;
  static c10::DeviceType device_type() { return c10::DeviceType::PrivateUse1; }
  // Reserves `n` counters; returns the (seed, offset) to use.
  std::pair<uint64_t, uint64_t> Next(uint64_t n);
 private:
  TpuGenerator* clone_impl() const override;
  uint64_t seed_ = 67280421310721ull;
  uint64_t offset_ = 0;
};

const at::Generator& DefaultGenerator(c10::DeviceIndex idx = 0);

}  // namespace tt
