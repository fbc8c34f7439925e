// The HTTP front's edges, byte for byte, through the API's own screen and handlers
// (ApiServer::ServeBytesForTest runs the parser a served connection runs), on a
// real SQLite store. The hostile-client suite (tests/hostile) attacks a real
// `waystone serve` over sockets; this pins each refusal to its cause.

#include <gtest/gtest.h>

#include <string>

#include "base/clock.h"
#include "base/json_depth.h"
#include "base/random.h"
#include "base/redact.h"
#include "connectors/http/http_client.h"
#include "definition/loader.h"
#include "engine/engine.h"
#include "server/api_server.h"
#include "server/auth.h"
#include "store/store.h"
#include "support/temp_dir.h"

namespace waystone {
namespace {

constexpr char kWorkflow[] = R"(
workflow: wf
key: "{{input.ref}}"
steps:
  - name: create
    recovery: manual
    request: { method: POST, url: "http://127.0.0.1:9/orders" }
)";

class HttpFrontTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto store = OpenStore({dir_.path() + "/w.db"});
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = std::move(*store);
    http_ = NewCurlHttpClient({});
    EngineOptions options;
    options.workers = 1;
    auto engine = Engine::Create(store_.get(), http_.get(), SystemClock::Get(), &random_, options);
    ASSERT_TRUE(engine.ok()) << engine.status();
    engine_ = std::move(*engine);
    auto definition = LoadDefinitionText(kWorkflow, "wf.yaml");
    ASSERT_TRUE(definition.ok()) << definition.status();
    auto registered = engine_->Register(*definition);
    ASSERT_TRUE(registered.ok()) << registered;
    ApiServerOptions api;
    api.listen = "127.0.0.1:0";
    api.max_body_bytes = 4096;
    api.events = {{"com.example.order", "wf", "", 0}};
    auto server = ApiServer::Start(api, store_.get(), SystemClock::Get(), engine_.get());
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
    token_ = *CreateToken(*store_, "op", "default", Role::kOperator, 1);
  }

  // The status code of the first answer to `raw` (0 when none).
  int StatusOf(const std::string& raw) {
    const std::string answer = server_->ServeBytesForTest(raw);
    if (!answer.starts_with("HTTP/1.1 ")) return 0;
    return std::stoi(answer.substr(9, 3));
  }

  std::string Post(const std::string& target, const std::string& body,
                   const std::string& extra_headers = "") {
    return "POST " + target + " HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + token_ +
           "\r\nContent-Type: application/json\r\n" + extra_headers +
           "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
  }

  size_t Instances() { return store_->ListInstances({})->size(); }

  testing::TempDir dir_;
  std::unique_ptr<Store> store_;
  std::unique_ptr<HttpClient> http_;
  SeededRandom random_{3};
  std::unique_ptr<Engine> engine_;
  std::unique_ptr<ApiServer> server_;
  std::string token_;
};

TEST_F(HttpFrontTest, AWellFormedRequestIsServed) {
  EXPECT_EQ(StatusOf("GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"), 200);
  EXPECT_EQ(StatusOf(Post("/v1/instances", R"({"workflow":"wf","input":{"ref":"a"}})")), 201);
  EXPECT_EQ(Instances(), 1u);
}

TEST_F(HttpFrontTest, TooManyOrTooLargeHeadersAre431) {
  std::string many = "GET /healthz HTTP/1.1\r\nHost: x\r\n";
  for (int i = 0; i < 150; ++i) many += "X-H-" + std::to_string(i) + ": v\r\n";
  EXPECT_EQ(StatusOf(many + "\r\n"), 431);
  EXPECT_EQ(StatusOf("GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + std::string(20000, 'a') +
                     "\r\n\r\n"),
            431);
}

TEST_F(HttpFrontTest, BodiesOverTheLimitAre413ChunkedOrNot) {
  const std::string big(5000, ' ');
  EXPECT_EQ(StatusOf(Post("/v1/instances", big)), 413);
  std::string chunked = "POST /v1/instances HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " +
                        token_ + "\r\nTransfer-Encoding: chunked\r\n\r\n";
  for (int i = 0; i < 10; ++i) chunked += "400\r\n" + std::string(1024, ' ') + "\r\n";
  EXPECT_EQ(StatusOf(chunked + "0\r\n\r\n"), 413);
  EXPECT_EQ(Instances(), 0u);
}

TEST_F(HttpFrontTest, AMissingTokenIsAnsweredBeforeTheBodyIsRead) {
  // The body is announced but never sent: the answer comes from the head alone.
  const std::string answer = server_->ServeBytesForTest(
      "POST /v1/instances HTTP/1.1\r\nHost: x\r\nContent-Length: 4000\r\n\r\n");
  EXPECT_TRUE(answer.starts_with("HTTP/1.1 401")) << answer;
  EXPECT_NE(answer.find("Connection: close"), std::string::npos) << answer;
}

TEST_F(HttpFrontTest, OneStrictReadingOfTheQuery) {
  for (const char* query : {"dry_run=TRUE", "dry_run=1", "dry_run=yes", "dry_run=true&dry_run=true",
                            "dry_run=true&dry_run=false", "colour=red", "dry_run"}) {
    EXPECT_EQ(StatusOf(Post(std::string("/v1/instances/a/retry?") + query, R"({"reason":"r"})")),
              400)
        << query;
    EXPECT_EQ(StatusOf(Post(std::string("/v1/alerts/1/acknowledge?") + query,
                            R"({"reason":"r"})")),
              400)
        << query;
  }
  EXPECT_EQ(StatusOf("GET /v1/instances?limit=%zz HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " +
                     token_ + "\r\n\r\n"),
            400);
  EXPECT_EQ(StatusOf("GET /v1/instances/%ff%fe HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " +
                     token_ + "\r\n\r\n"),
            400);
  EXPECT_EQ(StatusOf("DELETE /v1/instances HTTP/1.1\r\nHost: x\r\n\r\n"), 405);
}

TEST_F(HttpFrontTest, DeepJsonIsRefusedEverywhereAndChangesNothing) {
  // Within the body limit (4096 here), far past the depth limit.
  const std::string deep = std::string(1500, '[') + std::string(1500, ']');
  const std::string deep_input = R"({"workflow":"wf","input":{"ref":"d","x":)" + deep + "}}";
  EXPECT_EQ(StatusOf(Post("/v1/instances", deep_input)), 400);
  EXPECT_EQ(StatusOf(Post("/v1/instances/nobody/confirm?dry_run=true", deep)), 400);
  EXPECT_EQ(StatusOf(Post("/v1/events", R"({"specversion":"1.0","id":"1","source":"s","type":"com.example.order","data":)" + deep + "}",
                          "")),
            400);
  EXPECT_EQ(Instances(), 0u);
  EXPECT_TRUE(JsonNestsDeeperThan(deep));
  EXPECT_FALSE(JsonNestsDeeperThan(R"({"a":[1,{"b":"[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[["}]})"));
}

TEST_F(HttpFrontTest, CloudEventAttributesMustBeUtf8AndNothingIsCommitted) {
  for (const char* attribute : {"ce-id", "ce-source", "ce-type", "ce-subject", "ce-tenant"}) {
    std::string headers = "ce-specversion: 1.0\r\n";
    for (const auto& [name, value] : {std::pair{"ce-id", "e1"}, std::pair{"ce-source", "s"},
                                      std::pair{"ce-type", "com.example.order"}}) {
      if (std::string(name) != attribute) headers += std::string(name) + ": " + value + "\r\n";
    }
    headers += std::string(attribute) + ": bad\xff\xfe\r\n";
    EXPECT_EQ(StatusOf(Post("/v1/events", R"({"ref":"u1"})", headers)), 400) << attribute;
  }
  EXPECT_EQ(Instances(), 0u);
  EXPECT_EQ(StatusOf(Post("/v1/events", R"({"ref":"u1"})",
                          "ce-specversion: 1.0\r\nce-id: e1\r\nce-source: s\r\n"
                          "ce-type: com.example.order\r\n")),
            200);
  EXPECT_EQ(Instances(), 1u);
}

TEST(RedactSecretsTest, EveryFormOfARegisteredValueIsReplaced) {
  RegisterSecretValue("s3cr3t-\"value\"/x");
  EXPECT_EQ(RedactSecrets("token s3cr3t-\"value\"/x here"), "token *** here");
  EXPECT_EQ(RedactSecrets(R"({"echo":"s3cr3t-\"value\"/x"})"), R"({"echo":"***"})");
  // Other forms (percent-encoded in a URL) are registered as values of their own
  // (TemplateEnvironment does); unregistered, they stay.
  EXPECT_EQ(RedactSecrets("q=s3cr3t-%22value%22%2Fx"), "q=s3cr3t-%22value%22%2Fx");
  RegisterSecretValue("abc");  // too short to tell apart: not registered
  EXPECT_EQ(RedactSecrets("abc"), "abc");
}

}  // namespace
}  // namespace waystone
