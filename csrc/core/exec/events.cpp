#include "events.h"

#include "debug.h"

#include <c10/util/Exception.h>

#include <atomic>
#include <deque>
#include <mutex>
#include <thread>
#include <vector>

#include "executor.h"
#include "runtime/runtime.h"

namespace tt {

namespace {
struct Completion {
  std::shared_ptr<pjrt::Event> ev;
  std::atomic<int64_t> t{0};
  int64_t stream = 0;
};
using CompletionPtr = std::shared_ptr<Completion>;

std::mutex g_mu;
std::deque<CompletionPtr> g_inflight;
std::atomic<int64_t> g_next_stream{1};
thread_local int64_t t_stream = 0;

struct TpuEvent {
  std::vector<CompletionPtr> waits;
  int64_t t_record = 0;
  bool recorded = false;
};

void Prune() {
  while (!g_inflight.empty() && g_inflight.front()->t.load() != 0) g_inflight.pop_front();
}

void FlushPending() {
  {
    std::lock_guard<std::recursive_mutex> g(Region::Lock());
    if (!Region::Current().empty()) Region::Current().Flush();
  }
  DrainLaunches();
}

void Wait(const CompletionPtr& c) {
  c->ev->Await();
  while (c->t.load() == 0) std::this_thread::yield();
}

int64_t DoneTime(TpuEvent* e) {
  int64_t t = e->t_record;
  for (auto& c : e->waits) t = std::max(t, c->t.load());
  return t;
}
}  // namespace

void TrackCompletion(std::shared_ptr<pjrt::Event> ev) { TrackCompletion(std::move(ev), t_stream); }

int64_t CurrentStreamId() { return t_stream; }

void TrackCompletion(std::shared_ptr<pjrt::Event> ev, int64_t stream) {
  auto c = std::make_shared<Completion>();
  c->ev = std::move(ev);
  c->stream = stream;
  {
    std::lock_guard<std::mutex> g(g_mu);
    Prune();
    g_inflight.push_back(c);
  }
  c->ev->OnReady([c] { c->t.store(NowNs()); });
}

static c10::Device Dev() { return c10::Device(c10::DeviceType::PrivateUse1, 0); }

c10::Stream CurrentStream(c10::DeviceIndex) { return c10::Stream(c10::Stream::UNSAFE, Dev(), t_stream); }

c10::Stream NewStream(int) {
  return c10::Stream(c10::Stream::UNSAFE, Dev(), g_next_stream.fetch_add(1));
}

c10::Stream ExchangeStream(c10::Stream s) {
  c10::Stream old = CurrentStream(0);
  t_stream = s.id();
  return old;
}

void RecordEvent(void** event, const c10::Stream& stream, c10::EventFlag) {
  FlushPending();
  auto* e = static_cast<TpuEvent*>(*event);
  if (!e) {
    e = new TpuEvent();
    *event = e;
  }
  e->waits.clear();
  {
    std::lock_guard<std::mutex> g(g_mu);
    Prune();
    for (auto& c : g_inflight)
      if (c->stream == stream.id() && c->t.load() == 0) e->waits.push_back(c);
  }
  e->t_record = NowNs();
  e->recorded = true;
}

void BlockEvent(void* event, const c10::Stream&) {
  // Device work is ordered by data dependencies; blocking on the host is the
  // conservative way to order a stream after the event.
  SynchronizeEvent(event);
}

bool QueryEvent(void* event) {
  auto* e = static_cast<TpuEvent*>(event);
  if (!e) return true;
  for (auto& c : e->waits)
    if (c->t.load() == 0) return false;
  return true;
}

void DestroyEvent(void* event) { delete static_cast<TpuEvent*>(event); }

bool QueryStream(const c10::Stream& s) {
  if (LaunchesQueued()) return false;
  std::lock_guard<std::mutex> g(g_mu);
  for (auto& c : g_inflight)
    if (c->stream == s.id() && c->t.load() == 0) return false;
  return true;
}

void SynchronizeStream(const c10::Stream& s) {
  FlushPending();
  std::vector<CompletionPtr> w;
  {
    std::lock_guard<std::mutex> g(g_mu);
    for (auto& c : g_inflight)
      if (c->stream == s.id()) w.push_back(c);
  }
  for (auto& c : w) Wait(c);
  RaisePendingChecks(kAllChecks);
}

void SynchronizeEvent(void* event) {
  auto* e = static_cast<TpuEvent*>(event);
  if (!e) return;
  for (auto& c : e->waits) Wait(c);
  RaisePendingChecks(0);
}

void SynchronizeDevice() {
  FlushPending();
  std::vector<CompletionPtr> w;
  {
    std::lock_guard<std::mutex> g(g_mu);
    w.assign(g_inflight.begin(), g_inflight.end());
  }
  for (auto& c : w) Wait(c);
  RaisePendingChecks(kAllChecks);
}

double ElapsedTime(void* a, void* b) {
  auto* ea = static_cast<TpuEvent*>(a);
  auto* eb = static_cast<TpuEvent*>(b);
  TORCH_CHECK(ea && eb && ea->recorded && eb->recorded,
              "torchtpu: both events must be recorded before elapsed_time");
  SynchronizeEvent(a);
  SynchronizeEvent(b);
  int64_t d = DoneTime(eb) - DoneTime(ea);
  // Completion times are stamped by PJRT's ready callbacks, which a loaded host may run late
  // and out of order: b recorded after a can then look done first. Work on one stream finishes
  // in order, so that reads as no time (CUDA's elapsed_time is never negative for that order).
  if (eb->t_record >= ea->t_record && d < 0) d = 0;
  return d / 1e6;
}

}  // namespace tt
