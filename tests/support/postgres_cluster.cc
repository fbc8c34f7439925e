#include "support/postgres_cluster.h"

#include <arpa/inet.h>
#include <libpq-fe.h>
#include <netinet/in.h>
#include <pwd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <vector>

#include <gtest/gtest.h>

#include "support/process.h"

namespace waystone::testing {
namespace {

std::string FindBinDir() {
  if (const char* path = std::getenv("PATH")) {
    std::string all(path);
    size_t start = 0;
    while (start <= all.size()) {
      size_t end = all.find(':', start);
      if (end == std::string::npos) end = all.size();
      const std::string dir = all.substr(start, end - start);
      if (!dir.empty() && std::filesystem::exists(dir + "/initdb") &&
          std::filesystem::exists(dir + "/pg_ctl")) {
        return dir;
      }
      start = end + 1;
    }
  }
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/usr/lib/postgresql", ec)) {
    if (std::filesystem::exists(entry.path() / "bin/initdb"))
      return (entry.path() / "bin").string();
  }
  return "";
}

// Returns a database name no other test process uses: the pid alone is reused
// across runs against a long-lived cluster, so the start time goes in too.
std::string UniqueDatabaseName(int counter) {
  static const long long started = std::chrono::duration_cast<std::chrono::microseconds>(
                                       std::chrono::system_clock::now().time_since_epoch())
                                       .count() %
                                   1'000'000'000'000LL;
  return "t" + std::to_string(getpid()) + "_" + std::to_string(started) + "_" +
         std::to_string(counter);
}

// Prefixes argv so the command runs as `postgres` when we are root.
std::vector<std::string> AsServerUser(std::vector<std::string> argv) {
  if (geteuid() != 0) return argv;
  argv.insert(argv.begin(), {"/usr/sbin/runuser", "-u", "postgres", "--"});
  return argv;
}

bool Execute(const std::string& conninfo, const std::string& sql) {
  PGconn* conn = PQconnectdb(conninfo.c_str());
  bool ok = PQstatus(conn) == CONNECTION_OK;
  if (ok) {
    PGresult* result = PQexec(conn, sql.c_str());
    ok = PQresultStatus(result) == PGRES_COMMAND_OK;
    if (!ok) ADD_FAILURE() << sql << ": " << PQerrorMessage(conn);
    PQclear(result);
  } else {
    ADD_FAILURE() << "connect " << conninfo << ": " << PQerrorMessage(conn);
  }
  PQfinish(conn);
  return ok;
}

}  // namespace

std::unique_ptr<PostgresCluster> PostgresCluster::Start() {
  auto cluster = std::unique_ptr<PostgresCluster>(new PostgresCluster());
  cluster->bin_ = FindBinDir();
  if (cluster->bin_.empty()) {
    ADD_FAILURE() << "PostgreSQL server binaries (initdb, pg_ctl) not found";
    return nullptr;
  }
  const char* base = std::getenv("TMPDIR");
  std::string pattern = std::string(base ? base : "/tmp") + "/waystone-pg-XXXXXX";
  if (mkdtemp(pattern.data()) == nullptr) return nullptr;
  cluster->dir_ = pattern;
  cluster->data_ = pattern + "/data";
  if (geteuid() == 0) {
    const passwd* pw = getpwnam("postgres");
    if (pw == nullptr) {
      ADD_FAILURE() << "running as root and there is no postgres user";
      return nullptr;
    }
    if (chown(pattern.c_str(), pw->pw_uid, pw->pw_gid) != 0) return nullptr;
  }
  auto init = RunProcess(AsServerUser({cluster->bin_ + "/initdb", "-D", cluster->data_, "-U",
                                       "waystone", "--auth=trust", "-E", "UTF8", "--no-sync"}),
                         {}, cluster->dir_);
  if (init.exit_code != 0) {
    ADD_FAILURE() << "initdb failed: " << init.out << init.err;
    return nullptr;
  }
  cluster->port_ = FreeLoopbackPort();
  if (!cluster->StartAgain()) return nullptr;
  return cluster;
}

bool PostgresCluster::PgCtl(const std::vector<std::string>& args) {
  std::vector<std::string> argv = {bin_ + "/pg_ctl", "-D", data_, "-w", "-t", "60"};
  argv.insert(argv.end(), args.begin(), args.end());
  // Its output files in the cluster's folder, removed with it (in /tmp they stayed).
  auto result = RunProcess(AsServerUser(argv), {}, dir_);
  if (result.exit_code != 0) {
    ADD_FAILURE() << "pg_ctl failed: " << result.out << result.err;
    return false;
  }
  return true;
}

bool PostgresCluster::StartAgain() {
  const std::string options = "-p " + std::to_string(port_) + " -k " + dir_ +
                              " -c listen_addresses=127.0.0.1 -c fsync=on -c max_connections=200";
  running_ = PgCtl({"-l", dir_ + "/server.log", "-o", options, "start"});
  return running_;
}

bool PostgresCluster::Stop() {
  if (!running_) return true;
  running_ = !PgCtl({"-m", "fast", "stop"});
  return !running_;
}

bool PostgresCluster::RestartImmediate() {
  const std::string options = "-p " + std::to_string(port_) + " -k " + dir_ +
                              " -c listen_addresses=127.0.0.1 -c fsync=on -c max_connections=200";
  return PgCtl({"-m", "immediate", "-l", dir_ + "/server.log", "-o", options, "restart"});
}

PostgresCluster::~PostgresCluster() {
  if (running_) {
    std::vector<std::string> argv = {bin_ + "/pg_ctl", "-D", data_, "-m",
                                     "immediate",      "-w", "stop"};
    RunProcess(AsServerUser(argv), {}, dir_);
  }
  std::error_code ec;
  std::filesystem::remove_all(dir_, ec);
}

std::string PostgresCluster::NewDatabase() {
  const std::string server = "postgresql://waystone@127.0.0.1:" + std::to_string(port_);
  const std::string name = UniqueDatabaseName(++databases_);
  Execute(server + "/postgres", "CREATE DATABASE " + name);
  return server + "/" + name;
}

std::string FreshPostgresDatabase() {
  static std::mutex mu;
  static std::unique_ptr<PostgresCluster> cluster;
  static int counter = 0;
  std::lock_guard<std::mutex> lock(mu);
  if (const char* server = std::getenv("WAYSTONE_TEST_PG"); server != nullptr && *server) {
    const std::string name = UniqueDatabaseName(++counter);
    Execute(std::string(server) + "/postgres", "CREATE DATABASE " + name);
    return std::string(server) + "/" + name;
  }
  if (!cluster) cluster = PostgresCluster::Start();
  if (!cluster) return "";
  return cluster->NewDatabase();
}

}  // namespace waystone::testing
