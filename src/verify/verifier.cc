#include "verify/verifier.h"

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <regex>
#include <set>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

extern char** environ;

namespace waystone::verify {
namespace {

using Json = nlohmann::json;
namespace fs = std::filesystem;

std::string Quote(const std::string& text) {
  std::string quoted = "'";
  for (char c : text) quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return quoted + "'";
}

// The branches a green report must have reached for this contract.
std::vector<std::string> ExpectedCoverage(const Contract& contract,
                                          const std::map<std::string, std::string>& against) {
  std::vector<std::string> expected;
  for (const Route& route : contract.routes) {
    // What a sandbox does with a request is its own: only the proxy's answers count.
    if (against.contains(route.env) && route.role != Role::kCall) continue;
    if (against.contains(route.env)) {
      expected.push_back(route.step + " " + std::string(RoleName(route.role)) +
                         " retried after 429");
      continue;
    }
    const std::string label = route.step + " " + std::string(RoleName(route.role));
    switch (route.role) {
      case Role::kCall:
        expected.push_back(label + " retried after 429");
        if (route.honors_key && route.side_effecting) expected.push_back(label + " key replayed");
        break;
      case Role::kLookup:
        expected.push_back(route.step + " lookup found");
        expected.push_back(route.step + " lookup not found");
        break;
      case Role::kCompensate:
        expected.push_back(route.step + " compensated");
        expected.push_back(label + " failed, then recovered");
        break;
    }
  }
  return expected;
}

class Runner {
 public:
  Runner(const WorkflowDefinition& definition, const Contract& contract,
         const VerifyOptions& options, GenericTarget& target, std::string input)
      : definition_(definition),
        contract_(contract),
        options_(options),
        target_(target),
        input_(std::move(input)) {}

  Row Run(int id, const Schedule& schedule) {
    const auto began = std::chrono::steady_clock::now();
    Row row;
    row.id = id;
    row.schedule = schedule;
    const fs::path dir = fs::path(options_.work_dir) / ("s" + std::to_string(id));
    std::error_code ignored;
    fs::remove_all(dir, ignored);
    fs::create_directories(dir, ignored);
    const std::string base = target_.Open(id, schedule);
    const std::vector<std::string> env = Environment(base, id);
    const std::string result_path = (dir / "result.json").string();
    const std::string relay_path = (dir / "relay.yaml").string();
    {
      std::ofstream relay(relay_path);
      relay << "deployment: verify\n"
               "retry: { max_attempts: 20, initial_interval: 20ms, max_interval: 200ms }\n"
               "lease: 5s\n"
               "sinks:\n"
               "  - name: "
            << kEventSink
            << "\n"
               "    type: webhook\n"
               "    url: "
            << base
            << "/_events\n"
               "    secret_env: WAYSTONE_VERIFY_HOOK_SECRET\n"
               "    events: [\"waystone.*\"]\n"
               "    timeout: 2s\n";
    }

    auto args = [&](bool crash) {
      std::vector<std::string> argv{options_.worker_program,
                                    "verify-worker",
                                    options_.definition_path,
                                    "--db",
                                    (dir / "waystone.db").string(),
                                    "--input",
                                    InputFor(id),
                                    "--result",
                                    result_path,
                                    "--lease",
                                    Lease(),
                                    "--relay-config",
                                    relay_path};
      if (crash && !schedule.crash_at.empty()) {
        argv.insert(argv.end(), {"--crash-at", schedule.crash_at, "--crash-occurrence",
                                 std::to_string(schedule.crash_occurrence)});
      }
      if (!options_.against.empty()) argv.push_back("--observe-lookups");
      if (schedule.operator_compensates) argv.push_back("--operator-compensate");
      if (schedule.starts == Starts::kEventTwice) {
        argv.insert(argv.end(), {"--event-source", "verify", "--event-id", "start-1"});
      }
      return argv;
    };
    const std::string log = (dir / "worker.log").string();
    std::string problem;
    // The first worker, with the kill armed; a second at once for concurrent starts.
    // A worker frozen by the target (SIGSTOP, its answer unread) is outlived: a
    // second one takes the instance over once the lease has run out and brings it to
    // rest; then the first resumes, and must find its lease lost.
    // Each worker's result is its own: a worker that fails writes none, and the
    // one before it does not answer for it.
    auto spawn = [&](bool crash) {
      fs::remove(result_path, ignored);
      return Spawn(args(crash), env, log, &problem);
    };
    auto takeover = [&] {
      const pid_t second = spawn(false);
      target_.SetWorker(id, second);
      std::string failed;
      row.kills += Await(second, id, {}, &failed) ? 1 : 0;
      ++row.takeovers;
      // Frozen inside a transaction (a parallel branch's checkpoint committing), the
      // first worker holds SQLite's one write lock: nobody else can write until it
      // resumes. That is SQLite's, not the definition's: the first resumes and goes on.
      if (!failed.empty() && LogHolds(log, "database is locked")) {
        row.note = "the frozen worker held SQLite's write lock; the takeover gave way";
        return;
      }
      if (problem.empty()) problem = failed;
    };
    std::vector<pid_t> first{spawn(true)};
    if (schedule.starts == Starts::kConcurrent)
      first.push_back(Spawn(args(false), env, log, &problem));
    target_.SetWorker(id, first.front());
    bool killed = false;
    for (pid_t pid : first) killed |= Await(pid, id, takeover, &problem);
    row.kills += killed ? 1 : 0;
    // Restarted until a worker brings the instance to rest without being killed
    // (a schedule may kill more than once); the event delivered again restarts too.
    for (int restarts = 0; problem.empty() && restarts < 6; ++restarts) {
      const bool again = killed || (restarts == 0 && schedule.starts == Starts::kEventTwice);
      if (!again) break;
      pid_t pid = spawn(false);
      target_.SetWorker(id, pid);
      killed = Await(pid, id, takeover, &problem);
      row.kills += killed ? 1 : 0;
    }
    row.result = ReadResult(result_path, log, problem);
    row.observed = target_.Close(id);
    row.broken = Judge(
        contract_, row.observed, row.result,
        schedule.faults.empty() && schedule.crash_at.empty() && !schedule.operator_compensates);
    if (!options_.keep && row.broken.empty()) fs::remove_all(dir, ignored);
    row.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - began).count();
    return row;
  }

 private:
  // The input of schedule `id`. Against a sandbox, which keeps what every schedule
  // did, the input fields the business key reads get a suffix of the run and the
  // schedule, so no two schedules share an identity there.
  std::string InputFor(int id) const {
    if (options_.against.empty()) return input_;
    Json input = Json::parse(input_, nullptr, false);
    if (!input.is_object()) return input_;
    static const std::regex kKeyField(R"(input\.([A-Za-z0-9_\-]+))");
    const std::string& key = definition_.key;
    for (auto it = std::sregex_iterator(key.begin(), key.end(), kKeyField);
         it != std::sregex_iterator(); ++it) {
      auto field = input.find((*it)[1].str());
      if (field != input.end() && field->is_string()) {
        *field = field->get<std::string>() + "-" + run_ + "-s" + std::to_string(id);
      }
    }
    return input.dump();
  }

  // The workers' lease: past the longest request timeout (the engine requires it),
  // short enough that a takeover comes soon.
  std::string Lease() const {
    Millis longest = 0;
    for (const Route& route : contract_.routes) longest = std::max(longest, route.timeout);
    return std::to_string(std::max<Millis>(3, (longest + 2000 + 999) / 1000)) + "s";
  }

  std::vector<std::string> Environment(const std::string& base, int id) const {
    std::map<std::string, std::string> vars;
    for (char** entry = environ; entry != nullptr && *entry != nullptr; ++entry) {
      const std::string item(*entry);
      const size_t eq = item.find('=');
      if (eq == std::string::npos || item.starts_with("WAYSTONE_SECRET_")) continue;
      vars[item.substr(0, eq)] = item.substr(eq + 1);
    }
    for (const std::string& name : contract_.url_envs) vars[name] = base;
    for (const std::string& name : contract_.smtp_envs) {
      vars[name] =
          "smtp://127.0.0.1:" + std::to_string(target_.smtp_port()) + "/s" + std::to_string(id);
    }
    for (const std::string& name : contract_.other_envs) {
      if (!vars.contains(name)) vars[name] = "verify-" + name;
    }
    // Never a real secret: the simulated targets log what they get.
    for (const std::string& name : contract_.secrets)
      vars["WAYSTONE_SECRET_" + name] = "verify-secret";
    vars["WAYSTONE_VERIFY_HOOK_SECRET"] = "whsec_dmVyaWZ5LXdlYmhvb2stc2VjcmV0LWZvci1ldmVudHM=";
    vars.erase("WAYSTONE_CRASH_AT");
    vars.erase("WAYSTONE_PAUSE_AT");
    vars.erase("WAYSTONE_DB");
    vars.erase("WAYSTONE_CONFIG");
    std::vector<std::string> env;
    for (const auto& [name, value] : vars) env.push_back(name + "=" + value);
    return env;
  }

  static pid_t Spawn(const std::vector<std::string>& args, const std::vector<std::string>& env,
                     const std::string& log, std::string* problem) {
    std::vector<char*> argv, envp;
    for (const std::string& arg : args) argv.push_back(const_cast<char*>(arg.c_str()));
    argv.push_back(nullptr);
    for (const std::string& var : env) envp.push_back(const_cast<char*>(var.c_str()));
    envp.push_back(nullptr);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, 1, log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    posix_spawn_file_actions_addopen(&actions, 2, log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    // Nothing else of ours: a connection the target holds open elsewhere would keep a
    // reset from being one (a child's copy of the socket outlives the target's close).
    posix_spawn_file_actions_addclosefrom_np(&actions, 3);
    pid_t pid = 0;
    const int failed = posix_spawn(&pid, argv[0], &actions, nullptr, argv.data(), envp.data());
    posix_spawn_file_actions_destroy(&actions);
    if (failed != 0) {
      *problem = "cannot start the worker " + args[0] + ": " + std::strerror(failed);
      return -1;
    }
    return pid;
  }

  // Waits for the worker; true when it was killed (SIGKILL) by a schedule. It is
  // seen to have ended before it is reaped, and the target forgets it in between,
  // so no signal of the target's can reach a reused pid. Past the deadline it is
  // killed here, and that is a liveness failure; an exit other than 0 is a failure.
  bool Await(pid_t pid, int id, const std::function<void()>& takeover, std::string* problem) {
    if (pid <= 0) return false;
    // A takeover waits out a lease first (two minutes with an email step in the
    // definition): the deadline leaves room for it.
    const Millis lease = std::stoll(Lease()) * 1000;
    const Millis allowed = std::max(options_.rest_deadline, 2 * lease + 30'000);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(allowed);
    bool timed_out = false;
    while (true) {
      siginfo_t info{};
      if (::waitid(P_PID, static_cast<id_t>(pid), &info, WEXITED | WNOHANG | WNOWAIT) != 0) {
        *problem = "lost the worker process";
        return false;
      }
      if (info.si_pid == pid) break;
      if (const pid_t frozen = takeover ? target_.TakeFrozen(id) : 0; frozen > 0) {
        takeover();
        target_.SetWorker(id, frozen);
        ::kill(frozen, SIGCONT);
        continue;
      }
      if (!timed_out && std::chrono::steady_clock::now() > deadline) {
        ::kill(pid, SIGKILL);
        timed_out = true;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    target_.ForgetWorker(id, pid);
    int status = 0;
    ::waitpid(pid, &status, 0);
    if (timed_out) {
      *problem = "the worker did not bring the instance to rest within " +
                 std::to_string(allowed / 1000) + " s";
      return false;
    }
    if (WIFSIGNALED(status)) {
      if (WTERMSIG(status) == SIGKILL) return true;
      *problem = "the worker died of signal " + std::to_string(WTERMSIG(status));
    } else if (WIFEXITED(status) && WEXITSTATUS(status) != 0) {
      *problem = "a worker exited with status " + std::to_string(WEXITSTATUS(status));
    }
    return false;
  }

  static bool LogHolds(const std::string& log, const std::string& what) {
    std::ifstream in(log);
    std::stringstream text;
    text << in.rdbuf();
    return text.str().find(what) != std::string::npos;
  }

  static RunResult ReadResult(const std::string& path, const std::string& log,
                              const std::string& problem) {
    RunResult result;
    std::ifstream in(path);
    std::stringstream text;
    text << in.rdbuf();
    Json parsed = Json::parse(text.str(), nullptr, false);
    if (!problem.empty() || !parsed.is_object()) {
      std::ifstream log_in(log);
      std::stringstream log_text;
      log_text << log_in.rdbuf();
      std::string tail = log_text.str();
      if (tail.size() > 600) tail = "..." + tail.substr(tail.size() - 600);
      result.problem = (problem.empty() ? "the worker wrote no result" : problem) +
                       (tail.empty() ? "" : "; its log ends: " + tail);
      return result;
    }
    result.reported = true;
    result.state = parsed.value("state", "");
    result.reason = parsed.value("reason", "");
    if (parsed.contains("open_alerts") && parsed["open_alerts"].is_array()) {
      for (const Json& alert : parsed["open_alerts"]) {
        if (alert.is_string()) result.open_alerts.push_back(alert.get<std::string>());
      }
    }
    if (parsed.contains("looked_up") && parsed["looked_up"].is_object()) {
      for (const auto& [step, ids] : parsed["looked_up"].items()) {
        std::vector<std::string>& found = result.looked_up[step];  // found nothing: still asked
        for (const Json& id : ids) found.push_back(id.get<std::string>());
      }
    }
    if (parsed.contains("steps") && parsed["steps"].is_array()) {
      for (const Json& step : parsed["steps"]) {
        result.steps.push_back(
            {step.value("name", ""), step.value("state", ""), step.value("external_id", "")});
      }
    }
    return result;
  }

  const WorkflowDefinition& definition_;
  const Contract& contract_;
  const VerifyOptions& options_;
  GenericTarget& target_;
  const std::string input_;
  // Names this run in the sandbox's keys.
  const std::string run_ =
      std::to_string(std::chrono::system_clock::now().time_since_epoch() / std::chrono::seconds(1));
};

}  // namespace

int Report::failures() const {
  int failed = 0;
  for (const Row& row : rows) failed += row.broken.empty() ? 0 : 1;
  return failed;
}

absl::StatusOr<Report> RunVerify(const WorkflowDefinition& definition, const Contract& inferred,
                                 const VerifyOptions& options) {
  Contract contract = inferred;
  for (Route& route : contract.routes) route.forwarded = options.against.contains(route.env);
  const auto began = std::chrono::steady_clock::now();
  Report report;
  report.workflow = definition.name;
  report.inferred = contract.inferred;
  std::vector<Schedule> schedules;
  if (!options.replay.empty()) {
    auto schedule = ParseSpec(options.replay, contract, &definition);
    if (!schedule.ok()) return schedule.status();
    schedules.push_back(*schedule);
  } else if (options.random_schedules > 0) {
    for (int i = 0; i < options.random_schedules; ++i) {
      schedules.push_back(RandomSchedule(definition, contract, options.seed, i));
    }
  } else {
    schedules = AllSchedules(definition, contract);
  }
  std::error_code error;
  fs::create_directories(options.work_dir, error);
  if (error) {
    return absl::FailedPreconditionError("cannot make the folder " + options.work_dir + ": " +
                                         error.message());
  }
  for (const auto& [env, url] : options.against) {
    if (std::find(contract.url_envs.begin(), contract.url_envs.end(), env) ==
        contract.url_envs.end()) {
      return absl::InvalidArgumentError("--against " + env + ": no request of " +
                                        definition.source + " starts with {{env." + env + "}}");
    }
    report.inferred.push_back("{{env." + env + "}} is the sandbox " + url +
                              ", behind verify's fault-injecting proxy");
  }
  auto target = GenericTarget::Start(contract, options.against);
  if (!target.ok()) return target.status();
  const std::string input =
      options.input_json.empty() ? SynthesizeInput(definition) : options.input_json;
  Runner runner(definition, contract, options, **target, input);

  report.rows.resize(schedules.size());
  std::atomic<size_t> next{0};
  std::vector<std::thread> jobs;
  for (int j = 0; j < std::max(1, options.jobs); ++j) {
    jobs.emplace_back([&] {
      for (size_t i = next++; i < schedules.size(); i = next++) {
        report.rows[i] = runner.Run(static_cast<int>(i) + 1, schedules[i]);
      }
    });
  }
  for (std::thread& job : jobs) job.join();

  std::set<std::string> covered;
  for (Row& row : report.rows) {
    covered.insert(row.observed.coverage.begin(), row.observed.coverage.end());
    // A schedule whose kill or fault never came tested nothing it claims to.
    const Schedule& schedule = row.schedule;
    if (!schedule.crash_at.empty() && row.kills == 0)
      row.unreached = "its kill point was never reached";
    for (const Fault& fault : schedule.faults) {
      const std::string applied = std::string(RoleName(fault.role)) + ":" + fault.step + "#" +
                                  (fault.attempt == 0 ? "*" : std::to_string(fault.attempt));
      if (std::find(row.observed.applied.begin(), row.observed.applied.end(), applied) ==
          row.observed.applied.end()) {
        row.unreached = "its fault " + applied + " was never met";
      }
    }
    if (!row.unreached.empty()) {
      ++report.unreached;
      if (options.random_schedules == 0) {
        report.uncovered.push_back(schedule.step + " " + schedule.request + ", " +
                                   schedule.injected + ": " + row.unreached);
      }
    }
  }
  for (const std::string& note : contract.ambiguous) report.uncovered.push_back(note);
  report.covered.assign(covered.begin(), covered.end());
  if (options.replay.empty()) {
    for (const std::string& branch : ExpectedCoverage(contract, options.against)) {
      if (!covered.contains(branch))
        report.uncovered.push_back(branch + ": no schedule reached it");
    }
  }
  report.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - began).count();
  return report;
}

std::string ReplayLine(const Row& row, const VerifyOptions& options) {
  std::string against;
  for (const auto& [env, url] : options.against) against += " --against " + Quote(env + "=" + url);
  if (!options.contract_file.empty()) against += " --contract " + Quote(options.contract_file);
  return "waystone verify " + Quote(options.definition_path) +
         (options.input_json.empty() ? "" : " --input " + Quote(options.input_json)) + against +
         " --replay " + Quote(row.schedule.Spec());
}

std::string FormatReport(const Report& report, const VerifyOptions& options) {
  std::ostringstream out;
  out << "verify " << report.workflow << ": " << report.rows.size() << " schedules\n\n";
  out << "what verify inferred of the targets:\n";
  for (const std::string& line : report.inferred) out << "  " << line << "\n";
  out << "\n";
  char line[512];
  std::snprintf(line, sizeof line, "%-22s %-11s %-52s %s\n", "step", "request", "injected",
                "result");
  out << line;
  for (const Row& row : report.rows) {
    std::string result = !row.broken.empty()     ? "FAIL"
                         : row.unreached.empty() ? "pass"
                                                 : "not reached";
    if (row.result.reported) result += " (" + row.result.state + ")";
    std::snprintf(line, sizeof line, "%-22s %-11s %-52s %s\n", row.schedule.step.c_str(),
                  row.schedule.request.c_str(), row.schedule.injected.c_str(), result.c_str());
    out << line;
  }
  const int failures = report.failures();
  if (failures > 0) {
    out << "\nfailures:\n";
    for (const Row& row : report.rows) {
      if (row.broken.empty()) continue;
      out << "- " << row.schedule.step << " " << row.schedule.request << ", "
          << row.schedule.injected << "\n";
      for (const std::string& why : row.broken) out << "    " << why << "\n";
      out << "    what the target saw:\n";
      for (const std::string& seen : row.observed.log) out << "      " << seen << "\n";
      out << "    replay: " << ReplayLine(row, options) << "\n";
    }
  }
  bool noted = false;
  for (const Row& row : report.rows) {
    if (row.note.empty()) continue;
    if (!noted) out << "\nnotes:\n";
    noted = true;
    out << "- " << row.schedule.step << " " << row.schedule.request << ", " << row.schedule.injected
        << ": " << row.note << "\n";
  }
  out << "\ncovered:\n";
  for (const std::string& branch : report.covered) out << "  " << branch << "\n";
  if (!report.uncovered.empty()) {
    out << "not covered (not passed):\n";
    for (const std::string& what : report.uncovered) out << "  " << what << "\n";
  }
  std::snprintf(line, sizeof line,
                "\n%d of %zu schedules failed, %d not reached, %zu not covered; %.1f s\n", failures,
                report.rows.size(), report.unreached, report.uncovered.size(), report.seconds);
  out << line;
  return out.str();
}

std::string ReportJson(const Report& report, const VerifyOptions& options) {
  Json rows = Json::array();
  for (const Row& row : report.rows) {
    Json item{{"step", row.schedule.step},
              {"request", row.schedule.request},
              {"injected", row.schedule.injected},
              {"spec", row.schedule.Spec()},
              {"pass", row.broken.empty()},
              {"state", row.result.state},
              {"reached", row.unreached.empty()},
              {"kills", row.kills},
              {"takeovers", row.takeovers},
              {"events_delivered", row.observed.events.size()},
              {"note", row.note},
              {"seconds", row.seconds},
              {"broken", row.broken}};
    if (!row.broken.empty() || !row.unreached.empty()) {
      item["replay"] = ReplayLine(row, options);
      item["target_log"] = row.observed.log;
    }
    if (!row.unreached.empty()) item["unreached"] = row.unreached;
    rows.push_back(std::move(item));
  }
  Json doc{{"workflow", report.workflow},   {"schedules", report.rows.size()},
           {"failures", report.failures()}, {"unreached", report.unreached},
           {"inferred", report.inferred},   {"covered", report.covered},
           {"uncovered", report.uncovered}, {"seconds", report.seconds},
           {"rows", std::move(rows)}};
  return doc.dump(2) + "\n";
}

}  // namespace waystone::verify
