#include "store/lease_owners.h"

#include <unistd.h>

#include <cerrno>
#include <csignal>

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

bool IsDeadLocalOwner(const std::string& owner) {
  const std::string host = HostName() + "/";
  if (!owner.starts_with(host)) return false;
  const size_t pid_end = owner.find('/', host.size());
  if (pid_end == std::string::npos) return false;
  const pid_t pid = static_cast<pid_t>(std::atol(owner.substr(host.size(), pid_end).c_str()));
  if (pid <= 0 || pid == getpid()) return false;
  return ::kill(pid, 0) != 0 && errno == ESRCH;  // alive, or not ours to judge: false
}

absl::StatusOr<int> ReapDeadLocalOwners(LeaseStore& store, Millis now) {
  auto owners = store.LeaseOwners(now);
  if (!owners.ok()) return owners.status();
  int reaped = 0;
  for (const std::string& owner : *owners) {
    if (!IsDeadLocalOwner(owner)) continue;
    auto status = store.ExpireLeases(owner);
    if (!status.ok()) return status;
    Log(LogLevel::kInfo, "took over leases of dead worker " + owner);
    ++reaped;
  }
  return reaped;
}

}  // namespace waystone
