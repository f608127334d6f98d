// A tiny fork-join helper on std::thread: no OpenMP runtime, so the module
// never clashes with the one torch or numpy ship.
#pragma once
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace rcn_fast {

// Threads to use: RCN_FAST_NUM_THREADS if set (>= 1), else the CPUs this
// process may run on.
int default_num_threads();

// Run fn(t) for t in [0, n) on up to n threads (the caller runs t = 0).
// Exceptions are rethrown on the caller after all threads joined. A thread
// the system refuses to create (address space, process limits) is not an
// error: its fn(t) runs on the caller after fn(0), so every t still runs
// once and callers whose results do not depend on the thread layout get
// the same answer with fewer threads.
inline void run_threads(int n, const std::function<void(int)>& fn) {
  if (n <= 1) {
    fn(0);
    return;
  }
  std::vector<std::exception_ptr> errors(static_cast<size_t>(n));
  std::vector<std::thread> pool;
  int started = 1;  // t < started run on their own thread (t = 0: the caller)
  try {
    pool.reserve(size_t(n - 1));
    for (; started < n; ++started) {
      const int t = started;
      pool.emplace_back([&errors, &fn, t] {
        try {
          fn(t);
        } catch (...) {
          errors[size_t(t)] = std::current_exception();
        }
      });
    }
  } catch (...) {
    // std::system_error (EAGAIN) or std::bad_alloc: run the rest here
  }
  for (int t = 0; t < n; t = (t == 0 ? started : t + 1)) {
    try {
      fn(t);
    } catch (...) {
      errors[size_t(t)] = std::current_exception();
    }
  }
  for (auto& th : pool) th.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

// Run fn(t) for t in [0, n) on n threads that all run at once, for work
// whose threads wait on each other (a barrier). The threads are started
// first and released together; when the system refuses one, none runs fn:
// the started ones are released, joined, and std::runtime_error is thrown.
inline void run_threads_together(int n, const std::function<void(int)>& fn) {
  if (n <= 1) {
    fn(0);
    return;
  }
  std::vector<std::exception_ptr> errors(static_cast<size_t>(n));
  std::vector<std::thread> pool;
  std::mutex m;
  std::condition_variable cv;
  int gate = 0;  // 0: wait, 1: run, 2: abandon
  auto open_gate = [&](int to) {
    {
      std::lock_guard<std::mutex> lock(m);
      gate = to;
    }
    cv.notify_all();
  };
  int started = 1;
  try {
    pool.reserve(size_t(n - 1));
    for (; started < n; ++started) {
      const int t = started;
      pool.emplace_back([&, t] {
        {
          std::unique_lock<std::mutex> lock(m);
          cv.wait(lock, [&] { return gate != 0; });
          if (gate == 2) return;
        }
        try {
          fn(t);
        } catch (...) {
          errors[size_t(t)] = std::current_exception();
        }
      });
    }
  } catch (...) {
    open_gate(2);
    for (auto& th : pool) th.join();
    throw std::runtime_error("could not start " + std::to_string(n) + " threads (the system refused thread " +
                             std::to_string(started) + "); lower RCN_FAST_NUM_THREADS or the lane count");
  }
  open_gate(1);
  try {
    fn(0);
  } catch (...) {
    errors[0] = std::current_exception();
  }
  for (auto& th : pool) th.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

// Even split of [0, n) into parts; returns [begin, end) of part i.
inline void split_range(int64_t n, int parts, int i, int64_t& begin, int64_t& end) {
  const int64_t base = n / parts, extra = n % parts;
  begin = i * base + (i < extra ? i : extra);
  end = begin + base + (i < extra ? 1 : 0);
}

}  // namespace rcn_fast
