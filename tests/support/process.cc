#include "support/process.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <stdexcept>
#include <thread>

#include "support/temp_dir.h"

extern char** environ;

namespace waystone::testing {
namespace {

std::atomic<int> counter{0};

}  // namespace

Process::Process(const std::vector<std::string>& argv,
                 const std::map<std::string, std::string>& env, const std::string& output_dir) {
  const int n = counter++;
  out_path_ = output_dir + "/proc-" + std::to_string(getpid()) + "-" + std::to_string(n) + ".out";
  err_path_ = output_dir + "/proc-" + std::to_string(getpid()) + "-" + std::to_string(n) + ".err";
  std::map<std::string, std::string> merged;
  for (char** e = environ; *e != nullptr; ++e) {
    std::string entry(*e);
    const size_t eq = entry.find('=');
    if (eq != std::string::npos) merged[entry.substr(0, eq)] = entry.substr(eq + 1);
  }
  for (const auto& [k, v] : env) merged[k] = v;
  std::vector<std::string> env_strings;
  for (const auto& [k, v] : merged) env_strings.push_back(k + "=" + v);
  std::vector<char*> envp;
  for (auto& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::vector<std::string> args = argv;
  std::vector<char*> argp;
  for (auto& s : args) argp.push_back(s.data());
  argp.push_back(nullptr);

  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&actions, 1, out_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC,
                                   0644);
  posix_spawn_file_actions_addopen(&actions, 2, err_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC,
                                   0644);
  const int rc = posix_spawn(&pid_, argp[0], &actions, nullptr, argp.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0) throw std::runtime_error("posix_spawn " + argv[0] + ": " + std::strerror(rc));
  running_ = true;
}

Process::~Process() {
  if (running_) {
    ::kill(pid_, SIGKILL);
    int status = 0;
    waitpid(pid_, &status, 0);
  }
}

std::string Process::Output() const { return ReadFile(out_path_); }
std::string Process::Errors() const { return ReadFile(err_path_); }

void Process::Signal(int signal) {
  if (running_) ::kill(pid_, signal);
}

ProcessResult Process::Wait(std::chrono::milliseconds timeout) {
  ProcessResult result;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  int status = 0;
  while (running_) {
    const pid_t done = waitpid(pid_, &status, WNOHANG);
    if (done == pid_) {
      running_ = false;
      break;
    }
    if (std::chrono::steady_clock::now() > deadline) {
      ::kill(pid_, SIGKILL);
      waitpid(pid_, &status, 0);
      running_ = false;
      result.err = "[test harness: process timed out and was killed]\n";
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  if (WIFEXITED(status)) result.exit_code = WEXITSTATUS(status);
  if (WIFSIGNALED(status)) result.signal = WTERMSIG(status);
  result.out = ReadFile(out_path_);
  result.err += ReadFile(err_path_);
  return result;
}

ProcessResult RunProcess(const std::vector<std::string>& argv,
                         const std::map<std::string, std::string>& env,
                         const std::string& output_dir, std::chrono::milliseconds timeout) {
  Process process(argv, env, output_dir);
  return process.Wait(timeout);
}

int FreeLoopbackPort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  close(fd);
  return ntohs(addr.sin_port);
}

std::map<std::string, std::string> SimulatorEnv(const std::string& base_url,
                                                std::map<std::string, std::string> extra) {
  std::map<std::string, std::string> env = {{"CRM_URL", base_url},
                                            {"ERP_URL", base_url},
                                            {"LINE_URL", base_url},
                                            {"EMAIL_URL", base_url},
                                            {"WAYSTONE_SECRET_ERP_TOKEN", "t"},
                                            {"WAYSTONE_SECRET_LINE_TOKEN", "t"},
                                            {"WAYSTONE_CRASH_AT", ""},
                                            {"WAYSTONE_PAUSE_AT", ""}};
  for (auto& [k, v] : extra) env[k] = v;
  return env;
}

bool WaitFor(const std::function<bool()>& condition, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    if (condition()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return condition();
}

int WaitForPortLine(const Process& process, std::chrono::milliseconds timeout) {
  return WaitForPrefixedNumber(process, "PORT ", timeout);
}

int WaitForPrefixedNumber(const Process& process, const std::string& prefix,
                          std::chrono::milliseconds timeout) {
  int number = -1;
  WaitFor(
      [&] {
        const std::string out = process.Output();
        const size_t at = out.find(prefix);
        if (at == std::string::npos || out.find('\n', at) == std::string::npos) return false;
        number = std::stoi(out.substr(at + prefix.size()));
        return true;
      },
      timeout);
  return number;
}

}  // namespace waystone::testing
