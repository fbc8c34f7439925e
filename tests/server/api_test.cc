// The HTTP API over a real server on loopback: every read route x every kind of
// caller (no token, bad token, viewer of the tenant, viewer of another tenant,
// all-tenants admin), problem+json errors, and tokens stored only as hashes.

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "base/sha256.h"
#include "connectors/http/http_client.h"
#include "server/api_server.h"
#include "server/auth.h"
#include "support/backends.h"

namespace waystone {
namespace {

using Json = nlohmann::json;

class ApiTest : public ::testing::TestWithParam<testing::Backend> {
 protected:
  void SetUp() override {
    const std::string path = testing::FreshStorePath(GetParam(), dir_, "api");
    ASSERT_FALSE(path.empty());
    auto store = OpenStore({path});
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = std::move(*store);
    ASSERT_TRUE(store_->PutDefinition("h", "wf", "wf.yaml", "text", 1).ok());
    for (const auto& [tenant, key] : {std::pair{"t1", "k1"}, std::pair{"t2", "k2"}}) {
      NewInstance in;
      in.tenant = tenant;
      in.key = key;
      in.workflow = "wf";
      in.definition_hash = "h";
      in.input_json = "{}";
      in.input_hash = Sha256Hex("{}");
      in.trace_id = "trace";
      in.step_names = {"one"};
      in.started_event = {0, std::string("ev-") + key, 0, tenant, "waystone.instance.started", "{}",
                          0};
      in.now = 1000;
      ASSERT_TRUE(store_->StartInstance(in).ok());
    }
    viewer_t1_ = *CreateToken(*store_, "v1", "t1", Role::kViewer, 1);
    viewer_t2_ = *CreateToken(*store_, "v2", "t2", Role::kViewer, 1);
    admin_ = *CreateToken(*store_, "root", "*", Role::kAdmin, 1);
    admin_t1_ = *CreateToken(*store_, "root-t1", "t1", Role::kAdmin, 1);
    ApiServerOptions options;
    options.listen = "127.0.0.1:0";
    auto server = ApiServer::Start(options, store_.get(), SystemClock::Get(), nullptr);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
    http_ = NewCurlHttpClient({});
  }

  HttpResponse Get(const std::string& path, const std::string& token) {
    HttpRequest request{
        "GET", "http://127.0.0.1:" + std::to_string(server_->port()) + path, {}, "", 5000};
    if (!token.empty()) request.headers.emplace_back("Authorization", "Bearer " + token);
    return http_->Send(request);
  }

  testing::TempDir dir_;
  std::unique_ptr<Store> store_;
  std::unique_ptr<ApiServer> server_;
  std::unique_ptr<HttpClient> http_;
  std::string viewer_t1_, viewer_t2_, admin_, admin_t1_;
};

struct Case {
  std::string path;
  std::string caller;  // none | bad | viewer_t1 | viewer_t2 | admin
  int status;
};

TEST_P(ApiTest, EveryReadRouteForEveryCaller) {
  const std::vector<Case> cases = {
      {"/v1/instances", "none", 401},
      {"/v1/instances", "bad", 401},
      {"/v1/instances", "viewer_t1", 200},
      {"/v1/instances", "viewer_t2", 200},
      {"/v1/instances", "admin", 200},
      {"/v1/instances/k1", "none", 401},
      {"/v1/instances/k1", "bad", 401},
      {"/v1/instances/k1", "viewer_t1", 200},
      {"/v1/instances/k1", "viewer_t2", 404},
      {"/v1/instances/k1", "admin", 400},
      {"/v1/instances/k1?tenant=t1", "admin", 200},
      {"/v1/alerts", "none", 401},
      {"/v1/alerts", "bad", 401},
      {"/v1/alerts", "viewer_t1", 200},
      {"/v1/alerts", "admin", 200},
      {"/healthz", "none", 200},
      {"/readyz", "none", 200},
      {"/v1/me", "none", 401},
      {"/v1/me", "bad", 401},
      {"/v1/me", "viewer_t1", 200},
      {"/v1/me", "admin", 200},
      {"/v1/triage", "none", 401},
      {"/v1/triage", "bad", 401},
      {"/v1/triage", "viewer_t1", 200},
      {"/v1/triage", "admin", 200},
      {"/v1/triage?tenant=t1", "admin", 200},
      {"/v1/triage?stuck_after=0", "viewer_t1", 400},
      {"/v1/triage?limit=501", "viewer_t1", 400},
      {"/v1/me?x=1", "viewer_t1", 400},
      {"/v1/tokens", "none", 401},
      {"/v1/tokens", "bad", 401},
      {"/v1/tokens", "viewer_t1", 403},
      {"/v1/tokens", "admin", 200},
      {"/v1/tokens?tenant=t1", "admin", 400},
      // The console's files are public: they hold no data.
      {"/console/", "none", 200},
      {"/console/app.js", "none", 200},
      {"/console/nothing.js", "none", 404},
      {"/console/?token=x", "none", 400},
      // The API's /metrics counts every tenant: an admin of every tenant only (the
      // metrics listener serves scrapers without a token, without tenant names).
      {"/metrics", "none", 401},
      {"/metrics", "viewer_t1", 403},
      {"/metrics", "admin_t1", 403},
      {"/metrics", "admin", 200},
      // One reading of the query on every route.
      {"/v1/instances?limit=2&limit=3", "viewer_t1", 400},
      {"/v1/instances?colour=red", "viewer_t1", 400},
      {"/v1/instances/k1?tenant=t1&tenant=t2", "admin", 400},
      {"/v1/alerts?state=open&state=open", "viewer_t1", 400},
      {"/healthz?verbose=1", "none", 400},
      {"/v1/nothing-here", "none", 404},
  };
  for (const Case& c : cases) {
    const std::string token = c.caller == "bad"         ? "wst_not-a-token"
                              : c.caller == "viewer_t1" ? viewer_t1_
                              : c.caller == "viewer_t2" ? viewer_t2_
                              : c.caller == "admin"     ? admin_
                              : c.caller == "admin_t1"  ? admin_t1_
                                                        : "";
    auto response = Get(c.path, token);
    ASSERT_EQ(response.outcome.kind, CallOutcome::Kind::kResponse) << c.path;
    EXPECT_EQ(response.outcome.status, c.status)
        << c.path << " as " << c.caller << ": " << response.body;
    if (c.status >= 400) {
      Json problem = Json::parse(response.body, nullptr, false);
      ASSERT_TRUE(problem.is_object()) << response.body;
      EXPECT_EQ(problem["status"], c.status);
      EXPECT_TRUE(problem["type"].get<std::string>().starts_with("urn:waystone:problem:"));
      EXPECT_EQ(problem["instance"], c.path.substr(0, c.path.find('?')));
    }
  }
}

// An event kept for a code workflow's function (Operations::Deliver keeps it) is
// listed in the instance's view until a wait takes it; an instance without one has
// no such list.
TEST_P(ApiTest, TheInstanceViewListsKeptEvents) {
  EXPECT_FALSE(Json::parse(Get("/v1/instances/k1", viewer_t1_).body).contains("kept_events"));
  auto leases = store_->ClaimRunnable("w", 2000, 5000, 10);
  ASSERT_TRUE(leases.ok()) << leases.status();
  ASSERT_FALSE(leases->empty());
  Change keep;
  keep.lease = leases->front();
  keep.now = 1'700'000'000'000;
  keep.lease_expires_at = 0;
  keep.keep = KeptEvent{0, "com.example.paid", "/bank", "p-1", R"({"amount":12})", keep.now};
  for (const Lease& lease : *leases) {
    if (store_->GetInstance(lease.instance_id)->key == "k1") keep.lease = lease;
  }
  ASSERT_TRUE((*store_->Commit({keep}))[0].ok());
  auto shown = Get("/v1/instances/k1", viewer_t1_);
  ASSERT_EQ(shown.outcome.status, 200) << shown.body;
  const Json view = Json::parse(shown.body);
  ASSERT_EQ(view["kept_events"].size(), 1u) << shown.body;
  EXPECT_EQ(view["kept_events"][0]["type"], "com.example.paid");
  EXPECT_EQ(view["kept_events"][0]["source"], "/bank");
  EXPECT_EQ(view["kept_events"][0]["id"], "p-1");
  EXPECT_EQ(view["kept_events"][0]["data"]["amount"], 12);
  EXPECT_EQ(view["kept_events"][0]["received_at"], "2023-11-14T22:13:20.000Z");
}

TEST_P(ApiTest, RevokedExpiredAndAllTenantNonAdminTokensAre401) {
  // Stored as older versions made them, or as time made them.
  ASSERT_TRUE(
      store_->PutToken({Sha256Hex("wst_old-star-operator"), "old-op", "*", "operator", 1, 0, 0})
          .ok());
  ASSERT_TRUE(store_->PutToken({Sha256Hex("wst_expired"), "gone", "t1", "viewer", 1, 0, 2}).ok());
  EXPECT_EQ(Get("/v1/instances", "wst_old-star-operator").outcome.status, 401);
  EXPECT_EQ(Get("/v1/instances", "wst_expired").outcome.status, 401);
  EXPECT_EQ(Get("/v1/instances", viewer_t1_).outcome.status, 200);
  ASSERT_TRUE(
      store_->RevokeToken("v1", {0, 5, "root", "t1", 0, "revoke_token", "test", "{}"}).ok());
  EXPECT_EQ(Get("/v1/instances", viewer_t1_).outcome.status, 401);
  EXPECT_FALSE(CreateToken(*store_, "star-viewer", "*", Role::kViewer, 1).ok());
  EXPECT_FALSE(CreateToken(*store_, "star-op", "*", Role::kOperator, 1).ok());
  EXPECT_FALSE(CreateToken(*store_, "root", "t1", Role::kViewer, 1).ok());  // name taken
}

TEST_P(ApiTest, ATokenSeesOnlyItsTenant) {
  Json t1 = Json::parse(Get("/v1/instances", viewer_t1_).body);
  ASSERT_EQ(t1["items"].size(), 1u);
  EXPECT_EQ(t1["items"][0]["key"], "k1");
  Json all = Json::parse(Get("/v1/instances", admin_).body);
  EXPECT_EQ(all["items"].size(), 2u);
  Json view = Json::parse(Get("/v1/instances/k1", viewer_t1_).body);
  EXPECT_EQ(view["tenant"], "t1");
  EXPECT_EQ(view["steps"][0]["name"], "one");
  EXPECT_TRUE(view.contains("audit"));
  // Another tenant's instance is indistinguishable from a missing one.
  auto other = Get("/v1/instances/k2", viewer_t1_);
  auto missing = Get("/v1/instances/nope", viewer_t1_);
  EXPECT_EQ(other.outcome.status, 404);
  EXPECT_EQ(missing.outcome.status, 404);
}

TEST_P(ApiTest, BadQueriesAreProblemsAndUnknownRoutesToo) {
  auto state = Get("/v1/instances?state=sleeping", viewer_t1_);
  EXPECT_EQ(state.outcome.status, 400);
  EXPECT_NE(state.body.find("sleeping"), std::string::npos);
  EXPECT_EQ(Get("/v1/instances?limit=0", viewer_t1_).outcome.status, 400);
  auto unknown = Get("/v2/everything", viewer_t1_);
  EXPECT_EQ(unknown.outcome.status, 404);
  EXPECT_TRUE(Json::parse(unknown.body, nullptr, false).is_object()) << unknown.body;
  HttpRequest big{"POST",
                  "http://127.0.0.1:" + std::to_string(server_->port()) + "/v1/instances",
                  {{"Authorization", "Bearer " + viewer_t1_}},
                  std::string(2 << 20, 'x'),
                  5000};
  auto too_large = http_->Send(big);
  EXPECT_EQ(too_large.outcome.status, 413);
}

TEST_P(ApiTest, MeNamesTheTokensNameTenantAndRole) {
  Json me = Json::parse(Get("/v1/me", viewer_t1_).body);
  EXPECT_EQ(
      me,
      (Json{{"token", "v1"}, {"tenant", "t1"}, {"role", "viewer"}, {"actions", Json::array()}}));
  Json root = Json::parse(Get("/v1/me", admin_).body);
  // Without a permissions section an admin may do everything, in every tenant.
  EXPECT_EQ(root, (Json{{"token", "root"},
                        {"tenant", "*"},
                        {"role", "admin"},
                        {"actions",
                         {"retry", "confirm", "compensate", "skip", "close", "acknowledge",
                          "see_redacted", "pause_target", "revise"}},
                        {"actions_by_tenant", Json::object()}}));
}

TEST_P(ApiTest, TriageGroupsOnlyTheTokensTenantByReason) {
  // Both instances were last changed at t=1s (1970): nothing moved for far longer
  // than any threshold, so each is stuck.
  auto count = [](const Json& triage, const std::string& reason) {
    for (const Json& group : triage["groups"]) {
      if (group["reason"] == reason) return group["count"].get<int>();
    }
    return -1;
  };
  Json t1 = Json::parse(Get("/v1/triage", viewer_t1_).body);
  EXPECT_EQ(count(t1, "stuck"), 1) << t1.dump();
  EXPECT_EQ(count(t1, "outcome_unknown"), 0);
  EXPECT_EQ(count(t1, "in_progress"), 0);
  EXPECT_EQ(count(t1, "finished"), -1);  // finished instances are not triaged
  Json stuck;
  for (const Json& group : t1["groups"]) {
    if (group["reason"] == "stuck") stuck = group;
  }
  ASSERT_EQ(stuck["items"].size(), 1u);
  EXPECT_EQ(stuck["items"][0]["key"], "k1");
  EXPECT_EQ(stuck["items"][0]["stopped"]["reason"], "stuck");
  EXPECT_EQ(stuck["items"][0]["stopped"]["step"], "one");
  EXPECT_NE(stuck["items"][0]["stopped"]["words"].get<std::string>().find("No progress since"),
            std::string::npos);
  Json all = Json::parse(Get("/v1/triage", admin_).body);
  EXPECT_EQ(count(all, "stuck"), 2);
  Json only_t2 = Json::parse(Get("/v1/triage?tenant=t2", admin_).body);
  EXPECT_EQ(count(only_t2, "stuck"), 1);
  Json none = Json::parse(Get("/v1/triage?workflow=other", admin_).body);
  EXPECT_EQ(count(none, "stuck"), 0);
  // The instance route says the same, with the pinned input.
  Json view = Json::parse(Get("/v1/instances/k1", viewer_t1_).body);
  EXPECT_EQ(view["stopped"]["reason"], "stuck");
  EXPECT_EQ(view["input"], Json::object());
}

TEST_P(ApiTest, ConsoleFilesComeWithTypeETagAndRevalidation) {
  auto serve = [&](const std::string& head) {
    return server_->ServeBytesForTest(head + "Host: x\r\nConnection: close\r\n\r\n");
  };
  const std::string redirect = serve("GET /console HTTP/1.1\r\n");
  EXPECT_TRUE(redirect.starts_with("HTTP/1.1 301")) << redirect;
  EXPECT_NE(redirect.find("Location: /console/\r\n"), std::string::npos) << redirect;
  const std::string index = serve("GET /console/ HTTP/1.1\r\n");
  ASSERT_TRUE(index.starts_with("HTTP/1.1 200")) << index.substr(0, 300);
  EXPECT_NE(index.find("Content-Type: text/html; charset=utf-8\r\n"), std::string::npos);
  EXPECT_NE(index.find("Cache-Control: no-cache\r\n"), std::string::npos);
  EXPECT_NE(index.find("Content-Security-Policy: default-src 'none'"), std::string::npos);
  EXPECT_NE(index.find("<script type=\"module\" src=\"app.js\">"), std::string::npos);
  const size_t at = index.find("ETag: ");
  ASSERT_NE(at, std::string::npos);
  const std::string etag = index.substr(at + 6, index.find("\r\n", at) - at - 6);
  EXPECT_EQ(etag.size(), 18u) << etag;  // 16 hex digits, quoted
  const std::string again =
      serve("GET /console/index.html HTTP/1.1\r\nIf-None-Match: " + etag + "\r\n");
  EXPECT_TRUE(again.starts_with("HTTP/1.1 304")) << again;
  EXPECT_EQ(again.find("<!doctype"), std::string::npos);
  const std::string stale =
      serve("GET /console/ HTTP/1.1\r\nIf-None-Match: \"0000000000000000\"\r\n");
  EXPECT_TRUE(stale.starts_with("HTTP/1.1 200")) << stale.substr(0, 200);
  const std::string script = serve("GET /console/app.js HTTP/1.1\r\n");
  EXPECT_NE(script.find("Content-Type: text/javascript; charset=utf-8\r\n"), std::string::npos);
  EXPECT_NE(script.find("function renderLogin"), std::string::npos);
  const std::string post = serve("POST /console/ HTTP/1.1\r\nContent-Length: 0\r\n");
  EXPECT_TRUE(post.starts_with("HTTP/1.1 405")) << post.substr(0, 200);
}

TEST_P(ApiTest, TokensAreStoredOnlyAsHashes) {
  EXPECT_TRUE(viewer_t1_.starts_with("wst_"));
  EXPECT_EQ(viewer_t1_.size(), 68u);
  EXPECT_TRUE(store_->FindToken(Sha256Hex(viewer_t1_)).ok());
  EXPECT_TRUE(absl::IsNotFound(store_->FindToken(viewer_t1_).status()));
  auto stored = store_->FindToken(Sha256Hex(viewer_t1_));
  EXPECT_EQ(stored->tenant, "t1");
  EXPECT_EQ(stored->role, "viewer");
  EXPECT_EQ(stored->token_hash.find(viewer_t1_.substr(4)), std::string::npos);
}

INSTANTIATE_TEST_SUITE_P(Backends, ApiTest,
                         ::testing::Values(testing::Backend::kSqlite, testing::Backend::kPostgres),
                         testing::BackendName);

}  // namespace
}  // namespace waystone
