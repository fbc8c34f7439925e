#pragma once

// The business invariants `waystone verify` checks after every schedule
// (docs/verify.md): what the simulated target holds against what the instance
// records. Pure: no I/O.

#include <map>
#include <string>
#include <vector>

#include "verify/contract.h"
#include "verify/generic_target.h"

namespace waystone::verify {

// How the instance ended, as the worker process reported it.
struct RunResult {
  bool reported = false;  // false: no worker came back with a result
  std::string problem;    // why not, or the worker's error
  std::string state;      // "completed", "needs_attention", ...
  std::string reason;
  struct Step {
    std::string name;
    std::string state;
    std::string external_id;
  };
  std::vector<Step> steps;
  std::vector<std::string> open_alerts;  // "kind:step": the typed reasons an operator has
  // What the definition's own lookups found at the end (a sandbox's effects are
  // seen only this way): step -> the external ids of the candidates.
  std::map<std::string, std::vector<std::string>> looked_up;
};

// Returns one line per invariant the run broke; empty when it held them all.
// `clean`: nothing was injected (no fault, no kill), so the instance must complete:
// when it does not, verify's target does not answer as the definition expects and
// every other row would prove nothing.
std::vector<std::string> Judge(const Contract& contract, const Observed& observed,
                               const RunResult& result, bool clean);

}  // namespace waystone::verify
