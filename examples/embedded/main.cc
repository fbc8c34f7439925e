// order-example DATABASE DEFINITION.yaml KEY INPUT_JSON
//
// Opens Waystone on DATABASE (a SQLite file or a postgresql:// URI), registers the
// workflow in DEFINITION.yaml, starts it for KEY with INPUT_JSON (or finds the
// instance already started for KEY), waits up to 30 s and prints each step's
// state and external id. Exit 0 when the instance completed.

#include <cstdio>
#include <fstream>
#include <sstream>

#include <waystone/waystone.h>

namespace api = waystone::api;

int main(int argc, char** argv) {
  if (argc != 5) {
    std::fprintf(stderr, "usage: %s DATABASE DEFINITION.yaml KEY INPUT_JSON\n", argv[0]);
    return 2;
  }
  api::EngineOptions options;
  options.database = argv[1];
  options.workers = 2;
  auto engine = api::Engine::Open(options);
  if (!engine.ok()) {
    std::fprintf(stderr, "%s\n", engine.status().ToString().c_str());
    return 1;
  }
  if (api::Status registered = (*engine)->RegisterFile(argv[2]); !registered.ok()) {
    std::fprintf(stderr, "%s\n", registered.ToString().c_str());
    return 1;
  }
  // The workflow's name is the definition's `workflow:`; read it the simple way.
  std::ifstream file(argv[2]);
  std::string line, workflow;
  while (std::getline(file, line)) {
    if (line.rfind("workflow:", 0) == 0) {
      std::istringstream(line.substr(9)) >> workflow;
      break;
    }
  }
  auto order = (*engine)->Start(workflow, argv[3], argv[4]);
  if (!order.ok()) {
    std::fprintf(stderr, "%s\n", order.status().ToString().c_str());
    return 1;
  }
  auto outcome = (*order)->Wait(std::chrono::seconds(30));
  if (!outcome.ok()) {
    std::fprintf(stderr, "%s\n", outcome.status().ToString().c_str());
    return 1;
  }
  const std::string reason = outcome->reason.empty() ? "" : " (" + outcome->reason + ")";
  std::printf("waystone %s: %s %s %s%s\n", api::Version(), (*order)->key().c_str(),
              (*order)->created() ? "started" : "found", api::ToString(outcome->state),
              reason.c_str());
  for (const api::StepOutcome& step : outcome->steps) {
    std::printf("  %-20s %-12s %s\n", step.name.c_str(), step.state.c_str(),
                step.external_id.c_str());
  }
  return outcome->state == api::InstanceState::kCompleted ? 0 : 1;
}
