#include "engine/lease_reaper.h"

#include <cerrno>
#include <csignal>
#include <unistd.h>

#include "base/log.h"

namespace waystone {
namespace {

std::string HostName() {
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) != 0) return "localhost";
  return name;
}

}  // namespace

std::string MakeOwnerName(const std::string& nonce) {
  return HostName() + "/" + std::to_string(getpid()) + "/" + nonce;
}

absl::StatusOr<int> ReapDeadLocalOwners(Store& store, Millis now) {
  auto owners = store.LeaseOwners(now);
  if (!owners.ok()) return owners.status();
  const std::string host = HostName() + "/";
  int reaped = 0;
  for (const std::string& owner : *owners) {
    if (!owner.starts_with(host)) continue;
    const size_t pid_end = owner.find('/', host.size());
    if (pid_end == std::string::npos) continue;
    const pid_t pid = static_cast<pid_t>(std::atol(owner.substr(host.size(), pid_end).c_str()));
    if (pid <= 0 || pid == getpid()) continue;
    if (::kill(pid, 0) == 0 || errno != ESRCH) continue;  // alive, or not ours to judge
    auto status = store.ExpireLeases(owner);
    if (!status.ok()) return status;
    Log(LogLevel::kInfo, "took over leases of dead worker " + owner);
    ++reaped;
  }
  return reaped;
}

}  // namespace waystone
