#pragma once

// What a command that runs instances holds (run_commands.cc opens it; the verify
// worker uses it too). For the cli's .cc files only: it includes the engine.

#include <memory>

#include "absl/status/statusor.h"
#include "base/clock.h"
#include "base/random.h"
#include "cli/commands.h"
#include "connectors/http/http_client.h"
#include "engine/engine.h"
#include "store/store.h"

namespace waystone::cli {

// Everything a command that runs instances needs, owned together.
struct Runtime {
  std::unique_ptr<Store> store;
  std::unique_ptr<HttpClient> http;
  SeededRandom random;
  std::unique_ptr<Engine> engine;
};

// Opens the database (waiting up to `patience` for it), the HTTP client and an
// engine of `workers` threads, with the tenants and secrets of the config in force.
absl::StatusOr<std::unique_ptr<Runtime>> OpenRuntime(const GlobalOptions& global, int workers,
                                                     Millis patience, int max_in_flight = 10'000);

// The error for a start that acted on nothing because its event id was used
// before with other data.
absl::Status EventConflict(const StartRequest& request, const StartResult& started);

}  // namespace waystone::cli
