// The HTTP front's edges, byte for byte, through the API's own screen and handlers
// (ApiServer::ServeBytesForTest runs the parser a served connection runs), on a
// real SQLite store. The hostile-client suite (tests/hostile) attacks a real
// `waystone serve` over sockets; this pins each refusal to its cause.

#include "http/http_front.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "base/clock.h"
#include "base/json_depth.h"
#include "base/random.h"
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
                   const std::string& extra_headers = "",
                   const std::string& content_type = "application/json") {
    return "POST " + target + " HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + token_ +
           "\r\nContent-Type: " + content_type + "\r\n" + extra_headers +
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
    EXPECT_EQ(StatusOf(Post(std::string("/v1/alerts/1/acknowledge?") + query, R"({"reason":"r"})")),
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
  // Each body is otherwise valid: only its depth can refuse it.
  EXPECT_EQ(StatusOf(Post("/v1/instances", deep_input)), 400);
  EXPECT_EQ(StatusOf(Post(
                "/v1/instances/nobody/confirm?dry_run=true",
                R"({"reason":"r","step":"create","happened":true,"response":{"x":)" + deep + "}}")),
            400);
  const std::string event = R"({"specversion":"1.0","id":"1","source":"s",)"
                            R"("type":"com.example.order","data":{"ref":"d","x":)";
  const std::string structured = "application/cloudevents+json";
  const std::string answer =
      server_->ServeBytesForTest(Post("/v1/events", event + deep + "}}", "", structured));
  EXPECT_TRUE(answer.starts_with("HTTP/1.1 400")) << answer;
  EXPECT_NE(answer.find("deeper than 64 levels"), std::string::npos) << answer;
  // The same, shallow, is served: the depth was the only fault.
  EXPECT_EQ(StatusOf(Post("/v1/events", event + "[[1]]}}", "", structured)), 200);
  EXPECT_EQ(Instances(), 1u);
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

// A real connection, not ServeBytes: the strand, the pool, keep-alive, 100-continue,
// HEAD and the connection limit are the served code's own.
class Socket {
 public:
  // From 127.0.0.1, or from `from` (another loopback address: another client).
  explicit Socket(int port, const char* from = nullptr) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    if (from != nullptr) {
      sockaddr_in source{};
      source.sin_family = AF_INET;
      ::inet_pton(AF_INET, from, &source.sin_addr);
      ::bind(fd_, reinterpret_cast<sockaddr*>(&source), sizeof(source));
    }
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    connected_ = ::connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
    timeval timeout{5, 0};
    ::setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  }
  ~Socket() { ::close(fd_); }
  bool connected() const { return connected_; }
  void Send(const std::string& bytes) {
    ASSERT_EQ(::send(fd_, bytes.data(), bytes.size(), 0), static_cast<ssize_t>(bytes.size()));
  }
  // Whether the server closed the connection within `millis` (it sent nothing else).
  bool ClosedWithin(int millis) {
    pollfd ready{fd_, POLLIN, 0};
    if (::poll(&ready, 1, millis) != 1) return false;
    char byte;
    return ::recv(fd_, &byte, 1, MSG_DONTWAIT) == 0;
  }
  // Reads until `needle` arrived `times` times (or the peer closed, or 5 s passed).
  std::string ReadUntil(const std::string& needle, int times = 1) {
    auto count = [&] {
      int n = 0;
      for (size_t at = got_.find(needle); at != std::string::npos; at = got_.find(needle, at + 1))
        ++n;
      return n;
    };
    while (count() < times) {
      char buffer[4096];
      const ssize_t n = ::recv(fd_, buffer, sizeof(buffer), 0);
      if (n <= 0) break;
      got_.append(buffer, static_cast<size_t>(n));
    }
    return got_;
  }

 private:
  int fd_ = -1;
  bool connected_ = false;
  std::string got_;
};

TEST_F(HttpFrontTest, AServedConnectionKeepsAliveContinuesAndAnswersHead) {
  Socket client(server_->port());
  ASSERT_TRUE(client.connected());
  client.Send("GET /healthz HTTP/1.1\r\nHost: x\r\n\r\nHEAD /healthz HTTP/1.1\r\nHost: x\r\n\r\n");
  std::string got = client.ReadUntil("\r\n\r\n", 2);  // both heads
  // Deliberate: time for a server that (wrongly) closes after a HEAD to do so.
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  client.Send("GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n");  // still alive after HEAD
  got = client.ReadUntil("\r\n\r\n", 3);
  EXPECT_EQ(got.find("HTTP/1.1 200"), 0u) << got;
  const size_t second = got.find("HTTP/1.1 200", 5);
  ASSERT_NE(second, std::string::npos) << got;
  const size_t third = got.find("HTTP/1.1 200", second + 5);
  ASSERT_NE(third, std::string::npos) << got;
  // HEAD: the length of the GET's body, and no body before the next answer.
  const std::string head_answer = got.substr(second, third - second);
  EXPECT_NE(head_answer.find("Content-Length: 3"), std::string::npos) << got;
  EXPECT_TRUE(head_answer.ends_with("\r\n\r\n")) << "HEAD answered a body: " << got;
  // After a HEAD, a refused request on the same connection still gets its body.
  std::string many = "GET /healthz HTTP/1.1\r\nHost: x\r\n";
  for (int i = 0; i < 150; ++i) many += "X-H-" + std::to_string(i) + ": v\r\n";
  client.Send(many + "\r\n");
  got = client.ReadUntil("header-fields-too-large");
  EXPECT_NE(got.find("HTTP/1.1 431"), std::string::npos) << got;

  const std::string body = R"({"workflow":"wf","input":{"ref":"c1"}})";
  Socket expecting(server_->port());
  expecting.Send("POST /v1/instances HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + token_ +
                 "\r\nContent-Type: application/json\r\nExpect: 100-continue\r\n"
                 "Content-Length: " +
                 std::to_string(body.size()) + "\r\n\r\n");
  EXPECT_NE(expecting.ReadUntil("100 Continue\r\n\r\n").find("HTTP/1.1 100 Continue"),
            std::string::npos);
  expecting.Send(body);
  EXPECT_NE(expecting.ReadUntil("\"created\":true").find("HTTP/1.1 201"), std::string::npos);
  EXPECT_EQ(Instances(), 1u);
}

// What the front tells a handler about its connection (the simulator's lost
// responses need both): how many requests came on it before, and its socket.
TEST(HttpFrontConnectionTest, AHandlerKnowsItsConnection) {
  HttpFrontOptions options;
  options.listen = "127.0.0.1:0";
  auto front = HttpFront::Start(
      options, [](ServerRequest&, ServerResponse&) { return false; },
      [](const ServerRequest& req, ServerResponse& res) {
        sockaddr_in peer{};
        socklen_t length = sizeof(peer);
        const bool socket =
            req.socket_fd >= 0 &&
            ::getpeername(req.socket_fd, reinterpret_cast<sockaddr*>(&peer), &length) == 0;
        res.SetContent("earlier=" + std::to_string(req.earlier_requests) +
                           " peer=" + (socket ? std::to_string(ntohs(peer.sin_port)) : "-") + ";",
                       "text/plain");
      });
  ASSERT_TRUE(front.ok()) << front.status();
  Socket client((*front)->port());
  ASSERT_TRUE(client.connected());
  const std::string get = "GET /x HTTP/1.1\r\nHost: x\r\n\r\n";
  client.Send(get + get + get);
  const std::string got = client.ReadUntil(";", 3);
  EXPECT_NE(got.find("earlier=0 peer="), std::string::npos) << got;
  EXPECT_NE(got.find("earlier=1 peer="), std::string::npos) << got;
  EXPECT_NE(got.find("earlier=2 peer="), std::string::npos) << got;
  EXPECT_EQ(got.find("peer=-"), std::string::npos) << "no socket handed over: " << got;
  Socket fresh((*front)->port());
  fresh.Send(get);
  EXPECT_NE(fresh.ReadUntil(";").find("earlier=0 "), std::string::npos);
}

// Connections busy with a request, up to the limit: a new one may still ask /healthz;
// anything else it asks gets a whole 503 with Retry-After; past the few such, a
// new connection gets the 503 at once.
TEST_F(HttpFrontTest, ConnectionsBeyondTheLimitGetAWhole503ButTheHealthCheckIsAnswered) {
  ApiServerOptions api;
  api.listen = "127.0.0.1:0";
  api.max_connections = 2;
  auto small = ApiServer::Start(api, store_.get(), SystemClock::Get(), engine_.get());
  ASSERT_TRUE(small.ok()) << small.status();
  const int port = (*small)->port();
  // Each: a request, then the head of the next one under way (busy, not idle, from
  // the moment the first was read).
  const std::string busy = "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\nGET /healthz HTTP/1.1\r\n";
  Socket first(port);
  Socket second(port);
  first.Send(busy);
  second.Send(busy);
  ASSERT_NE(first.ReadUntil("ok\n").find("200"), std::string::npos);
  ASSERT_NE(second.ReadUntil("ok\n").find("200"), std::string::npos);
  Socket third(port);
  third.Send("GET /v1/me HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + token_ + "\r\n\r\n");
  const std::string refused = third.ReadUntil("\"}");
  ASSERT_EQ(refused.find("HTTP/1.1 503"), 0u) << refused;
  EXPECT_NE(refused.find("Retry-After: 1"), std::string::npos) << refused;
  const size_t body_at = refused.find("\r\n\r\n") + 4;
  const size_t length_at = refused.find("Content-Length: ") + 16;
  EXPECT_EQ(std::stoul(refused.substr(length_at)), refused.size() - body_at) << refused;
  Socket health(port);
  health.Send("GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_EQ(health.ReadUntil("ok\n").find("HTTP/1.1 200"), 0u);
  // 32 connections past the limit that ask nothing yet hold every place there is: the
  // next is refused before it asks, and they are still answered the health check.
  std::vector<std::unique_ptr<Socket>> waiting;
  for (int i = 0; i < 32; ++i) waiting.push_back(std::make_unique<Socket>(port));
  Socket late(port);
  EXPECT_EQ(late.ReadUntil("\"}").find("HTTP/1.1 503"), 0u) << "not refused at once";
  waiting.front()->Send("GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_EQ(waiting.front()->ReadUntil("ok\n").find("HTTP/1.1 200"), 0u);
}

// Issue 45, high 4: a thousand idle connections from one address made /healthz and
// /v1/me answer 503. An idle connection (nothing sent of a request) gives its place
// to a new one; busy connections of one address are capped, and other addresses
// are not kept out by them.
TEST_F(HttpFrontTest, IdleConnectionsGiveTheirPlaceAndOneAddressCannotFillTheServer) {
  ApiServerOptions api;
  api.listen = "127.0.0.1:0";
  api.max_connections = 16;
  api.max_connections_per_client = 4;
  auto small = ApiServer::Start(api, store_.get(), SystemClock::Get(), engine_.get());
  ASSERT_TRUE(small.ok()) << small.status();
  const int port = (*small)->port();
  std::vector<std::unique_ptr<Socket>> idle;
  for (int i = 0; i < 40; ++i) idle.push_back(std::make_unique<Socket>(port));
  const std::string me =
      "GET /v1/me HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + token_ + "\r\n\r\n";
  Socket fresh(port);
  fresh.Send(me);
  EXPECT_EQ(fresh.ReadUntil("\"}").find("HTTP/1.1 200"), 0u);
  // All but the newest three idle ones (the address's four places: they and `fresh`)
  // were closed to make room.
  int closed = 0;
  for (auto& socket : idle) closed += socket->ClosedWithin(closed < 37 ? 5000 : 0);
  EXPECT_EQ(closed, 37);

  // Four busy connections fill 127.0.0.1's places; a fifth asks past them, and
  // 127.0.0.2 is served as if nothing happened.
  const std::string busy = "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\nGET /healthz HTTP/1.1\r\n";
  std::vector<std::unique_ptr<Socket>> working;
  for (int i = 0; i < 4; ++i) {
    working.push_back(std::make_unique<Socket>(port));
    working.back()->Send(busy);
    ASSERT_NE(working.back()->ReadUntil("ok\n").find("200"), std::string::npos);
  }
  Socket fifth(port);
  fifth.Send(me);
  EXPECT_EQ(fifth.ReadUntil("\"}").find("HTTP/1.1 503"), 0u);
  Socket other(port, "127.0.0.2");
  ASSERT_TRUE(other.connected());
  other.Send(me);
  EXPECT_EQ(other.ReadUntil("\"}").find("HTTP/1.1 200"), 0u);
}

}  // namespace
}  // namespace waystone
