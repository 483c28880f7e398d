#pragma once

// A FIFO for the tests of code that must refuse one without blocking, and a
// watchdog that unblocks the code under test if it does block, so that the
// test fails rather than hangs.

#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>

namespace d2l::testing {

class FifoWatchdog {
 public:
  /// The side the code under test opens `fifo` from: after five seconds
  /// unless finished, the watchdog opens the other side, which lets a
  /// blocked open return: as a writer it closes at once (the reader sees the
  /// end of the file); as a reader it drains what is written until finish.
  enum class Side { kReader, kWriter };

  FifoWatchdog(std::string fifo, Side tested)
      : thread_([this, fifo = std::move(fifo), tested] {
          for (int i = 0; i < 500 && !done_; ++i) {
            std::this_thread::sleep_for(std::chrono::milliseconds(10));
          }
          if (done_) return;
          const int fd =
              ::open(fifo.c_str(), (tested == Side::kReader ? O_WRONLY : O_RDONLY) | O_NONBLOCK);
          fired_ = fd >= 0;
          if (fd < 0) return;
          char buffer[4096];
          while (tested == Side::kWriter && !done_) {
            if (::read(fd, buffer, sizeof buffer) <= 0) {
              std::this_thread::sleep_for(std::chrono::milliseconds(1));
            }
          }
          ::close(fd);
        }) {}
  ~FifoWatchdog() {
    if (thread_.joinable()) finish();
  }
  FifoWatchdog(const FifoWatchdog&) = delete;
  FifoWatchdog& operator=(const FifoWatchdog&) = delete;

  /// Whether it had to unblock the code under test.
  bool finish() {
    done_ = true;
    thread_.join();
    return fired_;
  }

 private:
  std::atomic<bool> done_{false}, fired_{false};
  std::thread thread_;
};

/// Makes a FIFO at `path` (replacing nothing: the path must not exist).
inline void make_fifo(const std::string& path) {
  ASSERT_EQ(::mkfifo(path.c_str(), 0600), 0) << path;
}

}  // namespace d2l::testing
