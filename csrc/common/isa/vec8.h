// 8-lane float vectors (GCC/clang vector extensions) shared by the ISA
// variant files (csrc/*/isa/*.cpp). Include it inside `namespace RCN_ISA {
// namespace {`: each variant keeps its own copy, compiled with its flags.
// Needs <cstdint> and <cstring> included before the namespaces.
#ifndef RCN_FAST_CPU_ISA_VEC8_H
#define RCN_FAST_CPU_ISA_VEC8_H

typedef float v8f __attribute__((vector_size(32)));
typedef uint16_t v8u16 __attribute__((vector_size(16)));
typedef uint32_t v8u32 __attribute__((vector_size(32)));
#if defined(__FLT16_MAX__)  // the compiler has _Float16 for this target (GCC >= 12, clang >= 15 on x86-64)
#define RCN_HAVE_FLOAT16 1
typedef _Float16 v8h __attribute__((vector_size(16)));
#endif

inline v8f vload(const float* p) {
  v8f v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
// Pairwise horizontal sum in a fixed order (the same in every variant).
inline float hsum(v8f v) {
  return ((v[0] + v[4]) + (v[1] + v[5])) + ((v[2] + v[6]) + (v[3] + v[7]));
}

#endif  // RCN_FAST_CPU_ISA_VEC8_H
