// An example consumer of Waystone's webhooks that applies each event exactly once
// to its own SQLite database with the inbox pattern: in ONE transaction it claims
// (source, id) in an inbox table, applies the event, and commits. A redelivered
// event (same source and id) finds its claim and changes nothing.
//
//   waystone-example-consumer --port 9000 --db consumer.db --secret-env WEBHOOK_SECRET
//
// It verifies the Standard Webhooks signature itself (HMAC-SHA256 over
// "id.timestamp.body" with the base64 key after "whsec_") and refuses timestamps
// more than five minutes away. GET /stats returns what it received and applied.
// This is user code, written against the documented wire format only.

#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <sqlite3.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <mutex>
#include <string>
#include <vector>

#include <httplib.h>
#include <nlohmann/json.hpp>

namespace {

std::string Base64(const unsigned char* data, size_t size) {
  std::string out(4 * ((size + 2) / 3), '\0');
  EVP_EncodeBlock(reinterpret_cast<unsigned char*>(out.data()), data, static_cast<int>(size));
  return out;
}

std::vector<unsigned char> FromBase64(const std::string& text) {
  std::vector<unsigned char> out(text.size());
  int n = EVP_DecodeBlock(out.data(), reinterpret_cast<const unsigned char*>(text.data()),
                          static_cast<int>(text.size()));
  if (n < 0) return {};
  for (size_t i = text.size(); i > 0 && text[i - 1] == '='; --i) --n;
  out.resize(static_cast<size_t>(n));
  return out;
}

// Returns "" when the signature header holds a valid v1 signature, else why not.
std::string Verify(const std::string& secret, const std::string& id, const std::string& timestamp,
                   const std::string& body, const std::string& signatures) {
  const long long ts = std::atoll(timestamp.c_str());
  if (std::llabs(static_cast<long long>(std::time(nullptr)) - ts) > 300) return "stale timestamp";
  const auto key = FromBase64(secret.substr(secret.rfind('_') + 1));
  const std::string signed_content = id + "." + timestamp + "." + body;
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned int mac_size = 0;
  HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
       reinterpret_cast<const unsigned char*>(signed_content.data()), signed_content.size(), mac,
       &mac_size);
  const std::string expected = "v1," + Base64(mac, mac_size);
  size_t start = 0;
  while (start < signatures.size()) {  // space-separated list of signatures
    size_t end = signatures.find(' ', start);
    if (end == std::string::npos) end = signatures.size();
    if (signatures.compare(start, end - start, expected) == 0) return "";
    start = end + 1;
  }
  return "bad signature";
}

struct Consumer {
  sqlite3* db = nullptr;
  std::mutex mu;
  long long received = 0, applied = 0, duplicates = 0, rejected = 0;

  bool Exec(const char* sql) {
    return sqlite3_exec(db, sql, nullptr, nullptr, nullptr) == SQLITE_OK;
  }

  // Claims the event and applies it in one transaction. Returns false on a duplicate.
  bool Apply(const nlohmann::json& event) {
    Exec("BEGIN IMMEDIATE");
    sqlite3_stmt* claim = nullptr;
    sqlite3_prepare_v2(db, "INSERT OR IGNORE INTO inbox (source, id) VALUES (?, ?)", -1, &claim,
                       nullptr);
    const std::string source = event.value("source", "");
    const std::string id = event.value("id", "");
    sqlite3_bind_text(claim, 1, source.c_str(), -1, SQLITE_TRANSIENT);
    sqlite3_bind_text(claim, 2, id.c_str(), -1, SQLITE_TRANSIENT);
    sqlite3_step(claim);
    sqlite3_finalize(claim);
    if (sqlite3_changes(db) == 0) {
      Exec("COMMIT");
      return false;
    }
    sqlite3_stmt* apply = nullptr;
    sqlite3_prepare_v2(db,
                       "INSERT INTO order_events (instance_key, type, step, external_id, event_id) "
                       "VALUES (?, ?, ?, ?, ?)",
                       -1, &apply, nullptr);
    const auto& data = event["data"];
    const std::string key = event.value("subject", "");
    const std::string type = event.value("type", "");
    const std::string step = data.value("step", "");
    const std::string external_id = data.value("external_id", "");
    sqlite3_bind_text(apply, 1, key.c_str(), -1, SQLITE_TRANSIENT);
    sqlite3_bind_text(apply, 2, type.c_str(), -1, SQLITE_TRANSIENT);
    sqlite3_bind_text(apply, 3, step.c_str(), -1, SQLITE_TRANSIENT);
    sqlite3_bind_text(apply, 4, external_id.c_str(), -1, SQLITE_TRANSIENT);
    sqlite3_bind_text(apply, 5, id.c_str(), -1, SQLITE_TRANSIENT);
    sqlite3_step(apply);
    sqlite3_finalize(apply);
    Exec("COMMIT");
    return true;
  }
};

}  // namespace

int main(int argc, char** argv) {
  int port = 9000;
  std::string db_path = "consumer.db";
  std::string secret_env = "WEBHOOK_SECRET";
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--port") == 0)
      port = std::atoi(argv[i + 1]);
    else if (std::strcmp(argv[i], "--db") == 0)
      db_path = argv[i + 1];
    else if (std::strcmp(argv[i], "--secret-env") == 0)
      secret_env = argv[i + 1];
  }
  const char* secret = std::getenv(secret_env.c_str());
  if (secret == nullptr) {
    std::fprintf(stderr, "consumer: %s is not set\n", secret_env.c_str());
    return 1;
  }
  Consumer consumer;
  if (sqlite3_open(db_path.c_str(), &consumer.db) != SQLITE_OK) return 1;
  consumer.Exec("PRAGMA journal_mode=WAL");
  consumer.Exec(
      "CREATE TABLE IF NOT EXISTS inbox (source TEXT NOT NULL, id TEXT NOT NULL, "
      "PRIMARY KEY (source, id))");
  consumer.Exec(
      "CREATE TABLE IF NOT EXISTS order_events (seq INTEGER PRIMARY KEY, instance_key "
      "TEXT, type TEXT, step TEXT, external_id TEXT, event_id TEXT)");

  httplib::Server server;
  server.Post("/events", [&](const httplib::Request& req, httplib::Response& res) {
    std::lock_guard<std::mutex> lock(consumer.mu);
    ++consumer.received;
    const std::string why = Verify(secret, req.get_header_value("webhook-id"),
                                   req.get_header_value("webhook-timestamp"), req.body,
                                   req.get_header_value("webhook-signature"));
    if (!why.empty()) {
      ++consumer.rejected;
      res.status = 401;
      res.set_content(why, "text/plain");
      return;
    }
    auto event = nlohmann::json::parse(req.body, nullptr, false);
    if (!event.is_object()) {
      res.status = 400;
      return;
    }
    if (consumer.Apply(event)) {
      ++consumer.applied;
    } else {
      ++consumer.duplicates;
    }
    res.status = 204;
  });
  server.Get("/stats", [&](const httplib::Request&, httplib::Response& res) {
    std::lock_guard<std::mutex> lock(consumer.mu);
    nlohmann::json stats = {{"received", consumer.received},
                            {"applied", consumer.applied},
                            {"duplicates", consumer.duplicates},
                            {"rejected", consumer.rejected}};
    res.set_content(stats.dump(), "application/json");
  });
  server.Get("/applied", [&](const httplib::Request&, httplib::Response& res) {
    std::lock_guard<std::mutex> lock(consumer.mu);
    nlohmann::json rows = nlohmann::json::array();
    sqlite3_stmt* s = nullptr;
    sqlite3_prepare_v2(consumer.db,
                       "SELECT instance_key, type, event_id FROM order_events ORDER BY seq", -1, &s,
                       nullptr);
    while (sqlite3_step(s) == SQLITE_ROW) {
      rows.push_back({reinterpret_cast<const char*>(sqlite3_column_text(s, 0)),
                      reinterpret_cast<const char*>(sqlite3_column_text(s, 1)),
                      reinterpret_cast<const char*>(sqlite3_column_text(s, 2))});
    }
    sqlite3_finalize(s);
    res.set_content(rows.dump(), "application/json");
  });
  const int bound = port == 0 ? server.bind_to_any_port("127.0.0.1")
                              : (server.bind_to_port("127.0.0.1", port) ? port : -1);
  if (bound <= 0) {
    std::fprintf(stderr, "consumer: cannot listen on port %d\n", port);
    return 1;
  }
  std::printf("consumer listening on http://127.0.0.1:%d\n", bound);
  std::fflush(stdout);
  server.listen_after_bind();
  sqlite3_close(consumer.db);
  return 0;
}
