// Persistent executable cache (see issue: torch.compile + persistent cache).
#pragma once
#include <string>

#include "pjrt.h"

namespace tt {
// Entries live in `dir` (an empty dir disables the cache). Returns nullptr
// on a miss or when the cache is disabled.
pjrt::ExecutablePtr DiskCacheLoad(const std::string& dir, pjrt::Client& client, const std::string& fingerprint,
                                  const std::string& text, const std::string& options);
void DiskCacheStore(const std::string& dir, const pjrt::Executable& exe, const std::string& fingerprint,
                    const std::string& text, const std::string& options);
}  // namespace tt
