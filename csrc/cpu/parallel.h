// A tiny fork-join helper on std::thread: no OpenMP runtime, so the module
// never clashes with the one torch or numpy ship.
#pragma once
#include <cstdint>
#include <exception>
#include <functional>
#include <thread>
#include <vector>

namespace rcn_fast {

// Threads to use: RCN_FAST_NUM_THREADS if set (>= 1), else the CPUs this
// process may run on.
int default_num_threads();

// Run fn(t) for t in [0, n) on n threads (the caller runs t = 0).
// Exceptions are rethrown on the caller after all threads joined.
inline void run_threads(int n, const std::function<void(int)>& fn) {
  if (n <= 1) {
    fn(0);
    return;
  }
  std::vector<std::thread> pool;
  std::vector<std::exception_ptr> errors(static_cast<size_t>(n));
  pool.reserve(size_t(n - 1));
  for (int t = 1; t < n; ++t) {
    pool.emplace_back([&, t] {
      try {
        fn(t);
      } catch (...) {
        errors[size_t(t)] = std::current_exception();
      }
    });
  }
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
