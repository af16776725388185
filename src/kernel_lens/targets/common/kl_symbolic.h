// kl_symbolic.h -- exact integer helpers for kernel_lens generated C++/CUDA.
//
// Why this exists: kernel_lens prints symbolic grid sizes, shapes and
// shape-derived scalars (integer sympy expressions) as int64_t C++ expressions
// (see kernel_lens/codegen/cxx.py). sympy and Python round integer division
// toward -infinity and give `a % b` the sign of b, while C++ `/` and `%`
// truncate toward zero, so `(s0 - 1) / 4` or `x % 8` would silently disagree
// with the expression they were printed from as soon as an operand is
// negative. These helpers reproduce the exact Python/sympy semantics.
//
// Preconditions (Python would raise; C++ cannot): divisors are non-zero,
// kl_pow's exponent is >= 0, and no result or intermediate overflows int64_t.
// Usable from host code and, under nvcc/hipcc, from device code.
#pragma once

#include <cstdint>

#ifndef KL_SYMBOLIC_HD
#if defined(__CUDACC__) || defined(__HIPCC__)
#define KL_SYMBOLIC_HD __host__ __device__
#else
#define KL_SYMBOLIC_HD
#endif
#endif

// Python a // b (floor division).
KL_SYMBOLIC_HD static inline constexpr int64_t kl_floordiv(int64_t a, int64_t b) {
  const int64_t q = a / b;
  const int64_t r = a % b;
  return (r != 0 && ((r < 0) != (b < 0))) ? q - 1 : q;
}

// -(-a // b): the ceiling of a / b, without negating a (no overflow at INT64_MIN).
KL_SYMBOLIC_HD static inline constexpr int64_t kl_ceildiv(int64_t a, int64_t b) {
  const int64_t q = a / b;
  const int64_t r = a % b;
  return (r != 0 && ((r < 0) == (b < 0))) ? q + 1 : q;
}

// Python a % b: zero or the sign of b.
KL_SYMBOLIC_HD static inline constexpr int64_t kl_mod(int64_t a, int64_t b) {
  if (b == -1) return 0;  // INT64_MIN % -1 traps on x86; the answer is 0.
  const int64_t r = a % b;
  return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r;
}

KL_SYMBOLIC_HD static inline constexpr int64_t kl_min(int64_t a, int64_t b) {
  return b < a ? b : a;
}

KL_SYMBOLIC_HD static inline constexpr int64_t kl_max(int64_t a, int64_t b) {
  return a < b ? b : a;
}

// base ** exp for exp >= 0 by square-and-multiply. The last squaring is
// skipped, so no intermediate exceeds |result| when the result fits int64_t.
KL_SYMBOLIC_HD static inline constexpr int64_t kl_pow(int64_t base, int64_t exp) {
  int64_t result = 1;
  while (exp > 0) {
    if (exp & 1) result *= base;
    exp >>= 1;
    if (exp > 0) base *= base;
  }
  return result;
}
