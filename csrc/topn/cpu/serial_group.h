// One host thread as a lane group of the shared selection code
// (topn/topn_select.h, topn/topn_block_select.h): the CPU runs the code the
// CUDA kernels run, one lane at a time.
#pragma once

namespace rcn_fast {

struct SerialGroup {
  int rank() const { return 0; }
  int size() const { return 1; }
  void sync() const {}
  int claim(int* counter) const { return (*counter)++; }
  bool any(bool p) const { return p; }
};

}  // namespace rcn_fast
