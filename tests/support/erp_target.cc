#include "support/erp_target.h"

#include <gtest/gtest.h>

#include "connectors/http/http_client.h"

namespace waystone::testing {

ErpTarget::ErpTarget(const std::string& output_dir, int seed) {
  process_ = std::make_unique<Process>(
      std::vector<std::string>{"/usr/bin/env", "python3", SourceDir() + "/tests/targets/erp_target.py",
                               "--host", "127.0.0.1", "--port", "0", "--seed",
                               std::to_string(seed)},
      std::map<std::string, std::string>{}, output_dir);
  port_ = WaitForPortLine(*process_, std::chrono::seconds(10));
  if (port_ <= 0) ADD_FAILURE() << "erp_target did not start: " << process_->Errors();
}

ErpTarget::~ErpTarget() = default;

std::string ErpTarget::Call(const std::string& method, const std::string& path,
                            const std::string& body) {
  static const std::unique_ptr<HttpClient> http = NewCurlHttpClient({});
  HttpRequest request{method, base_url() + path, {{"Content-Type", "application/json"}}, body,
                      10'000};
  HttpResponse response = http->Send(request);
  return response.body;
}

bool ErpTarget::Faults(const std::string& faults_json) {
  return Call("POST", "/_target/faults", faults_json).find("\"faults\"") != std::string::npos;
}

std::string ErpTarget::StatsJson() { return Call("GET", "/_target/stats", ""); }

}  // namespace waystone::testing
