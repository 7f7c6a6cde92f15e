// Persistent executable cache (see issue: torch.compile + persistent cache).
#pragma once
#include <string>

#include "../runtime/pjrt.h"

namespace tt {
// Returns nullptr on a miss or when the cache is disabled.
pjrt::ExecutablePtr DiskCacheLoad(pjrt::Client& client, const std::string& fingerprint,
                                  const std::string& text, const std::string& options);
void DiskCacheStore(const pjrt::Executable& exe, const std::string& fingerprint,
                    const std::string& text, const std::string& options);
}  // namespace tt
