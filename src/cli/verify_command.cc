#include <unistd.h>

#include <cstdio>
#include <filesystem>

#include "cli/commands.h"
#include "cli/common.h"
#include "definition/loader.h"
#include "engine/engine.h"
#include "verify/verifier.h"

namespace waystone::cli {

int Verify(const VerifyCommandOptions& flags) {
  // Lint first: verify runs only what lint accepts.
  std::string text;
  if (auto read = ReadFileText(flags.definition, kMaxDefinitionBytes, &text); !read.ok()) {
    return Fail(read);
  }
  WorkflowDefinition definition;
  int problems = 0;
  for (const Diagnostic& d : LintDefinitionText(text, flags.definition, &definition)) {
    std::fprintf(stderr, "%s\n", d.ToString().c_str());
    problems += d.severity == Severity::kError ? 1 : 0;
  }
  if (problems > 0) {
    std::fprintf(stderr, "verify: lint found %d problem(s); nothing was run\n", problems);
    return kExitError;
  }
  auto contract = verify::InferContract(definition);
  if (!contract.ok()) return Fail(contract.status());

  verify::VerifyOptions options;
  if (!flags.contract.empty()) {
    options.contract_file = std::filesystem::absolute(flags.contract).string();
    if (auto applied = verify::ApplyContractFile(flags.contract, &*contract); !applied.ok()) {
      return Fail(applied);
    }
  }
  options.definition_path = std::filesystem::absolute(flags.definition).string();
  if (!flags.input.empty()) {
    auto input = TextOrFile(flags.input, kMaxInputBytes);
    if (!input.ok()) return Fail(input.status());
    options.input_json = *input;
  }
  options.worker_program = std::filesystem::read_symlink("/proc/self/exe").string();
  options.jobs = flags.jobs;
  options.seed = flags.seed;
  options.random_schedules = flags.schedules;
  options.replay = flags.replay;
  options.keep = flags.keep;
  for (const std::string& pair : flags.against) {
    const size_t eq = pair.find('=');
    if (eq == std::string::npos || eq == 0 ||
        !(pair.compare(eq + 1, 7, "http://") == 0 || pair.compare(eq + 1, 8, "https://") == 0)) {
      return Fail(
          absl::InvalidArgumentError("--against '" + pair +
                                     "': expected NAME=http://host:port (an env name of the "
                                     "definition and its sandbox's base URL)"));
    }
    std::string url = pair.substr(eq + 1);
    while (url.ends_with("/")) url.pop_back();
    options.against[pair.substr(0, eq)] = url;
  }
  bool made_dir = false;
  if (flags.work_dir.empty()) {
    std::string pattern =
        (std::filesystem::temp_directory_path() / "waystone-verify-XXXXXX").string();
    if (::mkdtemp(pattern.data()) == nullptr) {
      return Fail(absl::FailedPreconditionError("cannot make a temporary folder for verify"));
    }
    options.work_dir = pattern;
    made_dir = true;
  } else {
    options.work_dir = flags.work_dir;
  }
  auto report = verify::RunVerify(definition, *contract, options);
  if (!report.ok()) return Fail(report.status());
  const std::string printed =
      flags.json ? verify::ReportJson(*report, options) : verify::FormatReport(*report, options);
  std::fwrite(printed.data(), 1, printed.size(), stdout);
  std::fflush(stdout);
  if (report->failures() > 0 && !flags.json) {
    std::fprintf(stderr, "verify: the folders of the failed schedules are kept in %s\n",
                 options.work_dir.c_str());
  } else if (made_dir && !flags.keep) {
    std::error_code ignored;
    std::filesystem::remove_all(options.work_dir, ignored);
  }
  if (report->failures() > 0) return kExitError;
  // Green must mean something: every boundary and outcome asked for was reached
  // (random draws and a replay say what they missed without failing on it).
  const bool exhaustive = flags.schedules == 0 && flags.replay.empty();
  if (exhaustive && !report->uncovered.empty() && !flags.allow_uncovered) {
    std::fprintf(stderr, "verify: %zu not covered (listed above); --allow-uncovered accepts that\n",
                 report->uncovered.size());
    return kExitError;
  }
  return kExitOk;
}

}  // namespace waystone::cli
