// Copyright The nccl-tide authors
// SPDX-License-Identifier: Apache-2.0
// Exercises plugin/compat/glibc_shims.cc (linked into this program, so its definitions take the place of glibc's):
// std::condition_variable's steady_clock waits go through the pthread_cond_clockwait shim, std::random_device
// through arc4random. Prints one line per check, "OK" last; exit status 1 on the first failure.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdint>
#include <mutex>
#include <random>
#include <set>
#include <thread>

extern "C" uint32_t arc4random(void);

int main() {
  using clk = std::chrono::steady_clock;
  std::mutex m;
  std::condition_variable cv;
  // 1. A timed wait nobody signals times out, after its deadline and not much later.
  {
    std::unique_lock<std::mutex> lk(m);
    auto t0 = clk::now();
    bool woke = cv.wait_for(lk, std::chrono::milliseconds(60), [] { return false; });
    double ms = std::chrono::duration<double, std::milli>(clk::now() - t0).count();
    std::printf("timeout %.1f ms\n", ms);
    if (woke || ms < 59.0 || ms > 2000.0) return 1;
  }
  // 2. A notify wakes a long wait early.
  {
    bool ready = false;
    std::thread t([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(30));
      std::lock_guard<std::mutex> g(m);
      ready = true;
      cv.notify_all();
    });
    std::unique_lock<std::mutex> lk(m);
    auto t0 = clk::now();
    bool woke = cv.wait_until(lk, t0 + std::chrono::seconds(20), [&] { return ready; });
    double ms = std::chrono::duration<double, std::milli>(clk::now() - t0).count();
    lk.unlock();
    t.join();
    std::printf("notified %.1f ms\n", ms);
    if (!woke || ms > 5000.0) return 1;
  }
  // 3. arc4random and std::random_device give varying 32-bit values.
  {
    std::set<uint32_t> seen;
    for (int i = 0; i < 64; ++i) seen.insert(arc4random());
    std::random_device rd;
    std::set<unsigned> dev;
    for (int i = 0; i < 64; ++i) dev.insert(rd());
    std::printf("distinct %zu %zu\n", seen.size(), dev.size());
    if (seen.size() < 60 || dev.size() < 60) return 1;
  }
  std::printf("OK\n");
  return 0;
}
