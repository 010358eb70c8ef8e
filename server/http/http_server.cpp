#include "server/http/http_server.hpp"

#include "server/http/asio_coroutines.hpp"  // first of the Asio includes

#include <spdlog/spdlog.h>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/core/string.hpp>
#include <boost/beast/http.hpp>

#include <array>
#include <atomic>
#include <chrono>
#include <optional>
#include <random>
#include <stdexcept>

#include "server/http/session.hpp"

namespace fp8serve {

namespace http_detail {

void log_access(const AccessRecord& r) {
  spdlog::info("{} {} {} prompt_tokens={} completion_tokens={} ttft={:.3f}s total={:.3f}s{}{}", r.request_id, r.route, r.status,
               r.prompt_tokens, r.completion_tokens, r.ttft_s < 0 ? 0.0 : r.ttft_s, r.total_s,
               r.finish.empty() ? "" : " finish=", r.finish);
}

namespace {

std::string new_request_id() {
  // Unique and unguessable enough for log correlation; 64 random bits as 16 hex digits.
  thread_local std::mt19937_64 rng{std::random_device{}()};
  static constexpr char kHex[] = "0123456789abcdef";
  uint64_t x = rng();
  std::string id(16, '0');
  for (int i = 15; i >= 0; --i, x >>= 4) id[static_cast<size_t>(i)] = kHex[x & 15];
  return id;
}

http::response<http::string_body> make_response(const HttpReply& reply, unsigned version, bool keep_alive,
                                               const std::string& request_id) {
  http::response<http::string_body> res{static_cast<http::status>(reply.status), version};
  res.set(http::field::server, "fp8serve");
  res.set(http::field::content_type, reply.content_type);
  res.set("X-Request-Id", request_id);
  for (const auto& [name, value] : reply.headers) res.set(name, value);
  res.keep_alive(keep_alive);
  res.body() = reply.body;
  res.prepare_payload();
  return res;
}

// An error found before the request could be handed to the front end (413, 431, 400): answer
// it and close, since the rest of the byte stream cannot be trusted to start a new request.
net::awaitable<void> reply_and_close(beast::tcp_stream& stream, ApiFrontend& frontend, ApiError error,
                                     SessionLimits limits, std::string route, bool head) {
  const std::string request_id = new_request_id();
  auto res = make_response(error_reply(error), 11, false, request_id);
  frontend.metrics().record_http_status(error.status);
  log_access({request_id, route, error.status, 0, 0, -1, 0, {}});
  boost::system::error_code ec;
  stream.expires_after(limits.request_timeout);
  if (head) {  // a response to HEAD never has a body
    http::response_serializer<http::string_body> header_only{res};
    co_await http::async_write_header(stream, header_only, net::redirect_error(net::use_awaitable, ec));
  } else {
    co_await http::async_write(stream, res, net::redirect_error(net::use_awaitable, ec));
  }
  stream.socket().shutdown(net::ip::tcp::socket::shutdown_send, ec);
  // Lingering close: discard what the client is still sending (the rest of an oversized body)
  // for a moment, so that closing with unread data does not reset the connection and destroy
  // the answer before the client reads it.
  std::array<char, 16384> scratch;
  stream.expires_after(std::chrono::seconds(1));
  for (size_t total = 0; !ec && total < (64u << 20);)
    total += co_await stream.async_read_some(net::buffer(scratch), net::redirect_error(net::use_awaitable, ec));
}

// RFC 9112 §3.2: an HTTP/1.1 request needs exactly one Host header; §3.2.2: a server must
// accept the absolute form ("GET http://host:port/v1/models"), whose path is what routes.
std::optional<ApiError> check_request_target(const http::request<http::string_body>& request, std::string& target) {
  const size_t hosts = request.count(http::field::host);
  if (request.version() >= 11 && hosts == 0) return bad_request("HTTP/1.1 requests need a Host header (RFC 9112, 3.2).");
  if (hosts > 1) return bad_request("More than one Host header (RFC 9112, 3.2).");
  target = std::string(request.target());
  const size_t scheme_end = target.find("://");
  if (!target.empty() && target[0] != '/' && scheme_end != std::string::npos) {
    const std::string scheme = target.substr(0, scheme_end);
    if (!beast::iequals(scheme, "http") && !beast::iequals(scheme, "https"))
      return bad_request("Unsupported scheme '" + scheme + "' in the request target.");
    const size_t path = target.find_first_of("/?", scheme_end + 3);
    target = path == std::string::npos ? "/" : target[path] == '?' ? "/" + target.substr(path) : target.substr(path);
  }
  return std::nullopt;
}

}  // namespace

net::awaitable<void> run_session(beast::tcp_stream stream, ApiFrontend& frontend, SessionLimits limits) {
  beast::flat_buffer buffer;
  for (;;) {
    http::request_parser<http::string_body> parser;
    parser.header_limit(limits.max_header_bytes);
    parser.body_limit(limits.max_body_bytes);
    boost::system::error_code ec;
    // One deadline for the whole request, idle wait included: a slowloris client that dribbles
    // its headers is cut off as surely as one that sends nothing.
    stream.expires_after(limits.request_timeout);
    co_await http::async_read_header(stream, buffer, parser, net::redirect_error(net::use_awaitable, ec));
    if (!ec && !parser.is_done()) {
      // curl sends `Expect: 100-continue` before bodies over 1 KiB and waits a second for it.
      if (beast::iequals(parser.get()[http::field::expect], "100-continue")) {
        http::response<http::empty_body> go_on{http::status::continue_, parser.get().version()};
        co_await http::async_write(stream, go_on, net::redirect_error(net::use_awaitable, ec));
      }
      if (!ec) co_await http::async_read(stream, buffer, parser, net::redirect_error(net::use_awaitable, ec));
    }
    if (ec == http::error::end_of_stream || ec == net::error::eof || ec == beast::error::timeout ||
        ec == net::error::connection_reset || ec == net::error::operation_aborted) {
      break;
    }
    if (ec == http::error::body_limit) {
      // Named locals, not temporaries, in co_await arguments: GCC 12 mishandles the latter.
      const ApiError error{413, "Request body larger than " + std::to_string(limits.max_body_bytes) + " bytes.",
                           "invalid_request_error", {}, "request_too_large", 0};
      const std::string route = "(body too large)";
      co_await reply_and_close(stream, frontend, error, limits, route, parser.get().method() == http::verb::head);
      break;
    }
    if (ec == http::error::header_limit) {
      const ApiError error{431, "Request headers larger than " + std::to_string(limits.max_header_bytes) + " bytes.",
                           "invalid_request_error", {}, "headers_too_large", 0};
      const std::string route = "(headers too large)";
      co_await reply_and_close(stream, frontend, error, limits, route, parser.get().method() == http::verb::head);
      break;
    }
    if (ec) {
      // Malformed HTTP (bad method, bad chunk encoding, truncated body then EOF...).
      if (ec != http::error::partial_message) {
        const ApiError error = bad_request("Malformed HTTP request: " + ec.message());
        const std::string route = "(malformed)";
        co_await reply_and_close(stream, frontend, error, limits, route, parser.get().method() == http::verb::head);
      }
      break;
    }

    const auto started = std::chrono::steady_clock::now();
    http::request<http::string_body> request = parser.release();
    HttpRequestIn in;
    in.method = std::string(request.method_string());
    if (const std::optional<ApiError> error = check_request_target(request, in.target)) {
      const std::string route = "(bad request target or Host)";
      co_await reply_and_close(stream, frontend, *error, limits, route, request.method() == http::verb::head);
      break;
    }
    in.authorization = std::string(request[http::field::authorization]);
    in.content_type = std::string(request[http::field::content_type]);
    in.body = std::move(request.body());
    in.request_id = new_request_id();

    AccessRecord access{in.request_id, in.method + " " + in.target.substr(0, 128), 0, 0, 0, -1, 0, {}};
    RouteResult result;
    try {
      result = frontend.handle(in);
    } catch (const std::exception& e) {
      // A bug, not the client's fault: log it with the request id, answer 500, keep serving.
      spdlog::error("{} internal error: {}", in.request_id, e.what());
      result = error_reply(internal_error(in.request_id));
    }
    bool keep_alive = request.keep_alive();
    if (auto* reply = std::get_if<HttpReply>(&result)) {
      auto res = make_response(*reply, request.version(), keep_alive, in.request_id);
      frontend.metrics().record_http_status(reply->status);
      stream.expires_after(limits.request_timeout);
      if (request.method() == http::verb::head) {
        // The header of the GET answer (its Content-Length included) and never a body: the next
        // response on a kept-alive connection must start right after the blank line.
        http::response_serializer<http::string_body> header_only{res};
        co_await http::async_write_header(stream, header_only, net::redirect_error(net::use_awaitable, ec));
      } else {
        co_await http::async_write(stream, res, net::redirect_error(net::use_awaitable, ec));
      }
      access.status = reply->status;
      access.total_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
      if (in.target != "/metrics" && in.target != "/health") log_access(access);
      if (ec) break;
    } else {
      const bool usable = co_await run_job(stream, frontend, std::move(std::get<GenerationJob>(result)), request, in.request_id,
                                           limits, access);
      access.total_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
      frontend.metrics().record_http_status(access.status);
      log_access(access);
      if (!usable) break;
      keep_alive = keep_alive && access.status == 200;
    }
    if (!keep_alive) {
      stream.socket().shutdown(net::ip::tcp::socket::shutdown_send, ec);
      break;
    }
  }
  boost::system::error_code ignored;
  stream.socket().close(ignored);
}

}  // namespace http_detail

namespace net = boost::asio;

struct HttpServer::Impl {
  explicit Impl(int threads) : ioc(threads), acceptor(ioc) {}
  net::io_context ioc;
  net::ip::tcp::acceptor acceptor;
  std::vector<std::thread> threads;
  std::atomic<bool> stopped{false};
};

namespace {

using net::ip::tcp;

net::awaitable<void> accept_loop(tcp::acceptor& acceptor, ApiFrontend& frontend, http_detail::SessionLimits limits) {
  for (;;) {
    boost::system::error_code ec;
    tcp::socket socket = co_await acceptor.async_accept(net::make_strand(acceptor.get_executor()),
                                                        net::redirect_error(net::use_awaitable, ec));
    if (ec == net::error::operation_aborted || !acceptor.is_open()) co_return;
    if (ec) continue;  // e.g. EMFILE: drop this one, keep accepting
    socket.set_option(tcp::no_delay(true), ec);
    auto executor = socket.get_executor();
    net::co_spawn(executor, http_detail::run_session(boost::beast::tcp_stream(std::move(socket)), frontend, limits),
                  [](std::exception_ptr e) {
                    if (!e) return;
                    try {
                      std::rethrow_exception(e);
                    } catch (const std::exception& ex) {
                      spdlog::error("connection ended by an internal error: {}", ex.what());
                    }
                  });
  }
}

}  // namespace

HttpServer::HttpServer(HttpServerOptions options, ApiFrontend& frontend)
    : impl_(std::make_unique<Impl>(options.io_threads)), options_(std::move(options)) {
  frontend_ = &frontend;
}

HttpServer::~HttpServer() { stop(); }

void HttpServer::start() {
  boost::system::error_code ec;
  const auto address = net::ip::make_address(options_.host, ec);
  if (ec) throw std::runtime_error("--host: '" + options_.host + "' is not an IP address");
  const tcp::endpoint endpoint(address, options_.port);
  impl_->acceptor.open(endpoint.protocol());
  impl_->acceptor.set_option(net::socket_base::reuse_address(true));
  impl_->acceptor.bind(endpoint, ec);
  if (ec) throw std::runtime_error("cannot listen on " + options_.host + ":" + std::to_string(options_.port) + ": " + ec.message());
  impl_->acceptor.listen(net::socket_base::max_listen_connections);
  bound_port_ = impl_->acceptor.local_endpoint().port();

  http_detail::SessionLimits limits;
  limits.max_body_bytes = options_.max_body_bytes;
  limits.max_header_bytes = options_.max_header_bytes;
  limits.request_timeout = std::chrono::milliseconds(static_cast<int64_t>(options_.request_timeout_s * 1000));
  net::co_spawn(impl_->ioc, accept_loop(impl_->acceptor, *frontend_, limits), net::detached);
  for (int i = 0; i < std::max(1, options_.io_threads); ++i) impl_->threads.emplace_back([this] { impl_->ioc.run(); });
}

void HttpServer::stop() {
  if (!impl_ || impl_->stopped.exchange(true)) return;
  net::post(impl_->ioc, [this] {
    boost::system::error_code ignored;
    impl_->acceptor.close(ignored);
  });
  impl_->ioc.stop();
  for (auto& t : impl_->threads) t.join();
  impl_->threads.clear();
}

}  // namespace fp8serve
