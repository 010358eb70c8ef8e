// Runs one GenerationJob on its connection: the engine thread posts RequestOutputs into a
// Channel; the connection's coroutine wakes on its strand, turns them into SSE events or the
// final JSON, and aborts the job when the client goes away (a write fails, or the socket reads
// EOF while we wait — the client dropped mid-prefill).
#include "server/http/asio_coroutines.hpp"  // first of the Asio includes

#include <spdlog/spdlog.h>

#include <boost/asio/post.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/beast/http.hpp>

#include <sys/socket.h>

#include <cerrno>
#include <deque>
#include <mutex>

#include "server/http/session.hpp"

namespace fp8serve::http_detail {

namespace {

using Clock = std::chrono::steady_clock;

struct Channel {
  explicit Channel(net::any_io_executor executor) : wake(executor) {}
  std::mutex mutex;
  std::deque<std::pair<int, RequestOutput>> queue;  // (prompt index, output)
  net::steady_timer wake;                            // cancelled to wake the coroutine
  bool peer_gone = false;                            // set on the strand only
  bool watching = false;                             // a read-readiness wait is pending
  bool done = false;                                 // the job ended; late wake-ups are ignored
};

void wake_up(const std::shared_ptr<Channel>& channel) {
  net::post(channel->wake.get_executor(), [channel] { channel->wake.cancel(); });
}

// Waits for the socket to become readable: with a request outstanding, that is EOF or a reset
// (the client went away) unless the client pipelines its next request. A non-destructive peek
// tells these apart and re-arms on a spurious wake-up.
void watch_peer(net::ip::tcp::socket& socket, const std::shared_ptr<Channel>& channel) {
  if (channel->watching || channel->peer_gone) return;
  channel->watching = true;
  socket.async_wait(net::socket_base::wait_read, [channel, &socket](boost::system::error_code ec) {
    channel->watching = false;
    if (ec == net::error::operation_aborted || channel->done) return;
    char byte = 0;
    const ssize_t n = ec ? -1 : ::recv(socket.native_handle(), &byte, 1, MSG_PEEK | MSG_DONTWAIT);
    if (n > 0) return;  // the next request, pipelined: leave it for the session
    if (n < 0 && !ec && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
      watch_peer(socket, channel);
      return;
    }
    channel->peer_gone = true;  // EOF (n == 0) or a socket error
    channel->wake.cancel();
  });
}

// Writes each event as one HTTP chunk; stops at the first error (left in `ec`).
net::awaitable<void> write_events(beast::tcp_stream& stream, std::vector<std::string> events, SessionLimits limits,
                                  boost::system::error_code& ec) {
  for (const std::string& e : events) {
    if (ec) co_return;
    stream.expires_after(limits.request_timeout);
    auto chunk = http::make_chunk(net::buffer(e));
    co_await net::async_write(stream, chunk, net::redirect_error(net::use_awaitable, ec));
  }
}

void abort_all(ApiFrontend& frontend, const GenerationJob& job) {
  if (EngineClient* engine = frontend.engine())
    for (const auto& r : job.requests) engine->abort(r.request_id);
}

}  // namespace

net::awaitable<bool> run_job(beast::tcp_stream& stream, ApiFrontend& frontend, GenerationJob job,
                             const http::request<http::string_body>& request, const std::string& request_id,
                             SessionLimits limits, AccessRecord& access) {
  const auto started = Clock::now();
  auto executor = co_await net::this_coro::executor;
  auto channel = std::make_shared<Channel>(executor);
  JobOutput& builder = *job.builder;
  const bool streaming = builder.meta().stream;
  EngineClient* engine = frontend.engine();

  for (size_t p = 0; p < job.requests.size(); ++p) {
    const int prompt_index = static_cast<int>(p);
    job.requests[p].arrival = started;
    engine->submit(job.requests[p], [channel, prompt_index](RequestOutput&& out) {
      {
        std::lock_guard lock(channel->mutex);
        channel->queue.emplace_back(prompt_index, std::move(out));
      }
      wake_up(channel);
    });
  }

  boost::system::error_code ec;
  bool usable = true;
  // Streaming: headers now, then one HTTP chunk per SSE event.
  http::response<http::empty_body> head{http::status::ok, request.version()};
  http::response_serializer<http::empty_body> serializer{head};
  if (streaming) {
    head.set(http::field::server, "fp8serve");
    head.set(http::field::content_type, "text/event-stream");
    head.set(http::field::cache_control, "no-cache");
    head.set("X-Request-Id", request_id);
    head.keep_alive(request.keep_alive());
    head.chunked(true);
    stream.expires_after(limits.request_timeout);
    co_await http::async_write_header(stream, serializer, net::redirect_error(net::use_awaitable, ec));
    std::vector<std::string> head_events = builder.stream_head();
    co_await write_events(stream, std::move(head_events), limits, ec);
  }

  double ttft = -1;
  double queue = -1;  // the longest wait of the job's prompts before their first step
  auto last_output = Clock::now();
  while (!builder.done() && !ec) {
    std::deque<std::pair<int, RequestOutput>> batch;
    {
      std::lock_guard lock(channel->mutex);
      batch.swap(channel->queue);
    }
    if (batch.empty()) {
      if (channel->peer_gone) break;
      watch_peer(stream.socket(), channel);
      channel->wake.expires_at(Clock::time_point::max());
      boost::system::error_code wait_ec;
      stream.expires_never();  // a long generation is not a slow client
      co_await channel->wake.async_wait(net::redirect_error(net::use_awaitable, wait_ec));
      continue;
    }
    for (auto& [prompt_index, out] : batch) {
      const auto now = Clock::now();
      queue = std::max(queue, out.queue_s);
      if (!out.new_tokens.empty()) {
        if (ttft < 0) ttft = std::chrono::duration<double>(now - started).count();
        else frontend.metrics().record_inter_token(std::chrono::duration<double>(now - last_output).count());
        last_output = now;
      }
      auto events = builder.on_output(prompt_index, out);
      if (streaming) co_await write_events(stream, std::move(events), limits, ec);
    }
  }
  channel->done = true;
  if (channel->watching) {
    boost::system::error_code ignored;  // not `ec`: that holds the last write's outcome
    stream.socket().cancel(ignored);
  }

  const bool client_gone = channel->peer_gone || (streaming && ec);
  if (client_gone || ec) {
    abort_all(frontend, job);
    usable = false;
    access.status = 499;  // nginx's "client closed request"
    spdlog::debug("{} client gone: {}", request_id, channel->peer_gone ? "peer closed the connection" : ec.message());
  } else if (streaming) {
    if (builder.engine_error()) {
      spdlog::error("{} engine error: {}", request_id, *builder.engine_error());
      std::vector<std::string> events = builder.stream_error(request_id);
      co_await write_events(stream, std::move(events), limits, ec);
    } else {
      std::vector<std::string> tail_events = builder.stream_tail();
      co_await write_events(stream, std::move(tail_events), limits, ec);
    }
    if (!ec) {
      auto last = http::make_chunk_last();
      co_await net::async_write(stream, last, net::redirect_error(net::use_awaitable, ec));
    }
    access.status = builder.engine_error() ? 500 : 200;
    usable = !ec;
  } else {
    HttpReply reply;
    if (builder.engine_error()) {
      spdlog::error("{} engine error: {}", request_id, *builder.engine_error());
      reply = error_reply(internal_error(request_id));
    } else {
      reply.body = dump_json(builder.final_body());
    }
    http::response<http::string_body> res{static_cast<http::status>(reply.status), request.version()};
    res.set(http::field::server, "fp8serve");
    res.set(http::field::content_type, reply.content_type);
    res.set("X-Request-Id", request_id);
    res.keep_alive(request.keep_alive());
    res.body() = std::move(reply.body);
    res.prepare_payload();
    stream.expires_after(limits.request_timeout);
    co_await http::async_write(stream, res, net::redirect_error(net::use_awaitable, ec));
    access.status = reply.status;
    usable = !ec;
  }
  frontend.release(job.num_seqs);
  builder.finished(client_gone);

  const Usage usage = builder.usage();
  access.prompt_tokens = usage.prompt_tokens;
  access.completion_tokens = usage.completion_tokens;
  access.ttft_s = ttft;
  ServerMetrics::RequestRecord record;
  record.finish_reason = client_gone ? "abort" : builder.summary_finish();
  access.finish = record.finish_reason;
  record.prompt_tokens = usage.prompt_tokens;
  record.completion_tokens = usage.completion_tokens;
  record.ttft_s = ttft;
  record.queue_s = queue;
  record.e2e_s = std::chrono::duration<double>(Clock::now() - started).count();
  frontend.metrics().record_request(record);
  co_return usable;
}

}  // namespace fp8serve::http_detail
