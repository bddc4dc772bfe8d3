// The CUDA host emulation (emulate.h): GPU threads as fibers, one block at a time.
#include "concord/cuda/emulate.h"

#if !defined(__x86_64__)
#include <ucontext.h>
#endif

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <mutex>
#include <new>
#include <stdexcept>
#include <string>
#include <vector>

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/common_interface_defs.h>
#define CONCORD_EMU_ASAN 1
#endif

// Plain globals, not thread_local (launches are serialized: emu::launch holds a mutex), so a kernel
// reads them as the GPU's registers: without a TLS wrapper.
uint3 threadIdx;
uint3 blockIdx;
dim3 blockDim;
dim3 gridDim;

namespace concord::cuda::emu {
namespace {

constexpr int kWarp = 32;
constexpr unsigned kMaxThreads = 1024;
#if defined(CONCORD_EMU_ASAN)
constexpr size_t kStackBytes = size_t{256} << 10;
#else
constexpr size_t kStackBytes = size_t{64} << 10;
#endif

// --- Fibers ----------------------------------------------------------------------------------
// On x86-64 a context switch of its own: the callee-saved registers and the stack pointer, no
// signal mask — swapcontext's rt_sigprocmask system call on every switch made half the
// emulation's time. Elsewhere, ucontext.
#if defined(__x86_64__)
extern "C" void concord_emu_switch(void** save_sp, void* load_sp);
asm(R"(
  .text
  .globl concord_emu_switch
  .type concord_emu_switch, @function
concord_emu_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size concord_emu_switch, .-concord_emu_switch
)");

struct Context {
  void* sp = nullptr;
};
// A context whose first switch enters entry on the given stack (entry must never return): below
// a 16-byte-aligned top, entry's (null) return address, then entry itself for the switch's ret,
// then the six registers it pops — so entry starts with rsp = 8 mod 16, as after a call.
void make_context(Context& c, char* stack, size_t size, void (*entry)()) {
  auto** sp = reinterpret_cast<void**>(reinterpret_cast<uintptr_t>(stack + size) & ~uintptr_t{15});
  *--sp = nullptr;
  --sp;
  std::memcpy(static_cast<void*>(sp), &entry, sizeof(entry));
  for (int k = 0; k < 6; ++k) *--sp = nullptr;
  c.sp = sp;
}
void switch_context(Context& from, Context& to) { concord_emu_switch(&from.sp, to.sp); }
#else
struct Context {
  ucontext_t uc{};
};
// getcontext returns twice (in the sense of setjmp): kept out of the scheduler's loops.
[[gnu::noinline]] void make_context(Context& c, char* stack, size_t size, void (*entry)()) {
  getcontext(&c.uc);
  c.uc.uc_stack.ss_sp = stack;
  c.uc.uc_stack.ss_size = size;
  c.uc.uc_link = nullptr;
  makecontext(&c.uc, entry, 0);
}
void switch_context(Context& from, Context& to) { swapcontext(&from.uc, &to.uc); }
#endif

enum class State : uint8_t { ready, shuffle, barrier, done };

struct Lane {
  Context context;
  std::unique_ptr<char[]> stack;
  State state = State::done;
  uint32_t value = 0;  // at a shuffle: the value offered; resumed: the value received
  unsigned mask = 0;
  int lane_mask = 0;
  uint3 index;
  void* fake_stack = nullptr;  // ASan's bookkeeping of this fiber's stack
};

// One launch's state: the block's lanes, the scheduler's own context.
struct Launch {
  Lane* lanes = nullptr;  // threads of them: the block's
  int threads = 0;
  const std::function<void()>* body = nullptr;
  Context scheduler;
  int current = -1;
  const void* scheduler_stack = nullptr;  // ASan: the scheduler's stack, for switching back
  size_t scheduler_stack_size = 0;
  std::exception_ptr error;
};

Launch* g_launch = nullptr;  // the launch running (under g_launch_mutex)
std::mutex g_launch_mutex;

void start_switch([[maybe_unused]] void** fake, [[maybe_unused]] const void* bottom, [[maybe_unused]] size_t size) {
#if defined(CONCORD_EMU_ASAN)
  __sanitizer_start_switch_fiber(fake, bottom, size);
#endif
}
void finish_switch([[maybe_unused]] void* fake, [[maybe_unused]] const void** bottom, [[maybe_unused]] size_t* size) {
#if defined(CONCORD_EMU_ASAN)
  __sanitizer_finish_switch_fiber(fake, bottom, size);
#endif
}

// A lane's first frame: runs the kernel body for the coordinates the scheduler set.
void lane_entry() {
  Launch& l = *g_launch;
  finish_switch(nullptr, &l.scheduler_stack, &l.scheduler_stack_size);
  try {
    (*l.body)();
  } catch (...) {
    if (!l.error) l.error = std::current_exception();
  }
  Lane& lane = l.lanes[l.current];
  lane.state = State::done;
  start_switch(nullptr, l.scheduler_stack, l.scheduler_stack_size);  // this fiber ends
  switch_context(lane.context, l.scheduler);                         // and is never resumed
  __builtin_unreachable();
}

// The running lane waits in state s until the scheduler resumes it.
void wait_in(State s) {
  Launch* l = g_launch;
  if (l == nullptr || l->current < 0) throw std::logic_error("[cuda emulation] a device function called outside a kernel");
  Lane& lane = l->lanes[l->current];
  lane.state = s;
  start_switch(&lane.fake_stack, l->scheduler_stack, l->scheduler_stack_size);
  switch_context(lane.context, l->scheduler);
  finish_switch(lane.fake_stack, &l->scheduler_stack, &l->scheduler_stack_size);
}

void resume(Launch& l, int i) {
  Lane& lane = l.lanes[i];
  l.current = i;
  threadIdx = lane.index;
  void* fake = nullptr;
  start_switch(&fake, lane.stack.get(), kStackBytes);
  switch_context(l.scheduler, lane.context);
  finish_switch(fake, nullptr, nullptr);
  l.current = -1;
}

[[noreturn]] void fail(const std::string& what) {
  throw std::runtime_error("[cuda emulation] block (" + std::to_string(blockIdx.x) + "," + std::to_string(blockIdx.y) +
                           "," + std::to_string(blockIdx.z) + "): " + what);
}

std::string hex(unsigned v) {
  char buf[16];
  std::snprintf(buf, sizeof(buf), "0x%08X", v);
  return buf;
}

bool reverse_order() {
  const char* order = std::getenv("CONCORD_CUDA_EMU_ORDER");
  return order != nullptr && std::strcmp(order, "reverse") == 0;
}

// Exchanges the values of every warp whose live lanes all wait at a shuffle; true if any did.
bool resolve_shuffles(Launch& l) {
  const int threads = l.threads;
  bool any = false;
  for (int w0 = 0; w0 < threads; w0 += kWarp) {
    const int w1 = std::min(threads, w0 + kWarp);
    bool waiting = false;
    for (int i = w0; i < w1; ++i) waiting |= l.lanes[i].state == State::shuffle;
    if (!waiting) continue;
    uint32_t received[kWarp];
    for (int i = w0; i < w1; ++i) {
      const Lane& lane = l.lanes[i];
      if (lane.state != State::shuffle) {
        // A lane at a barrier may still come to this shuffle after the barrier opens: wait.
        if (lane.state == State::barrier) return any;
        continue;
      }
      const unsigned present = w1 - w0 == kWarp ? 0xFFFFFFFFu : (1u << (w1 - w0)) - 1u;
      if ((lane.mask & ~present) != 0) {
        fail("__shfl_xor_sync mask " + hex(lane.mask) + " names lanes this warp does not have");
      }
      for (int j = w0; j < w1; ++j) {
        if ((lane.mask >> (j - w0) & 1u) == 0) continue;
        const State s = l.lanes[j].state;
        if (s != State::shuffle) {
          fail("thread " + std::to_string(i) + " shuffles with mask " + hex(lane.mask) + " but lane " +
               std::to_string(j - w0) + " of its warp " + (s == State::done ? "has exited" : "waits elsewhere") +
               " (undefined on the GPU)");
        }
        if (l.lanes[j].mask != lane.mask) fail("lanes of one warp shuffle with different masks");
      }
      const int source = (i - w0) ^ lane.lane_mask;
      received[i - w0] = source < w1 - w0 && (lane.mask >> source & 1u) != 0
                             ? l.lanes[w0 + source].value
                             : lane.value;  // a lane outside the mask: the GPU returns the caller's own
    }
    for (int i = w0; i < w1; ++i) {
      Lane& lane = l.lanes[i];
      if (lane.state != State::shuffle) continue;
      lane.value = received[i - w0];
      lane.state = State::ready;
    }
    any = true;
  }
  return any;
}

// Lanes and their stacks, kept from launch to launch.
Lane* lane_pool(size_t threads) {
  static std::vector<Lane> pool(kMaxThreads);
  for (size_t i = 0; i < threads; ++i) {
    if (!pool[i].stack) pool[i].stack = std::make_unique<char[]>(kStackBytes);
  }
  return pool.data();
}

void run_block(Launch& l, bool reverse) {
  const int threads = l.threads;
  for (int i = 0; i < threads; ++i) {
    Lane& lane = l.lanes[i];
    make_context(lane.context, lane.stack.get(), kStackBytes, lane_entry);
    lane.state = State::ready;
    lane.index = {static_cast<unsigned>(i) % blockDim.x, static_cast<unsigned>(i) / blockDim.x % blockDim.y,
                  static_cast<unsigned>(i) / (blockDim.x * blockDim.y)};
  }
  for (;;) {
    bool ran = false;
    for (int k = 0; k < threads; ++k) {
      const int i = reverse ? threads - 1 - k : k;
      if (l.lanes[i].state != State::ready) continue;
      resume(l, i);
      if (l.error) std::rethrow_exception(l.error);
      ran = true;
    }
    int done = 0, at_barrier = 0;
    for (int i = 0; i < threads; ++i) {
      const Lane& lane = l.lanes[i];
      done += lane.state == State::done;
      at_barrier += lane.state == State::barrier;
    }
    if (done == threads) return;
    if (resolve_shuffles(l)) continue;
    if (at_barrier > 0) {
      if (at_barrier + done != threads) fail("deadlock: some threads wait at __syncthreads, the rest at shuffles");
      if (done > 0) {
        fail(std::to_string(done) + " of " + std::to_string(threads) +
             " threads exited before a __syncthreads the others wait at (undefined on the GPU)");
      }
      for (int i = 0; i < threads; ++i) l.lanes[i].state = State::ready;
      continue;
    }
    if (!ran) fail("deadlock: no thread can run");
  }
}

}  // namespace

void launch(dim3 grid, dim3 block, const std::function<void()>& body) {
  const uint64_t threads = uint64_t{block.x} * block.y * block.z;  // CUDA's limits for sm_90:
  if (threads == 0 || threads > kMaxThreads || block.z > 64 || grid.x == 0 || grid.x > 0x7FFFFFFFu || grid.y == 0 ||
      grid.z == 0 || grid.y > 65535 || grid.z > 65535) {
    throw std::runtime_error("[cuda emulation] invalid launch configuration: grid (" + std::to_string(grid.x) + "," +
                             std::to_string(grid.y) + "," + std::to_string(grid.z) + "), block (" +
                             std::to_string(block.x) + "," + std::to_string(block.y) + "," + std::to_string(block.z) + ")");
  }
  thread_local bool launching = false;
  if (launching) throw std::logic_error("[cuda emulation] a launch inside a kernel");
  const std::lock_guard<std::mutex> lock(g_launch_mutex);  // one launch at a time, whatever the OS thread
  launching = true;
  struct Clear {
    bool& launching;
    ~Clear() {
      g_launch = nullptr;
      launching = false;
    }
  } clear{launching};
  Launch l;
  l.lanes = lane_pool(threads);
  l.threads = static_cast<int>(threads);
  l.body = &body;
  g_launch = &l;
  gridDim = grid;
  blockDim = block;
  const bool reverse = reverse_order();
  for (unsigned z = 0; z < grid.z; ++z) {
    for (unsigned y = 0; y < grid.y; ++y) {
      for (unsigned x = 0; x < grid.x; ++x) {
        blockIdx = {x, y, z};
        run_block(l, reverse);
      }
    }
  }
}

uint32_t shfl_xor(unsigned mask, uint32_t value, int lane_mask) {
  Launch* l = g_launch;
  if (l == nullptr || l->current < 0) throw std::logic_error("[cuda emulation] __shfl_xor_sync outside a kernel");
  Lane& lane = l->lanes[l->current];
  lane.value = value;
  lane.mask = mask;
  lane.lane_mask = lane_mask & (kWarp - 1);
  wait_in(State::shuffle);
  return l->lanes[l->current].value;
}

void syncthreads() { wait_in(State::barrier); }

}  // namespace concord::cuda::emu

// --- The runtime API ---------------------------------------------------------------------------

namespace {
constexpr std::align_val_t kDeviceAlignment{256};  // cudaMalloc's guarantee
}

struct EmuEvent {
  std::chrono::steady_clock::time_point at;
};

const char* cudaGetErrorString(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
  }
  return "unknown error";
}
cudaError_t cudaGetDeviceCount(int* count) {
  *count = 1;
  return cudaSuccess;
}
cudaError_t cudaGetDevice(int* device) {
  *device = 0;
  return cudaSuccess;
}
cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device) {
  if (device != 0) return cudaErrorInvalidValue;
  *prop = {};
  std::snprintf(prop->name, sizeof(prop->name), "CUDA host emulation (no GPU; threads %s)",
                concord::cuda::emu::reverse_order() ? "in reverse order" : "in order");
  prop->major = 9;
  prop->minor = 0;
  prop->multiProcessorCount = 1;
  prop->totalGlobalMem = 0;
  return cudaSuccess;
}
cudaError_t cudaDriverGetVersion(int* version) {
  *version = 0;
  return cudaSuccess;
}
cudaError_t cudaRuntimeGetVersion(int* version) {
  *version = 0;
  return cudaSuccess;
}
cudaError_t cudaGetLastError() { return cudaSuccess; }
cudaError_t cudaMalloc(void** ptr, size_t bytes) {
  *ptr = ::operator new(bytes, kDeviceAlignment, std::nothrow);
  return *ptr != nullptr ? cudaSuccess : cudaErrorMemoryAllocation;
}
cudaError_t cudaFree(void* ptr) {
  ::operator delete(ptr, kDeviceAlignment);
  return cudaSuccess;
}
cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind) {
  if (bytes > 0) std::memcpy(dst, src, bytes);
  return cudaSuccess;
}
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, cudaStream_t) {
  return cudaMemcpy(dst, src, bytes, kind);
}
cudaError_t cudaMemsetAsync(void* dst, int value, size_t bytes, cudaStream_t) {
  if (bytes > 0) std::memset(dst, value, bytes);
  return cudaSuccess;
}
cudaError_t cudaDeviceSynchronize() { return cudaSuccess; }
cudaError_t cudaEventCreate(cudaEvent_t* event) {
  *event = new EmuEvent{};
  return cudaSuccess;
}
cudaError_t cudaEventDestroy(cudaEvent_t event) {
  delete event;
  return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t) {
  event->at = std::chrono::steady_clock::now();
  return cudaSuccess;
}
cudaError_t cudaEventSynchronize(cudaEvent_t) { return cudaSuccess; }
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t stop) {
  *ms = std::chrono::duration<float, std::milli>(stop->at - start->at).count();
  return cudaSuccess;
}
