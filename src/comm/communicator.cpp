// ThreadGroup: an all-gather between threads of one process. One gather at a time per group:
// ranks deposit their bytes in their slot; when the last one arrives the gather is complete and
// every rank copies all slots out; the last reader opens the group for the next gather. Waits
// are bounded by the group's timeout; a timeout or abort() poisons the group (every pending and
// later call throws), so no rank is left waiting for one that has gone.
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "detops/communicator.h"
#include "internal/common.h"

namespace detops {

struct ThreadGroup::State {
  int size = 0;
  std::chrono::milliseconds timeout{};
  std::mutex mu;
  std::condition_variable cv;
  std::uint64_t generation = 0;  // gathers completed
  int arrived = 0;
  int readers = 0;               // ranks still to copy out the complete gather
  bool complete = false;
  std::vector<std::vector<unsigned char>> slots;
  std::vector<bool> present;
  bool aborted = false;
  std::string reason;

  [[noreturn]] void throw_aborted() const {
    internal::fail(ErrorCode::kCommunication, "thread-group all_gather: the group was aborted: {}", reason);
  }

  void abort_locked(std::string why) {
    if (!aborted) {
      aborted = true;
      reason = std::move(why);
    }
    cv.notify_all();
  }

  std::string missing_ranks() const {
    std::string s;
    for (int r = 0; r < size; ++r)
      if (!present[static_cast<std::size_t>(r)]) s += (s.empty() ? "" : ", ") + std::to_string(r);
    return s;
  }

  void all_gather(int rank, const void* send, void* recv, std::size_t bytes) {
    std::unique_lock<std::mutex> lock(mu);
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    auto wait = [&](auto ready, const char* what) {
      while (!aborted && !ready()) {
        if (cv.wait_until(lock, deadline) == std::cv_status::timeout && !aborted && !ready()) {
          abort_locked(fmt::format("rank {} waited {} ms {} (gather #{}); ranks not arrived: {}", rank,
                                   timeout.count(), what, generation + 1, missing_ranks()));
        }
      }
      if (aborted) throw_aborted();
    };
    if (aborted) throw_aborted();
    // a previous gather may still be being read
    wait([&] { return !complete; }, "for the previous gather to drain");
    auto& slot = slots[static_cast<std::size_t>(rank)];
    if (present[static_cast<std::size_t>(rank)])
      internal::fail(ErrorCode::kCommunication, "thread-group all_gather: rank {} called twice in gather #{}", rank,
                     generation + 1);
    slot.assign(static_cast<const unsigned char*>(send), static_cast<const unsigned char*>(send) + bytes);
    present[static_cast<std::size_t>(rank)] = true;
    if (++arrived == size) {
      complete = true;
      readers = size;
      cv.notify_all();
    } else {
      const std::uint64_t mine = generation;
      wait([&] { return complete && generation == mine; }, "for the other ranks");
    }
    // copy out (or find a size mismatch, reported identically on every rank)
    std::string mismatch;
    for (int r = 0; r < size; ++r)
      if (slots[static_cast<std::size_t>(r)].size() != slots[0].size())
        mismatch = fmt::format("rank 0 sent {} bytes, rank {} sent {}", slots[0].size(), r,
                               slots[static_cast<std::size_t>(r)].size());
    if (mismatch.empty() && bytes == slots[0].size()) {
      auto* out = static_cast<unsigned char*>(recv);
      for (int r = 0; r < size; ++r)
        if (bytes) std::memcpy(out + static_cast<std::size_t>(r) * bytes, slots[static_cast<std::size_t>(r)].data(), bytes);
    }
    if (--readers == 0) {
      complete = false;
      arrived = 0;
      ++generation;
      for (int r = 0; r < size; ++r) present[static_cast<std::size_t>(r)] = false;
      cv.notify_all();
    }
    if (!mismatch.empty())
      internal::fail(ErrorCode::kCommunication, "thread-group all_gather: the ranks disagree on the size: {}", mismatch);
  }
};

namespace {

class ThreadGroupCommunicator final : public Communicator {
 public:
  ThreadGroupCommunicator(std::shared_ptr<ThreadGroup::State> state, int rank) : state_(std::move(state)), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return state_->size; }
  const char* name() const override { return "thread-group"; }
  void all_gather(const void* send, void* recv, std::size_t bytes, Device device, void*) override {
    if (!device.is_cpu())
      internal::fail(ErrorCode::kInvalidArgument,
                     "thread-group all_gather: buffers on {}; expected host memory (detops stages device data)",
                     to_string(device));
    state_->all_gather(rank_, send, recv, bytes);
  }

 private:
  std::shared_ptr<ThreadGroup::State> state_;
  int rank_;
};

}  // namespace

ThreadGroup::ThreadGroup(int size, std::chrono::milliseconds timeout) : state_(std::make_shared<State>()) {
  if (size < 1) internal::fail(ErrorCode::kInvalidArgument, "ThreadGroup: size is {}; expected at least 1", size);
  if (timeout.count() <= 0)
    internal::fail(ErrorCode::kInvalidArgument, "ThreadGroup: timeout is {} ms; expected a positive time",
                   timeout.count());
  state_->size = size;
  state_->timeout = timeout;
  state_->slots.resize(static_cast<std::size_t>(size));
  state_->present.assign(static_cast<std::size_t>(size), false);
}

ThreadGroup::~ThreadGroup() = default;

int ThreadGroup::size() const { return state_->size; }

std::unique_ptr<Communicator> ThreadGroup::communicator(int rank) {
  if (rank < 0 || rank >= state_->size)
    internal::fail(ErrorCode::kInvalidArgument, "ThreadGroup::communicator: rank is {}; expected [0, {})", rank,
                   state_->size);
  return std::make_unique<ThreadGroupCommunicator>(state_, rank);
}

void ThreadGroup::abort(const std::string& reason) {
  std::lock_guard<std::mutex> lock(state_->mu);
  state_->abort_locked(reason);
}

}  // namespace detops
