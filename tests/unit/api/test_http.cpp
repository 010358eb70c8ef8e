// The Beast server over real sockets on 127.0.0.1 with the scripted engine: keep-alive,
// X-Request-Id, chunked SSE ending in [DONE], the 413 / 431 / 400 limits, a dropped client
// aborting its request, and a slowloris client cut off by the request deadline.
#include <catch2/catch.hpp>

#include <boost/asio/connect.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/write.hpp>

#include <chrono>
#include <fstream>
#include <sstream>
#include <thread>

#include "fake_engine.hpp"
#include "server/http/http_server.hpp"

using namespace fp8serve;
using Json = nlohmann::ordered_json;
namespace net = boost::asio;
using tcp = net::ip::tcp;

namespace {

struct Server {
  explicit Server(double request_timeout_s = 5.0) : frontend(FrontendOptions{}, metrics) {
    tokenizer = load_tokenizer_dir(FP8SERVE_FIXTURES_DIR "/models/tiny-qwen3");
    ModelContext m;
    m.served_model_name = "tiny";
    m.max_model_len = 64;
    m.max_num_seqs = 4;
    m.tokenizer = tokenizer.get();
    m.engine = &engine;
    frontend.set_ready(std::move(m));
    HttpServerOptions o;
    o.port = 0;
    o.max_body_bytes = 4096;
    o.max_header_bytes = 2048;
    o.request_timeout_s = request_timeout_s;
    server = std::make_unique<HttpServer>(o, frontend);
    server->start();
  }
  ~Server() { server->stop(); }

  ServerMetrics metrics;
  std::unique_ptr<Tokenizer> tokenizer;
  ApiFrontend frontend;
  std::unique_ptr<HttpServer> server;
  // Declared last, so destroyed first, as serve.cpp does: an engine holds each request's output
  // sink until the request ends, and a sink can hold the last reference to its connection's
  // Channel, whose wake-up timer must go before the io_context does. (Destroyed after the
  // server, an aborted request's sink outlived the io_context: UBSan, 'invalid vptr'.)
  test::FakeEngine engine;
};

// A raw client: writes bytes, reads until the peer closes or `until` appears.
struct Client {
  explicit Client(uint16_t port) : socket(ioc) { socket.connect(tcp::endpoint(net::ip::make_address("127.0.0.1"), port)); }
  void send(const std::string& bytes) { net::write(socket, net::buffer(bytes)); }
  std::string read_until(const std::string& until) {
    while (received.find(until) == std::string::npos) {
      char buf[4096];
      boost::system::error_code ec;
      size_t n = socket.read_some(net::buffer(buf), ec);
      if (ec) break;
      received.append(buf, n);
    }
    return received;
  }
  bool closed_by_peer() {
    char buf[256];
    boost::system::error_code ec;
    while (!ec) socket.read_some(net::buffer(buf), ec);
    return ec == net::error::eof || ec == net::error::connection_reset;
  }
  net::io_context ioc;
  tcp::socket socket;
  std::string received;
};

std::string post(const std::string& target, const std::string& body, const std::string& extra = "") {
  return "POST " + target + " HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n" + extra +
         "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
}

}  // namespace

TEST_CASE("http: two requests on one keep-alive connection; X-Request-Id; JSON body") {
  Server s;
  Client c(s.server->port());
  c.send("GET /health HTTP/1.1\r\nHost: x\r\n\r\n");
  std::string r = c.read_until("{}");
  CHECK(r.rfind("HTTP/1.1 200 OK\r\n", 0) == 0);
  CHECK(r.find("X-Request-Id: ") != std::string::npos);
  c.received.clear();
  c.send(post("/v1/completions", R"({"prompt": [5, 6, 7], "max_tokens": 2})"));
  r = c.read_until("\"total_tokens\":5");
  REQUIRE(r.rfind("HTTP/1.1 200 OK\r\n", 0) == 0);
  const Json body = Json::parse(r.substr(r.find("\r\n\r\n") + 4));
  CHECK(body["choices"][0]["text"] == "<5><6>");
  CHECK(body["choices"][0]["finish_reason"] == "length");
  CHECK(body["usage"]["prompt_tokens"] == 3);
}

TEST_CASE("http: streaming is chunked SSE ending in [DONE]") {
  Server s;
  Client c(s.server->port());
  c.send(post("/v1/chat/completions", R"({"messages": [{"role": "user", "content": "x"}], "stream": true})"));
  // No chat template in this fixture: a 400 error object, not a stream.
  std::string r = c.read_until("}}");
  CHECK(r.rfind("HTTP/1.1 400", 0) == 0);
  Client d(s.server->port());
  d.send(post("/v1/completions", R"({"prompt": [1, 2, 3], "stream": true, "stream_options": {"include_usage": true}})"));
  r = d.read_until("data: [DONE]\n\n\r\n0\r\n\r\n");
  CHECK(r.find("Transfer-Encoding: chunked") != std::string::npos);
  CHECK(r.find("Content-Type: text/event-stream") != std::string::npos);
  int events = 0;
  for (size_t pos = 0; (pos = r.find("data: {", pos)) != std::string::npos; ++pos) ++events;
  CHECK(events == 4);  // three tokens, then the usage chunk
  CHECK(r.find("\"finish_reason\":\"stop\"") != std::string::npos);
  CHECK(r.find("\"choices\":[],\"usage\":{\"prompt_tokens\":3") != std::string::npos);
}

TEST_CASE("http: 413 body over the limit, 431 headers over the limit, 400 malformed") {
  Server s;
  {
    Client c(s.server->port());
    c.send(post("/v1/completions", R"({"prompt": ")" + std::string(5000, 'a') + "\"}"));
    std::string r = c.read_until("}}");
    CHECK(r.rfind("HTTP/1.1 413", 0) == 0);
    CHECK(r.find("request_too_large") != std::string::npos);
    CHECK(c.closed_by_peer());
  }
  {
    Client c(s.server->port());
    c.send("GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + std::string(4000, 'b') + "\r\n\r\n");
    CHECK(c.read_until("}}").rfind("HTTP/1.1 431", 0) == 0);
  }
  {
    Client c(s.server->port());
    c.send("BLAH\r\n\r\n");
    CHECK(c.read_until("}}").rfind("HTTP/1.1 400", 0) == 0);
  }
  {
    // Content-Length larger than what arrives, then the client half-closes: no crash, no reply.
    Client c(s.server->port());
    c.send("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"pro");
    c.socket.shutdown(tcp::socket::shutdown_send);
    CHECK(c.closed_by_peer());
  }
  Client ok(s.server->port());
  ok.send("GET /health HTTP/1.1\r\nHost: x\r\n\r\n");
  CHECK(ok.read_until("{}").rfind("HTTP/1.1 200", 0) == 0);
}

TEST_CASE("http: a client that drops mid-request aborts it and frees its admission") {
  Server s;
  s.engine.hold = true;
  {
    Client c(s.server->port());
    c.send(post("/v1/completions", R"({"prompt": [1, 2], "max_tokens": 4})"));
    for (int i = 0; i < 200 && s.engine.submitted().empty(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    REQUIRE(s.engine.submitted().size() == 1);
  }  // the socket closes here
  const std::string id = s.engine.submitted()[0].request_id;
  CHECK(s.engine.wait_aborted(id, 3000));
  for (int i = 0; i < 200 && s.frontend.in_flight_seqs() != 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  CHECK(s.frontend.in_flight_seqs() == 0);
}

TEST_CASE("http: slowloris headers are cut off at the request deadline") {
  Server s(/*request_timeout_s=*/0.5);
  Client c(s.server->port());
  const auto start = std::chrono::steady_clock::now();
  c.send("GET /health HTTP/1.1\r\n");
  boost::system::error_code ec;
  for (int i = 0; i < 20 && !ec; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    net::write(c.socket, net::buffer(std::string("X-A: b\r\n")), ec);
  }
  CHECK(c.closed_by_peer());
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(3));
}

TEST_CASE("http: HEAD has no body, so a GET on the same keep-alive connection reads cleanly") {
  Server s;
  Client c(s.server->port());
  c.send("HEAD /v1/models HTTP/1.1\r\nHost: x\r\n\r\nGET /health HTTP/1.1\r\nHost: x\r\n\r\n");
  const std::string r = c.read_until("\r\n\r\n{}");
  const size_t second = r.find("HTTP/1.1 200 OK\r\n", 1);
  REQUIRE(r.rfind("HTTP/1.1 200 OK\r\n", 0) == 0);
  REQUIRE(second != std::string::npos);
  // The HEAD answer ends with its blank line; the next status line follows at once.
  CHECK(r.find("\r\n\r\n") + 4 == second);
  CHECK(r.substr(0, second).find("Content-Length: ") != std::string::npos);  // what GET would send
  CHECK(r.substr(0, second).find("Content-Length: 0\r\n") == std::string::npos);
  // HEAD on a POST route: 405 naming POST, no body either.
  Client d(s.server->port());
  d.send("HEAD /v1/completions HTTP/1.1\r\nHost: x\r\n\r\nGET /health HTTP/1.1\r\nHost: x\r\n\r\n");
  const std::string r2 = d.read_until("\r\n\r\n{}");
  REQUIRE(r2.rfind("HTTP/1.1 405", 0) == 0);
  CHECK(r2.find("Allow: POST\r\n") != std::string::npos);
  CHECK(r2.find("\r\n\r\nHTTP/1.1 200 OK\r\n") != std::string::npos);
}

TEST_CASE("http: Host header rules (RFC 9112 3.2) and absolute-form targets (3.2.2)") {
  Server s;
  auto status_of = [&](const std::string& request) {
    Client c(s.server->port());
    c.send(request);
    const std::string r = c.read_until("\r\n\r\n");
    return r.size() > 12 ? std::stoi(r.substr(9, 3)) : 0;
  };
  CHECK(status_of("GET /health HTTP/1.1\r\n\r\n") == 400);                             // no Host
  CHECK(status_of("GET /health HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n") == 400);      // two
  CHECK(status_of("GET /health HTTP/1.0\r\n\r\n") == 200);                             // HTTP/1.0 needs none
  CHECK(status_of("GET http://127.0.0.1:8000/v1/models HTTP/1.1\r\nHost: x\r\n\r\n") == 200);
  CHECK(status_of("GET HTTP://x/v1/models/tiny?a=1 HTTP/1.1\r\nHost: x\r\n\r\n") == 200);
  CHECK(status_of("GET http://x HTTP/1.1\r\nHost: x\r\n\r\n") == 404);  // path "/"
  CHECK(status_of("GET ftp://x/health HTTP/1.1\r\nHost: x\r\n\r\n") == 400);
  Client c(s.server->port());
  c.send("GET /health HTTP/1.1\r\n\r\n");
  CHECK(c.read_until("}}").find("Host header") != std::string::npos);
}

TEST_CASE("http: the listener reuses its address, so a restart while connections sit in TIME_WAIT binds at once") {
  uint16_t port = 0;
  {
    Server s;
    port = s.server->port();
    // The server closes these connections first (Connection: close), so their TIME_WAIT is on
    // the listening port's side.
    for (int i = 0; i < 3; ++i) {
      Client c(port);
      c.send("GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
      CHECK(c.read_until("{}").rfind("HTTP/1.1 200", 0) == 0);
      CHECK(c.closed_by_peer());
    }
  }
  ServerMetrics metrics;
  ApiFrontend frontend(FrontendOptions{}, metrics);
  HttpServerOptions o;
  o.port = port;
  HttpServer again(o, frontend);
  CHECK_NOTHROW(again.start());
  CHECK(again.port() == port);
  again.stop();
}
