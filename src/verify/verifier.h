#pragma once

// `waystone verify`: runs a definition's schedules (verify/schedules.h) in worker
// processes against the generic simulated target, kills and restarts them where a
// schedule says, and judges each run by the business invariants
// (verify/oracles.h). docs/verify.md says how to read its report.

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "model/definition.h"
#include "verify/contract.h"
#include "verify/generic_target.h"
#include "verify/oracles.h"
#include "verify/schedules.h"

namespace waystone::verify {

struct VerifyOptions {
  std::string definition_path;  // handed to the worker processes
  std::string input_json;       // "" = synthesized from the definition
  std::string worker_program;   // the waystone binary the workers run ("verify-worker")
  std::string work_dir;         // a folder of its own per schedule goes here
  int jobs = 16;                // schedules run at once (workers mostly wait)
  uint64_t seed = 1;
  int random_schedules = 0;       // 0: every boundary and outcome; N: N drawn from `seed`
  std::string replay;             // one schedule's spec: run exactly that
  Millis rest_deadline = 60'000;  // per worker process: past it the run is not live
  bool keep = false;              // keep the schedules' folders (databases, worker logs)
  // env name -> a team's sandbox base URL: that system's requests go there through
  // verify's fault-injecting proxy; each schedule's business key gets a suffix of
  // its own, and the definition's lookups report what the sandbox holds.
  std::map<std::string, std::string> against;
  std::string contract_file;  // named in replay lines
};

struct Row {
  int id = 0;
  Schedule schedule;
  RunResult result;
  Observed observed;
  std::vector<std::string> broken;
  int kills = 0;          // worker processes killed on the way
  int takeovers = 0;      // workers that took over from a frozen one
  std::string unreached;  // why the schedule did not test what it claims ("" = it did)
  std::string note;       // what else happened that a reader should know
  double seconds = 0;
};

struct Report {
  std::string workflow;
  std::vector<std::string> inferred;   // the contract, one line per route
  std::vector<std::string> uncovered;  // what no schedule reached
  std::vector<std::string> covered;    // branches some schedule reached
  std::vector<Row> rows;
  int unreached = 0;  // rows whose kill or fault never came
  double seconds = 0;

  int failures() const;
};

// Runs the schedules. An error only when verify itself cannot run (the target
// cannot listen, the folder cannot be made); a broken invariant is a failing row.
absl::StatusOr<Report> RunVerify(const WorkflowDefinition& definition, const Contract& contract,
                                 const VerifyOptions& options);

// The report as text: the matrix (step × request × injected → pass / FAIL), the
// failures with their replay lines, coverage, and a summary line.
std::string FormatReport(const Report& report, const VerifyOptions& options);
// The report as one JSON document.
std::string ReportJson(const Report& report, const VerifyOptions& options);

}  // namespace waystone::verify
