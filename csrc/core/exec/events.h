// Streams and events over PJRT completion events. Every execution's
// completion is tracked (with its completion time, via OnReady); an event
// captures the executions pending on its stream when recorded.
#pragma once
#include <c10/core/Event.h>
#include <c10/core/Stream.h>

#include <memory>

#include "runtime/pjrt.h"

namespace tt {

void TrackCompletion(std::shared_ptr<pjrt::Event> ev);
void TrackCompletion(std::shared_ptr<pjrt::Event> ev, int64_t stream);
int64_t CurrentStreamId();

c10::Stream CurrentStream(c10::DeviceIndex idx);
c10::Stream NewStream(int priority);
c10::Stream ExchangeStream(c10::Stream s);
void RecordEvent(void** event, const c10::Stream& stream, c10::EventFlag flag);
void BlockEvent(void* event, const c10::Stream& stream);
bool QueryEvent(void* event);
void DestroyEvent(void* event);
bool QueryStream(const c10::Stream& s);
void SynchronizeStream(const c10::Stream& s);
void SynchronizeEvent(void* event);
void SynchronizeDevice();
double ElapsedTime(void* a, void* b);

}  // namespace tt
