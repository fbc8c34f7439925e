#pragma once

#include <memory>
#include <string>
#include <vector>

namespace waystone::testing {

// A private PostgreSQL cluster for tests: initdb in a temporary folder, a server
// on a loopback port (fsync on), stopped and removed on destruction. As root the
// server runs as the `postgres` user (it refuses root).
class PostgresCluster {
 public:
  // Starts a cluster; fails the calling test (and returns nullptr) when it cannot.
  static std::unique_ptr<PostgresCluster> Start();
  ~PostgresCluster();

  // Returns a URI of a fresh, empty database in this cluster.
  std::string NewDatabase();
  int port() const { return port_; }
  const std::string& data_dir() const { return data_; }

  // pg_ctl restart -m immediate: a crash and recovery of the server.
  bool RestartImmediate();
  bool Stop();
  bool StartAgain();

 private:
  PostgresCluster() = default;
  bool PgCtl(const std::vector<std::string>& args);
  std::string bin_;
  std::string dir_;
  std::string data_;
  int port_ = 0;
  int databases_ = 0;
  bool running_ = false;
};

// Returns the conninfo of a fresh database: in the cluster named by
// WAYSTONE_TEST_PG (a server URI the test command started), or else in a cluster
// this process starts once and keeps until exit.
std::string FreshPostgresDatabase();

}  // namespace waystone::testing
