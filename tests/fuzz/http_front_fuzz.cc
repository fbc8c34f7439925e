// libFuzzer target: the bytes a client sends on one connection, through Beast's
// request parser (the server library), our front's limits, the API's screen and
// its handlers, on a real SQLite store and engine (no workers run). "@TOKEN@" in
// the input becomes a valid operator token, so inputs reach the routes behind it.
// Every answer must be a whole HTTP response; nothing may crash.

#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>

#include "base/clock.h"
#include "base/random.h"
#include "connectors/http/http_client.h"
#include "definition/loader.h"
#include "engine/engine.h"
#include "server/api_server.h"
#include "server/auth.h"
#include "store/store.h"

namespace {

constexpr char kWorkflow[] = R"(
workflow: fuzz-order
key: "{{input.ref}}"
steps:
  - name: create
    recovery: manual
    request: { method: POST, url: "http://127.0.0.1:9/orders", body: { ref: "{{input.ref}}" } }
)";

struct World {
  std::unique_ptr<waystone::Store> store;
  std::unique_ptr<waystone::HttpClient> http;
  waystone::SeededRandom random{1};
  std::unique_ptr<waystone::Engine> engine;
  std::unique_ptr<waystone::ApiServer> server;
  std::string token;
};

World* Make() {
  auto* world = new World();
  // On tmpfs when there is one: commits are the cost of an input, not what is fuzzed.
  const std::string base = std::filesystem::is_directory("/dev/shm") ? "/dev/shm" : "/tmp";
  const std::string dir = base + "/waystone-http-fuzz-" + std::to_string(getpid());
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  auto store = waystone::OpenStore({dir + "/w.db"});
  if (!store.ok()) std::abort();
  world->store = std::move(*store);
  world->http = waystone::NewCurlHttpClient({});
  waystone::EngineOptions options;
  options.workers = 1;
  auto engine = waystone::Engine::Create(world->store.get(), world->http.get(),
                                         waystone::SystemClock::Get(), &world->random, options);
  if (!engine.ok()) std::abort();
  world->engine = std::move(*engine);
  auto definition = waystone::LoadDefinitionText(kWorkflow, "fuzz.yaml");
  if (!definition.ok() || !world->engine->Register(*definition).ok()) std::abort();
  waystone::ApiServerOptions api;
  api.listen = "127.0.0.1:0";
  api.max_body_bytes = 4096;
  api.events = {{"com.example.order", "fuzz-order", "", 0}, {"com.example.ok", "", "/ref", 0}};
  auto server = waystone::ApiServer::Start(api, world->store.get(), waystone::SystemClock::Get(),
                                           world->engine.get());
  if (!server.ok()) std::abort();
  world->server = std::move(*server);
  auto token =
      waystone::CreateToken(*world->store, "fuzz", "default", waystone::Role::kOperator, 1);
  if (!token.ok()) std::abort();
  world->token = *token;
  return world;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static World* world = Make();
  std::string raw(reinterpret_cast<const char*>(data), size);
  for (size_t at = raw.find("@TOKEN@"); at != std::string::npos; at = raw.find("@TOKEN@", at)) {
    raw.replace(at, 7, world->token);
  }
  const std::string answer = world->server->ServeBytesForTest(raw);
  // Whatever was sent, what comes back is HTTP responses, or nothing (a client
  // that never finished its request).
  if (!answer.empty() && !answer.starts_with("HTTP/1.")) std::abort();
  return 0;
}
