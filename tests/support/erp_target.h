#pragma once

#include <memory>
#include <string>
#include <vector>

#include "support/process.h"

namespace waystone::testing {

// A Python target of tests/targets/ (standard library only, sharing no code with
// Waystone or its simulator) running as a child process on a loopback port. Its
// counts are what it received, not what we think we sent. Not thread-safe; one
// per test.
class TargetProcess {
 public:
  // Starts tests/targets/`script` (python3, or node for .mjs) with `args`, its own
  // output in `output_dir`;
  // fails the test when it does not listen within 10 s.
  TargetProcess(const std::string& output_dir, const std::string& script,
                const std::vector<std::string>& args);
  virtual ~TargetProcess();
  TargetProcess(const TargetProcess&) = delete;
  TargetProcess& operator=(const TargetProcess&) = delete;

  bool ok() const { return port_ > 0; }
  int port() const { return port_; }
  const Process& process() const { return *process_; }
  std::string base_url() const { return "http://127.0.0.1:" + std::to_string(port_); }

  // Sends one request to the target as a plain client; returns the body.
  std::string Call(const std::string& method, const std::string& path, const std::string& body);
  // Returns GET /_target/stats as JSON text ("" when it cannot be read).
  std::string StatsJson() { return Call("GET", "/_target/stats", ""); }

 private:
  std::unique_ptr<Process> process_;
  int port_ = -1;
};

// The independent SMTP server, tests/targets/smtp (npm smtp-server): its control routes
// at base_url(), its SMTP port read from its stats once it listens.
class SmtpTarget : public TargetProcess {
 public:
  explicit SmtpTarget(const std::string& output_dir, const std::vector<std::string>& args = {});
  // "smtp://127.0.0.1:<port>" ("" when it did not start).
  const std::string& smtp_url() const { return smtp_url_; }

 private:
  std::string smtp_url_;
};

// The independent ERP stand-in, tests/targets/erp_target.py: orders without key
// deduplication, messages with it, faults in every shape a lost answer takes.
class ErpTarget : public TargetProcess {
 public:
  explicit ErpTarget(const std::string& output_dir, int seed = 0);
  // Sets faults (POST /_target/faults with `faults_json`); false when refused.
  bool Faults(const std::string& faults_json);
};

// tests/targets/paged_erp_target.py: an ERP answering errors in 200 bodies, with a
// loose, paginated, lagging order search (README.md beside it).
class PagedErpTarget : public TargetProcess {
 public:
  explicit PagedErpTarget(const std::string& output_dir);
  // POST /_target/settings; false when refused.
  bool Settings(const std::string& settings_json);
  // POST /_target/seed {"orders": [{"ref": ...}, ...]}; false when refused.
  bool Seed(const std::string& seed_json);
};

}  // namespace waystone::testing
