#include "support/erp_target.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "connectors/http/http_client.h"

namespace waystone::testing {

TargetProcess::TargetProcess(const std::string& output_dir, const std::string& script,
                             const std::vector<std::string>& args) {
  // Python standard-library targets, or a Node one (.mjs) with its packages beside it.
  const char* interpreter = script.ends_with(".mjs") ? "node" : "python3";
  std::vector<std::string> argv = {
      "/usr/bin/env", interpreter, SourceDir() + "/tests/targets/" + script, "--host", "127.0.0.1",
      "--port",       "0"};
  argv.insert(argv.end(), args.begin(), args.end());
  process_ = std::make_unique<Process>(argv, std::map<std::string, std::string>{}, output_dir);
  port_ = WaitForPortLine(*process_, std::chrono::seconds(10));
  if (port_ <= 0) ADD_FAILURE() << script << " did not start: " << process_->Errors();
}

TargetProcess::~TargetProcess() = default;

std::string TargetProcess::Call(const std::string& method, const std::string& path,
                                const std::string& body) {
  static const std::unique_ptr<HttpClient> http = NewCurlHttpClient({});
  HttpRequest request{
      method, base_url() + path, {{"Content-Type", "application/json"}}, body, 10'000};
  HttpResponse response = http->Send(request);
  return response.body;
}

SmtpTarget::SmtpTarget(const std::string& output_dir, const std::vector<std::string>& args)
    : TargetProcess(output_dir, "smtp/smtp_target.mjs", args) {
  if (!ok()) return;
  const auto stats = nlohmann::json::parse(StatsJson(), nullptr, false);
  if (stats.is_object() && stats.contains("smtp_port")) {
    smtp_url_ = "smtp://127.0.0.1:" + std::to_string(stats["smtp_port"].get<int>());
  }
  if (smtp_url_.empty()) ADD_FAILURE() << "the SMTP target gave no smtp_port: " << StatsJson();
}

ErpTarget::ErpTarget(const std::string& output_dir, int seed)
    : TargetProcess(output_dir, "erp_target.py", {"--seed", std::to_string(seed)}) {}

bool ErpTarget::Faults(const std::string& faults_json) {
  return Call("POST", "/_target/faults", faults_json).find("\"faults\"") != std::string::npos;
}

PagedErpTarget::PagedErpTarget(const std::string& output_dir)
    : TargetProcess(output_dir, "paged_erp_target.py", {}) {}

bool PagedErpTarget::Settings(const std::string& settings_json) {
  return Call("POST", "/_target/settings", settings_json).find("\"dedupe\"") != std::string::npos;
}

bool PagedErpTarget::Seed(const std::string& seed_json) {
  return Call("POST", "/_target/seed", seed_json).find("\"OK\"") != std::string::npos;
}

}  // namespace waystone::testing
