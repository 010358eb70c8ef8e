#pragma once
// Internal to server/http: the pieces one connection's coroutine is made of.
#include "server/http/asio_coroutines.hpp"
#include <boost/asio/awaitable.hpp>
#include <boost/beast/core/tcp_stream.hpp>
#include <boost/beast/http/message.hpp>
#include <boost/beast/http/string_body.hpp>

#include <chrono>
#include <string>

#include "server/api/frontend.hpp"

namespace fp8serve::http_detail {

namespace beast = boost::beast;
namespace http = boost::beast::http;
namespace net = boost::asio;

struct SessionLimits {
  uint64_t max_body_bytes = 4 << 20;
  uint32_t max_header_bytes = 16 << 10;
  std::chrono::milliseconds request_timeout{30000};
};

// What the access log needs to know about one answered request.
struct AccessRecord {
  std::string request_id;
  std::string route;
  int status = 0;
  int prompt_tokens = 0;
  int completion_tokens = 0;
  double ttft_s = -1;
  double total_s = 0;
  std::string finish;  // generation routes: stop, length, abort (client gone), error
};

void log_access(const AccessRecord& record);

// Serves one connection until it closes.
net::awaitable<void> run_session(beast::tcp_stream stream, ApiFrontend& frontend, SessionLimits limits);

// Runs one generation job on the connection: submits its requests, streams or collects the
// outputs, aborts them when the client goes away. Returns false when the connection is unusable.
net::awaitable<bool> run_job(beast::tcp_stream& stream, ApiFrontend& frontend, GenerationJob job,
                             const http::request<http::string_body>& request, const std::string& request_id,
                             SessionLimits limits, AccessRecord& access);

}  // namespace fp8serve::http_detail
