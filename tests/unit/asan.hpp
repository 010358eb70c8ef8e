#pragma once
// FP8SERVE_TEST_ASAN: 1 in a build with AddressSanitizer (GCC's macro or clang's feature), else 0,
// for the tests whose behaviour ASan changes (it aborts where a failed allocation would be seen).
#if defined(__SANITIZE_ADDRESS__)
#define FP8SERVE_TEST_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define FP8SERVE_TEST_ASAN 1
#endif
#endif
#if !defined(FP8SERVE_TEST_ASAN)
#define FP8SERVE_TEST_ASAN 0
#endif
