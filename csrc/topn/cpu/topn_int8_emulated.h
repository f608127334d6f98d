// Test aid: the CUDA int8 search (topn/cuda/topn_int8.cu) on the host. The
// launcher's configuration and grid (topn/cuda/topn_launch.h), every
// block's lanes and tiles, the fragments of mma.m16n8k32.s8 (emulated from
// the PTX ISA's layout) or the __dp4a lanes and their shuffles, and
// filter_tile (topn/topn_int8_scan.h) with one host thread as the block.
// The blocks of a query group take their tiles in turns (block 0's first
// tile, block 1's first, ..., block 0's second ...), as blocks running side
// by side would; the bound they publish is the one the next tile reads.
#pragma once
#include <cstdint>

#include "topn/topn_int8_scan.h"

namespace rcn_fast {

// Runs the search of `st` (host pointers) as the kernels would on a GPU
// with `sms` multiprocessors.
void topn_int8_scan_emulated(const topn_int8::ScanState& st, int64_t sms);

// The dots of mma.m16n8k32.row.col.s32.s8.s8.s32 for a warp's registers
// a[32][4], b[32][2] (lane-major), added to c[32][4], by the PTX ISA's
// fragment layout.
void mma16832_s8_emulated(const uint32_t (*a)[4], const uint32_t (*b)[2], int32_t (*c)[4]);

}  // namespace rcn_fast
