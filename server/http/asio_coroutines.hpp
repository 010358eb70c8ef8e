#pragma once
// Include before any Boost.Asio header. Boost 1.74 enables co_await for clang only through
// <experimental/coroutine> (libc++); clang 14 with libstdc++ 12 has the standard <coroutine>,
// which Asio then uses (BOOST_ASIO_HAS_STD_COROUTINE), so say that co_await is there too.
#if defined(__clang__) && defined(__cpp_impl_coroutine) && !defined(BOOST_ASIO_HAS_CO_AWAIT)
#define BOOST_ASIO_HAS_CO_AWAIT 1
#endif
