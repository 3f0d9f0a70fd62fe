// The emulated binding of the device interface (src/internal/device_steps.h): the CUDA backend's
// step sequences run on the CPU, launch by launch. A launch runs its body for every thread index
// in order; the stand-ins for CUB keep CUB's contracts: a stable sort by the key bits
// [0, end_bit) only, run-length encode, exclusive scan and reductions (over counts: a negative,
// overflowing or poisoned input, i.e. memory no step wrote, is an error), each refusing temporary storage
// smaller than its own query and scribbling over the storage it is given (so a temporary
// buffer carved over a live one shows). The atomic add is a plain add in thread order.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <stdexcept>
#include <string>
#include <vector>

#include "detops/context.h"
#include "detops/detail/gather_backward.h"
#include "detops/dtype.h"
#include "internal/common.h"

namespace detops {
namespace test {

/// The byte PoisonedWorkspace fills with, as an int64: what the device's integer steps read where
/// no step wrote.
constexpr std::int64_t kPoison64 = 0x7f7f7f7f7f7f7f7f;

struct EmulatedDevice {
  const char* op = "emulated";
  Context ctx{};  // scratch memory: the default allocator on the CPU
  /// Every launch, as "name:threads", in order (for tests of the sequence itself).
  std::vector<std::string>* trace = nullptr;

  template <class T>
  struct Add {
    T* base;
    void operator()(std::int64_t offset, acc_t<T> v) const {
      base[offset] = from_acc<T>(to_acc(base[offset]) + v);
    }
  };

  /// With block > 0: each launch runs as a grid-stride loop over `blocks` blocks of `block`
  /// threads, block by block, thread by thread (a grid smaller than n makes threads loop), and
  /// checks that every index in [0, n) is visited exactly once. Otherwise indices in order (what
  /// the launcher's grid gives for any n below 2^28).
  std::int64_t block = 0, blocks = 0;

  struct MinU64 {
    unsigned long long* p;
    void operator()(std::int64_t v) const { *p = std::min(*p, static_cast<unsigned long long>(v)); }
  };
  struct AddI64 {
    std::int64_t* base;
    void operator()(std::int64_t i, std::int64_t v) const { base[i] += v; }
  };

  template <class Body>
  void launch(const char* name, std::int64_t n, const Body& body) const {
    if (n <= 0) return;
    if (trace) trace->push_back(std::string(name) + ":" + std::to_string(n));
    const Body copy = body;  // a kernel gets its arguments by value
    if (block <= 0) {
      for (std::int64_t t = 0; t < n; ++t) copy(t);
      return;
    }
    std::vector<unsigned char> visits(static_cast<std::size_t>(n), 0);
    for (std::int64_t b = 0; b < blocks; ++b)
      for (std::int64_t t = 0; t < block; ++t)
        for (std::int64_t i = b * block + t; i < n; i += block * blocks) {
          ++visits[static_cast<std::size_t>(i)];
          copy(i);
        }
    for (unsigned char v : visits)
      if (v != 1)
        throw std::logic_error(std::string(name) + ": a grid of " + std::to_string(blocks) + " x " +
                               std::to_string(block) + " did not visit every index once");
  }
  void zero(void* p, std::size_t bytes) const {
    if (bytes > 0) std::memset(p, 0, bytes);
  }

  // Temporary sizes of the stand-ins: what a sort of n pairs would need, and a little for the
  // others, so a layout that forgets to reserve it overlaps something.
  std::size_t sort_pairs_bytes(std::int64_t n, int end_bit) const {
    return static_cast<std::size_t>(n) * 16 + static_cast<std::size_t>(end_bit) + 64;
  }
  std::size_t run_length_encode_bytes(std::int64_t n) const { return static_cast<std::size_t>(n) + 32; }
  std::size_t exclusive_sum_bytes(std::int64_t n) const { return static_cast<std::size_t>(n) / 2 + 16; }

  void sort_pairs(void* temp, std::size_t bytes, const detail::GatherKey* keys_in, detail::GatherKey* keys_out,
                  const detail::GatherIndex* ids_in, detail::GatherIndex* ids_out, std::int64_t n, int end_bit) const {
    use_temp(temp, bytes, sort_pairs_bytes(n, end_bit), "sort_pairs");
    if (end_bit < 1 || end_bit > 32) throw std::logic_error("sort_pairs: end_bit out of [1, 32]");
    const std::uint64_t mask = (std::uint64_t{1} << end_bit) - 1;  // only bits [0, end_bit) sort
    std::vector<std::int64_t> order(static_cast<std::size_t>(n));
    std::iota(order.begin(), order.end(), std::int64_t{0});
    std::stable_sort(order.begin(), order.end(), [&](std::int64_t a, std::int64_t b) {
      return (keys_in[a] & mask) < (keys_in[b] & mask);
    });
    for (std::int64_t i = 0; i < n; ++i) {
      keys_out[i] = keys_in[order[static_cast<std::size_t>(i)]];
      ids_out[i] = ids_in[order[static_cast<std::size_t>(i)]];
    }
  }
  void run_length_encode(void* temp, std::size_t bytes, const detail::GatherKey* in, detail::GatherKey* unique,
                         detail::GatherIndex* counts, detail::GatherIndex* num_runs, std::int64_t n) const {
    use_temp(temp, bytes, run_length_encode_bytes(n), "run_length_encode");
    std::int64_t runs = 0;
    for (std::int64_t i = 0; i < n;) {
      std::int64_t e = i + 1;
      while (e < n && in[e] == in[i]) ++e;
      unique[runs] = in[i];
      counts[runs] = static_cast<detail::GatherIndex>(e - i);
      ++runs;
      i = e;
    }
    *num_runs = static_cast<detail::GatherIndex>(runs);
  }
  /// Over int64 counts or the engine's int32 run lengths (CUB's ExclusiveSum takes either).
  template <class I>
  void exclusive_sum(void* temp, std::size_t bytes, const I* in, I* out, std::int64_t n) const {
    use_temp(temp, bytes, exclusive_sum_bytes(n), "exclusive_sum");
    I sum = 0;
    for (std::int64_t i = 0; i < n; ++i) {
      const I v = in[i];
      out[i] = sum;
      // Counts are never negative and never overflow, nor do they hold the poison of a workspace
      // byte no step wrote (PoisonedWorkspace's 0x7f): such an input is memory no step wrote.
      if (v < 0 || v == static_cast<I>(kPoison64) || __builtin_add_overflow(sum, v, &sum))
        throw std::logic_error("exclusive_sum: input " + std::to_string(i) + " is " + std::to_string(v) +
                               " after a sum of " + std::to_string(out[i]) + "; expected written counts");
    }
  }

  std::size_t reduce_sum_bytes(std::int64_t n) const { return static_cast<std::size_t>(n) / 4 + 8; }
  std::size_t reduce_max_bytes(std::int64_t n) const { return static_cast<std::size_t>(n) / 4 + 8; }
  void reduce_sum(void* temp, std::size_t bytes, const std::int64_t* in, std::int64_t* out, std::int64_t n) const {
    use_temp(temp, bytes, reduce_sum_bytes(n), "reduce_sum");
    std::int64_t sum = 0;
    for (std::int64_t i = 0; i < n; ++i)
      if (in[i] == kPoison64 || __builtin_add_overflow(sum, in[i], &sum))
        throw std::logic_error("reduce_sum: input " + std::to_string(i) + " is memory no step wrote");
    *out = sum;
  }
  void reduce_max(void* temp, std::size_t bytes, const std::int64_t* in, std::int64_t* out, std::int64_t n) const {
    use_temp(temp, bytes, reduce_max_bytes(n), "reduce_max");
    std::int64_t m = std::numeric_limits<std::int64_t>::lowest();  // CUB's identity for an empty input
    for (std::int64_t i = 0; i < n; ++i) {
      if (in[i] == kPoison64) throw std::logic_error("reduce_max: input " + std::to_string(i) + " is memory no step wrote");
      m = std::max(m, in[i]);
    }
    *out = m;
  }
  void copy_to_device(void* dst, const void* src, std::size_t bytes) const {
    if (bytes > 0) std::memcpy(dst, src, bytes);
  }
  void copy_to_host(void* dst, const void* src, std::size_t bytes) const {
    if (bytes > 0) std::memcpy(dst, src, bytes);
  }
  void wait() const {}

 private:
  static void use_temp(void* temp, std::size_t bytes, std::size_t needed, const char* what) {
    if (temp == nullptr || bytes < needed)
      throw std::logic_error(std::string(what) + ": temporary storage of " + std::to_string(bytes) + " bytes; " +
                             std::to_string(needed) + " needed");
    std::memset(temp, 0xA5, bytes);
  }
};

/// A workspace of `bytes` (aligned as the backends' are) filled with a pattern, so a step that
/// reads memory no step wrote (a missing zero fill) changes the result.
struct PoisonedWorkspace {
  std::vector<unsigned char> storage;
  Workspace ws;
  explicit PoisonedWorkspace(std::size_t bytes) : storage(bytes + internal::WorkspaceLayout::kAlign, 0x7f) {
    constexpr std::uintptr_t a = internal::WorkspaceLayout::kAlign;
    const auto p = reinterpret_cast<std::uintptr_t>(storage.data());
    ws = Workspace{reinterpret_cast<void*>((p + a - 1) / a * a), bytes};
  }
};

}  // namespace test
}  // namespace detops
