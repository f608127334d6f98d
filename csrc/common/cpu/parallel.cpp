#include "common/cpu/parallel.h"

#include <cstdlib>
#include <string>
#if defined(__linux__)
#include <sched.h>
#endif

namespace rcn_fast {

int default_num_threads() {
  if (const char* env = std::getenv("RCN_FAST_NUM_THREADS")) {
    try {
      const int n = std::stoi(env);
      if (n >= 1) return n;
    } catch (...) {
    }
  }
#if defined(__linux__)
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0) {
    const int n = CPU_COUNT(&set);
    if (n >= 1) return n;
  }
#endif
  const unsigned hw = std::thread::hardware_concurrency();
  return hw ? int(hw) : 1;
}

}  // namespace rcn_fast
