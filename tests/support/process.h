#pragma once

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "support/test_paths.h"

namespace waystone::testing {

// The result of a finished child process.
struct ProcessResult {
  int exit_code = -1;  // when it exited
  int signal = 0;      // when a signal ended it
  std::string out;     // stdout
  std::string err;     // stderr
};

// A child process started with posix_spawn (no shell), stdout and stderr going
// to files. Killed with SIGKILL on destruction if still running.
class Process {
 public:
  // Starts `argv` with the current environment plus `env` overrides.
  Process(const std::vector<std::string>& argv, const std::map<std::string, std::string>& env,
          const std::string& output_dir);
  ~Process();
  Process(const Process&) = delete;
  Process& operator=(const Process&) = delete;

  pid_t pid() const { return pid_; }
  void Signal(int signal);
  // Waits for the process to end (up to `timeout`; then kills it and fails).
  ProcessResult Wait(std::chrono::milliseconds timeout = std::chrono::seconds(120));
  bool running() const { return running_; }
  // Returns what the process wrote to stdout / stderr so far.
  std::string Output() const;
  std::string Errors() const;

 private:
  pid_t pid_ = -1;
  bool running_ = false;
  std::string out_path_;
  std::string err_path_;
};

// Runs a command to completion.
ProcessResult RunProcess(const std::vector<std::string>& argv,
                         const std::map<std::string, std::string>& env,
                         const std::string& output_dir,
                         std::chrono::milliseconds timeout = std::chrono::seconds(120));

// Polls `condition` until true or `timeout`; returns its last value.
bool WaitFor(const std::function<bool()>& condition, std::chrono::milliseconds timeout);

// Waits for `process` to print a whole line "PORT <n>" (how the test targets say
// they listen) and returns n; -1 when none came within `timeout`.
int WaitForPortLine(const Process& process, std::chrono::milliseconds timeout);
// Waits for a line "<prefix><number>" in the output of `process`; returns the
// number, or -1 when none came within `timeout`.
int WaitForPrefixedNumber(const Process& process, const std::string& prefix,
                          std::chrono::milliseconds timeout);

// Returns a TCP port on 127.0.0.1 that was free a moment ago.
int FreeLoopbackPort();

// Returns the environment that points the example workflow at a simulator:
// CRM/ERP/LINE/EMAIL URLs and the secrets it needs, plus `extra`.
std::map<std::string, std::string> SimulatorEnv(const std::string& base_url,
                                                std::map<std::string, std::string> extra = {});

}  // namespace waystone::testing
