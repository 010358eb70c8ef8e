#pragma once
// The HTTP/1.1 server (Boost.Beast, C++20 coroutines): one coroutine per connection on its own
// strand, a small pool of I/O threads, keep-alive, and limits from the first line — body size
// (413), header size (431), a deadline to receive each whole request (slowloris). Everything the
// API decides lives in ApiFrontend; this file only moves bytes and runs GenerationJobs.
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "server/api/frontend.hpp"

namespace fp8serve {

struct HttpServerOptions {
  std::string host = "127.0.0.1";
  uint16_t port = 8000;                // 0: any free port (tests)
  int io_threads = 2;
  uint64_t max_body_bytes = 4 << 20;
  uint32_t max_header_bytes = 16 << 10;
  double request_timeout_s = 30.0;     // to receive one whole request, idle time included
};

class HttpServer {
 public:
  HttpServer(HttpServerOptions options, ApiFrontend& frontend);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Binds, listens and starts the I/O threads. Throws std::runtime_error when it cannot bind.
  void start();
  uint16_t port() const { return bound_port_; }
  // Closes the listener and every connection, joins the I/O threads. Idempotent.
  void stop();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  HttpServerOptions options_;
  ApiFrontend* frontend_ = nullptr;
  uint16_t bound_port_ = 0;
};

}  // namespace fp8serve
