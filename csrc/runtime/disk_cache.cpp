// Persistent executable cache: one file per program under the cache dir.
//
// File: magic "TTX1", 16-byte key, u64 payload size, u64 payload checksum,
// payload (PJRT_Executable_Serialize bytes). Writes go to a temp file and
// are renamed into place (atomic; several processes may share the dir). A
// short, corrupt or mismatching file is deleted and the program recompiled.
// Hits touch the file's mtime; stores evict least-recently-used files past
// the size bound (TORCHTPU_CACHE_MAX_BYTES, default 8 GiB).
#include "disk_cache.h"

#include <dirent.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <random>
#include <sstream>
#include <vector>


namespace tt {

namespace {

uint64_t Fnv(const std::string& s, uint64_t h) {
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

struct Key {
  uint64_t a, b;
  std::string hex() const {
    char buf[40];
    std::snprintf(buf, sizeof buf, "%016llx%016llx", (unsigned long long)a, (unsigned long long)b);
    return buf;
  }
};

Key MakeKey(const std::string& fp, const std::string& text, const std::string& opts) {
  std::string all = fp;
  all += '\0';
  all += opts;
  all += '\0';
  all += text;
  return {Fnv(all, 1469598103934665603ull), Fnv(all, 0x9E3779B97F4A7C15ull)};
}

std::atomic<bool> g_unsupported{false};

bool Enabled(const std::string& dir) { return !dir.empty() && !g_unsupported.load(); }

int64_t MaxBytes() {
  // "1073741824", "512M", "8G"
  const char* e = std::getenv("TORCHTPU_CACHE_MAX_BYTES");
  if (!e || !*e) return 8ll << 30;
  char* end = nullptr;
  double v = std::strtod(e, &end);
  switch (end ? *end : 0) {
    case 'k': case 'K': v *= 1024.0; break;
    case 'm': case 'M': v *= 1048576.0; break;
    case 'g': case 'G': v *= 1073741824.0; break;
    case 't': case 'T': v *= 1099511627776.0; break;
    default: break;
  }
  return (int64_t)v;
}

bool MakeDirs(const std::string& path) {
  std::string cur;
  std::stringstream ss(path);
  std::string part;
  if (!path.empty() && path[0] == '/') cur = "/";
  while (std::getline(ss, part, '/')) {
    if (part.empty()) continue;
    cur += part + "/";
    if (mkdir(cur.c_str(), 0755) != 0 && errno != EEXIST) return false;
  }
  return true;
}

constexpr char kMagic[4] = {'T', 'T', 'X', '1'};

void Evict(const std::string& dir) {
  DIR* d = opendir(dir.c_str());
  if (!d) return;
  struct Entry {
    std::string path;
    int64_t size;
    int64_t mtime;
  };
  std::vector<Entry> entries;
  int64_t total = 0;
  while (dirent* e = readdir(d)) {
    std::string n = e->d_name;
    if (n.size() < 4 || n.substr(n.size() - 4) != ".ttx") continue;
    std::string p = dir + "/" + n;
    struct stat st;
    if (stat(p.c_str(), &st) != 0) continue;
    entries.push_back({p, (int64_t)st.st_size, (int64_t)st.st_mtime});
    total += st.st_size;
  }
  closedir(d);
  int64_t limit = MaxBytes();
  if (total <= limit) return;
  std::sort(entries.begin(), entries.end(), [](const Entry& x, const Entry& y) { return x.mtime < y.mtime; });
  for (auto& e : entries) {
    if (total <= limit) break;
    if (unlink(e.path.c_str()) == 0) total -= e.size;
  }
}

}  // namespace

pjrt::ExecutablePtr DiskCacheLoad(const std::string& dir, pjrt::Client& client, const std::string& fp,
                                  const std::string& text, const std::string& options) {
  if (!Enabled(dir)) return nullptr;
  Key k = MakeKey(fp, text, options);
  std::string path = dir + "/" + k.hex() + ".ttx";
  std::ifstream f(path, std::ios::binary);
  if (!f) return nullptr;
  std::string data((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  f.close();
  const size_t header = 4 + 16 + 8 + 8;
  bool ok = data.size() >= header && std::memcmp(data.data(), kMagic, 4) == 0;
  uint64_t ka = 0, kb = 0, size = 0, sum = 0;
  if (ok) {
    std::memcpy(&ka, data.data() + 4, 8);
    std::memcpy(&kb, data.data() + 12, 8);
    std::memcpy(&size, data.data() + 20, 8);
    std::memcpy(&sum, data.data() + 28, 8);
    ok = ka == k.a && kb == k.b && size == data.size() - header;
  }
  std::string payload;
  if (ok) {
    payload = data.substr(header);
    ok = Fnv(payload, 1469598103934665603ull) == sum;
  }
  if (!ok) {
    unlink(path.c_str());  // corrupt or truncated: rebuild
    return nullptr;
  }
  try {
    auto exe = client.Deserialize(payload);
    utimes(path.c_str(), nullptr);  // LRU: mark as recently used
    return exe;
  } catch (const pjrt::Error&) {
    unlink(path.c_str());
    return nullptr;
  }
}

void DiskCacheStore(const std::string& dir, const pjrt::Executable& exe, const std::string& fp,
                    const std::string& text, const std::string& options) {
  if (!Enabled(dir)) return;
  std::string payload;
  try {
    payload = exe.Serialize();
  } catch (const pjrt::Error& e) {
    if (!g_unsupported.exchange(true))
      std::cerr << "torchtpu: warning: this PJRT plugin cannot serialize executables ("
                << e.what() << "); the compilation cache stays in memory only\n";
    return;
  }
  if (payload.empty()) return;
  if (!MakeDirs(dir)) return;
  Key k = MakeKey(fp, text, options);
  std::string path = dir + "/" + k.hex() + ".ttx";
  static thread_local std::mt19937_64 rng(std::random_device{}());
  char tmpname[64];
  std::snprintf(tmpname, sizeof tmpname, "/.tmp.%d.%016llx", (int)getpid(), (unsigned long long)rng());
  std::string tmp = dir + tmpname;
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    if (!f) return;
    uint64_t size = payload.size(), sum = Fnv(payload, 1469598103934665603ull);
    f.write(kMagic, 4);
    f.write(reinterpret_cast<const char*>(&k.a), 8);
    f.write(reinterpret_cast<const char*>(&k.b), 8);
    f.write(reinterpret_cast<const char*>(&size), 8);
    f.write(reinterpret_cast<const char*>(&sum), 8);
    f.write(payload.data(), payload.size());
    if (!f) {
      f.close();
      unlink(tmp.c_str());
      return;
    }
  }
  if (rename(tmp.c_str(), path.c_str()) != 0) {
    unlink(tmp.c_str());
    return;
  }
  Evict(dir);
}

}  // namespace tt
