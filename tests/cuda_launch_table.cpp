// Prints the CUDA launch tables (csrc/common/launch.h and the domains'
// *_launch.h, the headers the launchers take their configurations from) as
// JSON, for tests/test_cuda_resources.py. Built on the host by
// tests/cuda_ptxas.py (nvcc as the host compiler driver); no GPU, no CUDA
// headers.
//
//   cuda_launch_table                       the kernels: max/min threads, max dynamic smem, hot
//   cuda_launch_table score Q ROWS          the tiled score kernel's launches
//   cuda_launch_table int8 Q N SMS K WIDTH  the int8 search's kernel configuration and launches
//   cuda_launch_table scan N Q K TERMS D OPTIN SMS   the scan's configuration and grid
//   cuda_launch_table scans                 the same for each line "N Q K TERMS D OPTIN SMS" of stdin
//   cuda_launch_table sample B N SUBSETS    the warp sampler's plan
//   cuda_launch_table gram DTYPE N          the Gram sampler's shared memory (DTYPE 0 f32, 1 f16, 2 bf16) and float32 tile
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "sampling/cuda/sampling_launch.h"
#include "topn/cuda/topn_launch.h"

using namespace rcn_fast;

namespace {

long long arg(char** argv, int i) { return std::strtoll(argv[i], nullptr, 10); }

void grids(const std::vector<launch::Grid>& gs) {
  std::printf("{\"launches\": [");
  for (size_t i = 0; i < gs.size(); ++i)
    std::printf("%s{\"x\": %lld, \"y\": %lld, \"y0\": %lld}", i ? ", " : "", (long long)gs[i].x, (long long)gs[i].y,
                (long long)gs[i].y0);
  std::printf("]}\n");
}

// The scan's configuration and grid for N rows, Q queries, k, terms, d, the
// opt-in shared memory and the SM count, as one JSON object.
void scan(long long N, long long Q, long long k, long long terms, long long d, long long optin, long long sms,
          const char* end = "\n") {
  const int dpad = int((d + cuda::kScanDepth - 1) / cuda::kScanDepth * cuda::kScanDepth);
  const cuda::ScanConfig c = cuda::scan_config(Q, k, int(terms), dpad, optin);
  if (c.nt == 0) {
    std::printf("{\"nt\": 0}%s", end);
    return;
  }
  const cuda::ScanGrid g = cuda::scan_grid(N, Q, k, c, sms);
  std::printf("{\"nt\": %d, \"tiles\": %d, \"smem\": %zu, \"S\": %lld, \"slice\": %lld, \"groups\": %lld}%s", c.nt,
              c.tiles, c.smem, (long long)g.S, (long long)g.slice, (long long)g.groups, end);
}

}  // namespace

int main(int argc, char** argv) {
  try {
    if (argc == 1) {
      std::vector<launch::KernelSpec> specs = cuda::topn_kernel_specs();
      for (const auto& s : cuda::sampling_kernel_specs()) specs.push_back(s);
      std::printf("{\"max_grid_x\": %lld, \"max_grid_yz\": %lld, \"default_smem\": %lld, \"kernels\": [",
                  (long long)launch::kMaxGridX, (long long)launch::kMaxGridYZ, (long long)launch::kDefaultSmem);
      for (size_t i = 0; i < specs.size(); ++i)
        std::printf("%s{\"kernel\": \"%s\", \"max_threads\": %d, \"min_threads\": %d, \"max_dynamic_smem\": %lld, "
                    "\"hot\": %s}",
                    i ? ", " : "", specs[i].kernel, specs[i].max_threads, specs[i].min_threads,
                    (long long)specs[i].max_dynamic_smem, specs[i].hot ? "true" : "false");
      std::printf("]}\n");
      return 0;
    }
    const std::string what = argv[1];
    if (what == "score" && argc == 4) {
      grids(cuda::score_launches(arg(argv, 2), arg(argv, 3)));
    } else if (what == "int8" && argc == 7) {
      const cuda::Int8ScanConfig c = cuda::int8_scan_config(arg(argv, 2), arg(argv, 5), arg(argv, 6));
      std::printf("{\"mma\": %s, \"group\": %d, \"atiles\": %d, \"chunks\": %d, \"smem\": %zu, ",
                  c.mma ? "true" : "false", c.group, c.atiles, c.chunks, c.smem);
      std::printf("\"kernel\": \"%s\", \"plan\": ", c.mma ? "int8_mma_kernel" : "int8_dp4a_kernel");
      const auto gs = cuda::int8_scan_launches(arg(argv, 2), arg(argv, 3), c.group, arg(argv, 4));
      std::printf("[");
      for (size_t i = 0; i < gs.size(); ++i)
        std::printf("%s{\"x\": %lld, \"y\": %lld, \"y0\": %lld}", i ? ", " : "", (long long)gs[i].x,
                    (long long)gs[i].y, (long long)gs[i].y0);
      std::printf("]}\n");
    } else if (what == "scan" && argc == 9) {
      scan(arg(argv, 2), arg(argv, 3), arg(argv, 4), arg(argv, 5), arg(argv, 6), arg(argv, 7), arg(argv, 8));
    } else if (what == "scans" && argc == 2) {
      long long v[7];
      std::printf("[");
      for (int n = 0; std::scanf("%lld %lld %lld %lld %lld %lld %lld", v, v + 1, v + 2, v + 3, v + 4, v + 5, v + 6) == 7;
           ++n) {
        std::printf("%s", n ? ", " : "");
        scan(v[0], v[1], v[2], v[3], v[4], v[5], v[6], "");
      }
      std::printf("]\n");
    } else if (what == "sample" && argc == 5) {
      const cuda::SamplePlan s = cuda::sample_plan(arg(argv, 2), arg(argv, 3), arg(argv, 4));
      std::printf("{\"warps\": %d, \"blocks\": %lld, \"chunk\": %lld, \"per_block_bytes\": %lld}\n", s.warps,
                  (long long)s.blocks, (long long)s.chunk, (long long)s.per_block_bytes);
    } else if (what == "gram" && argc == 4) {
      const DType t = arg(argv, 2) == 0 ? DType::F32 : arg(argv, 2) == 1 ? DType::F16 : DType::BF16;
      const int npad = gram::padded_rows(arg(argv, 3));
      std::printf("{\"smem\": %zu, \"f32_tile\": %d}\n", cuda::gram_smem(t, npad), cuda::gram_f32_tile(npad));
    } else {
      std::fprintf(stderr, "usage: see the header of tests/cuda_launch_table.cpp\n");
      return 2;
    }
  } catch (const std::exception& e) {
    std::printf("{\"error\": \"%s\"}\n", e.what());
  }
  return 0;
}
