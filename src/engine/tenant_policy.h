#pragma once

#include <map>
#include <string>
#include <vector>

namespace waystone {

// What one tenant may do on this server (a `tenants:` entry of the server config).
// A value type.
struct TenantPolicy {
  std::vector<std::string> workflows;      // the workflows it may start
  std::string secrets_file;                // NAME=value lines: its {{secret.NAME}}
  std::map<std::string, std::string> env;  // its {{env.NAME}}, over the process's
};

}  // namespace waystone
