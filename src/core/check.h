// Invariant checks: print the failed condition with operands, file and line, then abort.
// Only for broken invariants (programming errors). User input never reaches these: validate
// it at the edge and return a Status instead.
#pragma once

#include <cstdio>
#include <cstdlib>

#include <fmt/format.h>

namespace deepinfer::detail {
[[noreturn]] inline void check_failed(const char* file, int line, const std::string& what) {
  std::fprintf(stderr, "DI_CHECK failed at %s:%d: %s\n", file, line, what.c_str());
  std::fflush(stderr);
  std::abort();
}
}  // namespace deepinfer::detail

#define DI_CHECK(cond)                                                        \
  do {                                                                        \
    if (!(cond)) ::deepinfer::detail::check_failed(__FILE__, __LINE__, #cond); \
  } while (0)

#define DI_CHECK_OP(a, b, op)                                                            \
  do {                                                                                   \
    const auto& di_a_ = (a);                                                             \
    const auto& di_b_ = (b);                                                             \
    if (!(di_a_ op di_b_))                                                               \
      ::deepinfer::detail::check_failed(                                                 \
          __FILE__, __LINE__, fmt::format("{} {} {} ({} vs {})", #a, #op, #b, di_a_, di_b_)); \
  } while (0)

#define DI_CHECK_EQ(a, b) DI_CHECK_OP(a, b, ==)
#define DI_CHECK_NE(a, b) DI_CHECK_OP(a, b, !=)
#define DI_CHECK_LT(a, b) DI_CHECK_OP(a, b, <)
#define DI_CHECK_LE(a, b) DI_CHECK_OP(a, b, <=)
#define DI_CHECK_GT(a, b) DI_CHECK_OP(a, b, >)
#define DI_CHECK_GE(a, b) DI_CHECK_OP(a, b, >=)
