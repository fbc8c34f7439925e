#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "base/clock.h"

namespace waystone {

struct SimulatorOptions {
  std::string host = "127.0.0.1";
  int port = 0;             // 0: pick a free port
  uint64_t seed = 42;       // for probabilistic faults
  std::string faults_json;  // initial fault knobs (see docs/simulator.md)
  int threads = 64;         // delayed responses hold a thread each
  // What a delay fault and the start-up wait sleep on; outlives the simulator.
  const Clock* clock = SystemClock::Get();
};

// Simulator serves fake enterprise systems on loopback: a CRM, an ERP (orders,
// shipments, cancellation), LINE-style push and email. Each counts the business
// objects it holds so tests can prove "exactly one". Fault knobs (per route: drop
// the response after committing, delay past the client timeout, 503/429 with
// Retry-After, failures) are set at start or through POST /_sim/faults.
// Owns its server threads between Start and Stop. Thread-safe.
class Simulator {
 public:
  static absl::StatusOr<std::unique_ptr<Simulator>> Start(const SimulatorOptions& options);
  ~Simulator();
  Simulator(const Simulator&) = delete;
  Simulator& operator=(const Simulator&) = delete;

  int port() const;
  std::string base_url() const;
  // Replaces the fault knobs; InvalidArgument for a malformed document.
  absl::Status SetFaults(const std::string& faults_json);
  // Returns the counters as JSON text (the body of GET /_sim/stats).
  std::string StatsJson() const;
  void Stop();

 private:
  class Impl;
  explicit Simulator(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace waystone
