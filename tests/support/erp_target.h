#pragma once

#include <memory>
#include <string>

#include "support/process.h"

namespace waystone::testing {

// The independent ERP stand-in (tests/targets/erp_target.py, Python standard
// library, shares no code with Waystone or its simulator) running as a child
// process on a loopback port. Its counts are what it received, not what we
// think we sent. Not thread-safe; one per test.
class ErpTarget {
 public:
  // Starts the target with its own output in `output_dir`; fails the test when it
  // does not listen within 10 s.
  explicit ErpTarget(const std::string& output_dir, int seed = 0);
  ~ErpTarget();
  ErpTarget(const ErpTarget&) = delete;
  ErpTarget& operator=(const ErpTarget&) = delete;

  bool ok() const { return port_ > 0; }
  std::string base_url() const { return "http://127.0.0.1:" + std::to_string(port_); }

  // Sets faults (POST /_target/faults with `faults_json`); false when refused.
  bool Faults(const std::string& faults_json);
  // Returns GET /_target/stats as JSON text ("" when it cannot be read).
  std::string StatsJson();
  // Sends one request to the target as a plain client; returns the body.
  std::string Call(const std::string& method, const std::string& path, const std::string& body);

 private:
  std::unique_ptr<Process> process_;
  int port_ = -1;
};

}  // namespace waystone::testing
