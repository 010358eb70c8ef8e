#include "server/serve.hpp"

#include <spdlog/spdlog.h>

#include <pthread.h>
#include <signal.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "model/loader.hpp"
#include "server/api/frontend.hpp"
#include "server/api/request_features.hpp"
#include "server/async_engine.hpp"
#include "server/engine/engine.hpp"
#include "server/grammar/token_vocab.hpp"
#include "server/http/http_server.hpp"
#include "server/kv_events.hpp"
#include "server/metrics.hpp"

namespace fp8serve {

namespace {

// SIGTERM / SIGINT are blocked in every thread and received by one waiter thread, so no
// handler runs at an arbitrary point of the engine or of an I/O thread.
class ShutdownSignal {
 public:
  ShutdownSignal() {
    sigemptyset(&set_);
    sigaddset(&set_, SIGTERM);
    sigaddset(&set_, SIGINT);
    pthread_sigmask(SIG_BLOCK, &set_, nullptr);  // before any thread starts: they inherit it
    signal(SIGPIPE, SIG_IGN);
    waiter_ = std::thread([this] {
      int sig = 0;
      sigwait(&set_, &sig);
      std::lock_guard lock(mutex_);
      received_ = sig;
      cv_.notify_all();
    });
  }
  ~ShutdownSignal() {
    if (received_ == 0) pthread_kill(waiter_.native_handle(), SIGTERM);  // wake the waiter
    waiter_.join();
  }
  int wait() {
    std::unique_lock lock(mutex_);
    cv_.wait(lock, [&] { return received_ != 0; });
    return received_;
  }
  bool received() {
    std::lock_guard lock(mutex_);
    return received_ != 0;
  }

 private:
  sigset_t set_;
  std::thread waiter_;
  std::mutex mutex_;
  std::condition_variable cv_;
  int received_ = 0;
};

std::string read_text_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw ConfigError("--chat-template: cannot open '" + path + "'");
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

nlohmann::ordered_json special_token_extras(const Tokenizer& tokenizer) {
  nlohmann::ordered_json extras = nlohmann::ordered_json::object();
  auto piece = [&](std::optional<int32_t> id) -> nlohmann::ordered_json {
    if (!id) return nullptr;
    auto p = tokenizer.id_to_piece(*id);
    return p ? nlohmann::ordered_json(*p) : nlohmann::ordered_json(nullptr);
  };
  extras["bos_token"] = piece(tokenizer.bos_id());
  extras["eos_token"] = piece(tokenizer.eos_id());
  return extras;
}

}  // namespace

int run_serve(const Config& config) {
  ShutdownSignal shutdown;
  for (const auto& name : config.environment_variables) spdlog::info("flag set by the environment: {}", name);
  ServerMetrics metrics;
  FrontendOptions fopts;
  fopts.api_key = config.api_key;
  fopts.metrics_public = config.metrics_public;
  fopts.max_waiting_requests = config.max_waiting_requests;
  fopts.responses_store = {static_cast<size_t>(config.responses_store_max_entries),
                           static_cast<size_t>(config.responses_store_max_bytes), config.responses_store_ttl};
  for (const std::string& name : config.ignore_request_fields) {
    if (const std::string why = why_not_ignorable(name); !why.empty()) throw std::invalid_argument("--ignore-request-fields: " + why);
  }
  fopts.limits.ignored_fields = config.ignore_request_fields;
  if (!config.ignore_request_fields.empty()) {
    std::string names;
    for (const auto& n : config.ignore_request_fields) {
      if (!names.empty()) names += ", ";
      names += n;
    }
    spdlog::info("request fields accepted and ignored (--ignore-request-fields): {}", names);
  }
  ApiFrontend frontend(fopts, metrics);
  // Bound before the model loads, so that a taken port fails the start at once.
  std::unique_ptr<KvEventPublisher> kv_events;
  if (config.kv_events.enable_kv_cache_events) {
    kv_events = std::make_unique<KvEventPublisher>(config.kv_events, config.block_size);
    spdlog::info("KV-cache events: {} (topic '{}'{})",
                 config.kv_events.publisher == "zmq" ? "published on " + config.kv_events.endpoint : std::string("recorded, published nowhere"),
                 config.kv_events.topic,
                 config.kv_events.replay_endpoint.empty() ? std::string() : ", replays on " + config.kv_events.replay_endpoint);
  }

  HttpServerOptions hopts;
  hopts.host = config.host;
  hopts.port = static_cast<uint16_t>(config.port);
  hopts.max_body_bytes = static_cast<uint64_t>(config.max_body_bytes);
  hopts.max_header_bytes = static_cast<uint32_t>(config.max_header_bytes);
  hopts.request_timeout_s = config.request_timeout;
  HttpServer server(hopts, frontend);
  server.start();
  spdlog::info("listening on http://{}:{} (loading the model; /health answers 503 until ready)", config.host, server.port());

  const EngineOptions eopts = engine_options_from_config(config);
  LoadedModel model = load_model(config.model);
  std::string template_source = config.chat_template_file.empty() ? model.chat_template : read_text_file(config.chat_template_file);
  std::unique_ptr<ChatTemplate> chat_template;
  if (!template_source.empty()) {
    try {
      chat_template = std::make_unique<ChatTemplate>(ChatTemplate::parse(template_source));
    } catch (const TemplateError& e) {
      if (!config.chat_template_file.empty()) throw ConfigError(std::string("--chat-template: ") + e.what());
      spdlog::warn("the model's chat template does not parse ({}); /v1/chat/completions will answer 400", e.what());
    }
  } else {
    spdlog::warn("the model ships no chat template; /v1/chat/completions will answer 400 (see --chat-template)");
  }
  // As vLLM: the API's model name is what the user passed (a .gguf file's stem, a folder's
  // name), not the free-text general.name inside a GGUF, unless --served-model-name says so.
  std::string name = config.served_model_name;
  if (name.empty()) {
    const std::filesystem::path path = std::filesystem::path(config.model).lexically_normal();
    name = model.format == "gguf" ? path.stem().string()
                                  : (path.filename().empty() ? path.parent_path() : path).filename().string();
  }

  // Declared after `server`, so destroyed before it: the engine holds each request's output
  // sink until the request ends, and a sink can hold the last reference to a connection's
  // Channel (job_runner.cpp), whose timer must be destroyed while the io_context exists.
  AsyncEngine engine(std::make_unique<Engine>(std::move(model), eopts));
  if (kv_events) engine.set_kv_event_publisher(kv_events.get());
  engine.start();
  const Engine& core = engine.engine();

  // Structured outputs: the vocabulary's byte trie once, and a cache of compiled schemas.
  const auto vocab_start = std::chrono::steady_clock::now();
  StructuredOutputs structured(
      grammar::TokenVocabulary::from_tokenizer(core.tokenizer(), core.model_config().vocab_size, core.stop_token_ids()));
  const ToolTemplateSupport tool_support = tool_template_support(template_source, parse_tool_call_format(config.tool_call_parser));
  spdlog::info("structured outputs: vocabulary of {} tokens ready in {:.0f} ms; tool calls {} ({})", structured.vocab().num_usable(),
               std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - vocab_start).count(),
               tool_call_format_name(tool_support.format),
               tool_support.renders_tools ? "the chat template renders tools" : "tools described in a system message");

  ModelContext ctx;
  ctx.served_model_name = name;
  ctx.max_model_len = core.options().max_model_len;
  ctx.max_num_seqs = core.options().max_num_seqs;
  ctx.priority_scheduling = core.options().priority_scheduling;
  if (const BlockManager& blocks = core.block_manager(); blocks.window().enabled() && blocks.num_tail_rings() < ctx.max_num_seqs) {
    ctx.max_num_seqs = blocks.num_tail_rings();  // a sequence runs only with a ring
    ctx.max_num_seqs_source = "the bf16 window's rings: raise --kv-bf16-window-share or --kv-cache-memory";
  }
  ctx.vocab_size = core.model_config().vocab_size;
  ctx.max_pool_tokens = static_cast<int64_t>(core.block_manager().num_blocks()) * core.block_manager().block_size();
  ctx.tokenizer = &core.tokenizer();
  ctx.chat_template = chat_template.get();
  ctx.template_extras = special_token_extras(core.tokenizer());
  ctx.engine = &engine;
  ctx.structured = &structured;
  ctx.tool_support = tool_support;
  frontend.set_ready(std::move(ctx));
  spdlog::info("ready: model '{}' served at http://{}:{}/v1 (max model len {}, api key {})", name, config.host, server.port(),
               core.options().max_model_len, config.api_key.empty() ? "off" : "on");

  const int sig = shutdown.wait();
  spdlog::info("{} received: draining (new requests get 503; up to {} s for running ones)", sig == SIGINT ? "SIGINT" : "SIGTERM",
               config.shutdown_timeout);
  frontend.set_draining();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(config.shutdown_timeout);
  while (frontend.in_flight_seqs() > 0 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  if (frontend.in_flight_seqs() > 0)
    spdlog::warn("shutdown timeout: aborting {} unfinished sequences", frontend.in_flight_seqs());
  server.stop();
  engine.stop();
  spdlog::info("stopped");
  return 0;
}

}  // namespace fp8serve
