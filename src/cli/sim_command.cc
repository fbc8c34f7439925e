#include <cstdio>

#include "base/clock.h"
#include "cli/common.h"
#include "cli/signals.h"
#include "sim/simulator.h"

namespace waystone::cli {

int Sim(const SimOptions& options) {
  std::stop_token stop = StopOnSignals();
  SimulatorOptions sim;
  sim.host = options.host;
  sim.port = options.port;
  sim.seed = options.seed;
  if (!options.faults.empty()) {
    auto faults = TextOrFile(options.faults, 1 << 20);
    if (!faults.ok()) return Fail(faults.status());
    sim.faults_json = *faults;
  }
  auto simulator = Simulator::Start(sim);
  if (!simulator.ok()) return Fail(simulator.status());
  std::printf("waystone sim listening on http://%s:%d\n", options.host.c_str(),
              (*simulator)->port());
  std::fflush(stdout);
  while (!stop.stop_requested()) SystemClock::Get()->SleepFor(1000, stop);
  (*simulator)->Stop();
  return kExitOk;
}

}  // namespace waystone::cli
