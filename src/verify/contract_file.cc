// A contract file: what verify cannot infer of the systems a definition calls
// (docs/verify.md, contract files). Read with the one YAML config reader.

#include <algorithm>
#include <set>

#include "definition/yaml_config.h"
#include "verify/contract.h"

namespace waystone::verify {
namespace {

absl::Status Apply(const YAML::Node& root, const YamlConfig& config, Contract* contract) {
  if (!root.IsMap()) return config.Error(root, "a contract file is a map with 'targets:'");
  if (auto status = config.CheckFields(root, {"targets"}); !status.ok()) return status;
  const YAML::Node targets = root["targets"];
  if (!targets || !targets.IsMap())
    return config.Error(root, "'targets:' must map env names to what they do");
  for (const auto& entry : targets) {
    const std::string env = entry.first.as<std::string>();
    const YAML::Node target = entry.second;
    if (std::find(contract->url_envs.begin(), contract->url_envs.end(), env) ==
        contract->url_envs.end()) {
      return config.Error(
          entry.first,
          "target '" + env + "': no request of the definition starts with {{env." + env + "}}");
    }
    if (!target.IsMap()) return config.Error(target, "target '" + env + "' must be a map");
    if (auto status = config.CheckFields(target, {"honors_keys", "key_header", "ignore_params"},
                                         "target '" + env + "'");
        !status.ok()) {
      return status;
    }
    std::string said;
    for (Route& route : contract->routes) {
      if (route.env != env) continue;
      auto honors = config.Flag(target, "honors_keys", route.honors_key, "target '" + env + "'");
      if (!honors.ok()) return honors.status();
      if (route.role == Role::kCall) route.honors_key = *honors;
      if (const std::string header = YamlConfig::Text(target, "key_header"); !header.empty()) {
        std::string lower = header;
        std::transform(lower.begin(), lower.end(), lower.begin(),
                       [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
        route.key_headers = {lower};
      }
      if (const YAML::Node params = target["ignore_params"]) {
        if (!params.IsSequence())
          return config.Error(params, "target '" + env + "': ignore_params is a list");
        for (const auto& param : params) route.literal_params.push_back(param.as<std::string>());
      }
    }
    if (target["honors_keys"])
      said += std::string(" honors_keys: ") + target["honors_keys"].Scalar() + ";";
    if (target["key_header"])
      said += " key_header: " + YamlConfig::Text(target, "key_header") + ";";
    if (target["ignore_params"]) said += " ignores some query parameters;";
    contract->inferred.push_back("{{env." + env + "}} as " + config.source() + " says:" + said);
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ApplyContractFile(const std::string& path, Contract* contract) {
  return LoadYamlConfig(path, [&](const std::string& text, const std::string& source) {
    YamlConfig config(source);
    return ParseYamlConfig(text, source,
                           [&](const YAML::Node& root) { return Apply(root, config, contract); });
  });
}

}  // namespace waystone::verify
