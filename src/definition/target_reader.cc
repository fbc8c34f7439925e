// TargetReader: a definition's `targets:` and their limits.

#include "definition/definition_readers.h"

namespace waystone {

using Json = nlohmann::json;

void TargetReader::ReadTargets(const YAML::Node& targets, std::vector<TargetSpec>* out) {
  if (!targets.IsMap() || targets.size() == 0) {
    Error(targets, "",
          "'targets' maps names to systems, e.g. { erp: { url: \"{{env.ERP_URL}}\","
          " tls: { ca_file: \"{{env.ERP_CA_FILE}}\" } } }");
    return;
  }
  for (const auto& entry : targets) {
    TargetSpec target;
    target.name = entry.first.Scalar();
    target.line = entry.first.Mark().line + 1;
    const std::string where = "target '" + target.name + "'";
    if (!ValidName(target.name)) {
      Error(entry.first, "", where + ": names may only use letters, digits, '-', '_' and '.'");
    }
    const YAML::Node spec = entry.second;
    if (!spec.IsMap()) {
      Error(spec, "", where + " must be a mapping with 'url'");
      continue;
    }
    CheckFields(spec, "", {"url", "tls", "oauth2", "limits", "circuit_breaker"}, where);
    target.url = RequiredString(spec, "url", "");
    if (const YAML::Node tls = spec["tls"]) {
      if (!tls.IsMap()) {
        Error(tls, "", where + ": 'tls' must be a mapping with ca_file, cert_file, key_file");
      } else {
        CheckFields(tls, "", {"ca_file", "cert_file", "key_file", "key_password"}, where + " tls");
        target.ca_file = OptionalString(tls, "ca_file", "");
        target.cert_file = OptionalString(tls, "cert_file", "");
        target.key_file = OptionalString(tls, "key_file", "");
        target.key_password = OptionalString(tls, "key_password", "");
        if (target.cert_file.empty() != target.key_file.empty()) {
          Error(tls, "", where + ": a client certificate needs both 'cert_file' and 'key_file'");
        }
        if (!target.key_password.empty() && target.key_file.empty()) {
          Error(tls, "", where + ": 'key_password' goes with 'key_file'");
        }
      }
    }
    if (const YAML::Node oauth2 = spec["oauth2"]) {
      if (!oauth2.IsMap()) {
        Error(oauth2, "",
              where +
                  ": 'oauth2' must be a mapping with token_url, client_id and "
                  "client_secret");
      } else {
        CheckFields(oauth2, "", {"token_url", "client_id", "client_secret", "scope"},
                    where + " oauth2");
        target.token_url = RequiredString(oauth2, "token_url", "");
        target.client_id = RequiredString(oauth2, "client_id", "");
        target.client_secret = RequiredString(oauth2, "client_secret", "");
        target.scope = OptionalString(oauth2, "scope", "");
      }
    }
    ReadLimits(spec, where, &target.limits);
    for (const TargetSpec& other : *out) {
      if (other.name == target.name) Error(entry.first, "", where + " is declared twice");
    }
    out->push_back(std::move(target));
  }
}

void TargetReader::ReadLimits(const YAML::Node& spec, const std::string& where, TargetLimits* out) {
  if (const YAML::Node limits = spec["limits"]) {
    if (!limits.IsMap()) {
      Error(limits, "",
            where + ": 'limits' must be a mapping such as { rate: 20, concurrency: 4 }");
    } else {
      CheckFields(limits, "", {"rate", "concurrency"}, where + " limits");
      if (const YAML::Node rate = limits["rate"]) {
        double value = 0;
        if (!YAML::convert<double>::decode(rate, value) || !(value >= 0.01) || value > 10000) {
          Error(rate, "", where + ": 'limits.rate' must be calls a second from 0.01 to 10000");
        } else {
          out->rate = value;
        }
      }
      out->concurrency =
          WholeNumber(limits, "concurrency", 1, 10000, where + ": 'limits.concurrency'");
    }
  }
  if (const YAML::Node breaker = spec["circuit_breaker"]) {
    if (!breaker.IsMap()) {
      Error(breaker, "",
            where +
                ": 'circuit_breaker' must be a mapping such as { failures: 5, "
                "cool_down: 30s }");
    } else {
      CheckFields(breaker, "", {"failures", "cool_down"}, where + " circuit_breaker");
      if (!breaker["failures"]) {
        Error(breaker, "",
              where +
                  ": 'circuit_breaker' needs 'failures' (consecutive transient "
                  "failures that open it)");
      }
      out->breaker_failures =
          WholeNumber(breaker, "failures", 1, 1000, where + ": 'circuit_breaker.failures'");
      out->cool_down = Duration(breaker, "cool_down", out->cool_down, "");
      if (out->cool_down < 100 || out->cool_down > 24 * 3600 * 1000LL) {
        Error(breaker["cool_down"], "",
              where +
                  ": 'circuit_breaker.cool_down' must be from 100ms "
                  "to 24h");
      }
    }
  }
}

}  // namespace waystone
