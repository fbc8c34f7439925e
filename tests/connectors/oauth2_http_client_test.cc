// NewOAuth2HttpClient against a client whose requests the test answers by hand, in
// any order: one token request however many callers, the token kept until shortly
// before it expires, a 401 renewing it without reaching the caller, and what a
// caller sees when no token can be had.

#include <deque>
#include <map>
#include <mutex>
#include <optional>

#include <gtest/gtest.h>

#include "base/redact.h"
#include "connectors/http/http_client.h"

namespace waystone {
namespace {

// Holds every request until the test answers it.
class HeldClient final : public HttpClient {
 public:
  HttpResponse Send(const HttpRequest&) override {
    ADD_FAILURE() << "the OAuth2 client sends asynchronously";
    return {};
  }
  void SendAsync(HttpRequest request, HttpDone done) override {
    std::lock_guard lock(mu_);
    held_.push_back({std::move(request), std::move(done)});
  }

  // How many held requests go to a URL containing `part`.
  int Waiting(const std::string& part) {
    std::lock_guard lock(mu_);
    int count = 0;
    for (const auto& h : held_) count += h.request.url.find(part) != std::string::npos;
    return count;
  }

  // Answers the oldest held request to a URL containing `part` with `status` and
  // `body` (status 0: the connection broke before it was sent); returns it.
  HttpRequest Answer(const std::string& part, int status, const std::string& body) {
    std::optional<Held> held;
    {
      std::lock_guard lock(mu_);
      for (auto it = held_.begin(); it != held_.end(); ++it) {
        if (it->request.url.find(part) == std::string::npos) continue;
        held.emplace(std::move(*it));
        held_.erase(it);
        break;
      }
    }
    if (!held) {
      ADD_FAILURE() << "no request to " << part << " is waiting";
      return {};
    }
    HttpResponse response;
    if (status == 0) {
      response.outcome.kind = CallOutcome::Kind::kNotSent;
      response.error = "Couldn't connect to server";
    } else {
      response.outcome.kind = CallOutcome::Kind::kResponse;
      response.outcome.status = status;
      response.outcome.sent = true;
      response.body = body;
    }
    std::move(held->done)(std::move(response));
    return held->request;
  }

 private:
  struct Held {
    HttpRequest request;
    HttpDone done;
  };
  std::mutex mu_;
  std::deque<Held> held_;
};

std::string HeaderOf(const HttpRequest& request, const std::string& name) {
  for (const auto& [key, value] : request.headers) {
    if (key == name) return value;
  }
  return "";
}

std::string Token(const std::string& token, int expires_in) {
  return R"({"access_token":")" + token + R"(","token_type":"Bearer","expires_in":)" +
         std::to_string(expires_in) + "}";
}

class OAuth2ClientTest : public ::testing::Test {
 protected:
  // A business request to the ERP under target "erp".
  HttpRequest Order(const std::string& ref) {
    HttpRequest request{"POST",
                        "https://erp.test/orders",
                        {{"Idempotency-Key", ref}},
                        R"({"ref":")" + ref + "\"}",
                        5000};
    request.oauth2 = {
        "erp", "https://login.test/oauth/token", "waystone worker", kSecret, "orders.write", {}};
    return request;
  }

  // Sends `request`; its answer lands in answers_[slot].
  void Send(HttpRequest request, int slot) {
    client_->SendAsync(std::move(request), [this, slot](HttpResponse response) {
      std::lock_guard lock(mu_);
      answers_[slot] = std::move(response);
    });
  }

  std::optional<HttpResponse> AnswerOf(int slot) {
    std::lock_guard lock(mu_);
    auto it = answers_.find(slot);
    if (it == answers_.end()) return std::nullopt;
    return it->second;
  }

  static constexpr const char* kSecret = "s3cr3t+/:é";
  FakeClock clock_{1'000'000};
  HeldClient inner_;
  std::unique_ptr<HttpClient> client_ = NewOAuth2HttpClient(&inner_, &clock_);
  std::mutex mu_;
  std::map<int, HttpResponse> answers_;
};

TEST_F(OAuth2ClientTest, RequestsWaitingForATokenShareOneTokenRequest) {
  for (int i = 0; i < 64; ++i) Send(Order("R" + std::to_string(i)), i);
  ASSERT_EQ(inner_.Waiting("/oauth/token"), 1);
  EXPECT_EQ(inner_.Waiting("/orders"), 0) << "nothing is sent before the token is there";

  const HttpRequest asked = inner_.Answer("/oauth/token", 200, Token("T1", 3600));
  EXPECT_EQ(asked.method, "POST");
  EXPECT_EQ(asked.body, "grant_type=client_credentials&scope=orders.write");
  EXPECT_EQ(HeaderOf(asked, "Content-Type"), "application/x-www-form-urlencoded");
  // RFC 6749 §2.3.1: "waystone worker" and "s3cr3t+/:é" form-encoded, then Basic.
  EXPECT_EQ(HeaderOf(asked, "Authorization"),
            "Basic d2F5c3RvbmUrd29ya2VyOnMzY3IzdCUyQiUyRiUzQSVDMyVBOQ==");

  ASSERT_EQ(inner_.Waiting("/orders"), 64);
  for (int i = 0; i < 64; ++i) {
    const HttpRequest sent = inner_.Answer("/orders", 201, R"({"id":"ORD"})");
    EXPECT_EQ(HeaderOf(sent, "Authorization"), "Bearer T1");
  }
  for (int i = 0; i < 64; ++i) {
    auto answer = AnswerOf(i);
    ASSERT_TRUE(answer.has_value()) << i;
    EXPECT_EQ(answer->outcome.status, 201);
  }
  EXPECT_EQ(inner_.Waiting("/oauth/token"), 0);
}

// Issue 45, item 6: an access token a target echoed, and a token endpoint's echo of
// the Basic header (id:secret), were stored and shown. Every credential the client
// sends is redacted like a configured secret.
TEST_F(OAuth2ClientTest, EveryCredentialItSendsIsRedactedWhereverItIsEchoed) {
  Send(Order("R1"), 1);
  const HttpRequest asked =
      inner_.Answer("/oauth/token", 200, Token("echoedAccessToken-9f3a7c", 3600));
  const std::string basic = HeaderOf(asked, "Authorization").substr(6);
  inner_.Answer("/orders", 401, "{}");  // refused: renewed once, sent again
  EXPECT_EQ(RedactSecrets("error: bad token echoedAccessToken-9f3a7c"), "error: bad token ***");
  EXPECT_EQ(RedactSecrets("{\"got\":\"Basic " + basic + "\"}"), "{\"got\":\"Basic ***\"}");
  EXPECT_EQ(RedactSecrets("client waystone+worker:s3cr3t%2B%2F%3A%C3%A9"), "client ***");
  // Renewed for months, only the newest credentials are kept: older ones are
  // forgotten, so that redaction never slows down.
  for (int i = 0; i < 70; ++i) RegisterSentCredential("rotated-token-" + std::to_string(i));
  EXPECT_EQ(RedactSecrets("rotated-token-69"), "***");
  EXPECT_EQ(RedactSecrets("rotated-token-0"), "rotated-token-0");
}

TEST_F(OAuth2ClientTest, ATokenIsKeptUntilShortlyBeforeItExpires) {
  Send(Order("A"), 0);
  inner_.Answer("/oauth/token", 200, Token("T1", 100));  // renewed 10 s ahead
  inner_.Answer("/orders", 201, "{}");

  clock_.Advance(89'000);
  Send(Order("B"), 1);
  EXPECT_EQ(inner_.Waiting("/oauth/token"), 0);
  EXPECT_EQ(HeaderOf(inner_.Answer("/orders", 201, "{}"), "Authorization"), "Bearer T1");

  clock_.Advance(2'000);  // 91 s: within the last tenth of its life
  Send(Order("C"), 2);
  ASSERT_EQ(inner_.Waiting("/oauth/token"), 1);
  inner_.Answer("/oauth/token", 200, Token("T2", 100));
  EXPECT_EQ(HeaderOf(inner_.Answer("/orders", 201, "{}"), "Authorization"), "Bearer T2");
}

TEST_F(OAuth2ClientTest, A401RenewsTheTokenAndSendsOnceMoreWithoutTheCallerSeeingIt) {
  Send(Order("A"), 0);
  inner_.Answer("/oauth/token", 200, Token("T1", 3600));
  inner_.Answer("/orders", 401, R"({"error":"invalid_token"})");  // revoked at the server
  EXPECT_FALSE(AnswerOf(0).has_value());
  ASSERT_EQ(inner_.Waiting("/oauth/token"), 1);
  inner_.Answer("/oauth/token", 200, Token("T2", 3600));
  const HttpRequest again = inner_.Answer("/orders", 201, R"({"id":"ORD-1"})");
  EXPECT_EQ(HeaderOf(again, "Authorization"), "Bearer T2");
  EXPECT_EQ(HeaderOf(again, "Idempotency-Key"), "A");
  ASSERT_TRUE(AnswerOf(0).has_value());
  EXPECT_EQ(AnswerOf(0)->outcome.status, 201);
  EXPECT_TRUE(AnswerOf(0)->token_renewed) << "the engine records the refused send";
}

TEST_F(OAuth2ClientTest, ManyRequestsRefusedWithTheSameTokenRenewItOnce) {
  Send(Order("A"), 0);
  inner_.Answer("/oauth/token", 200, Token("T1", 3600));
  inner_.Answer("/orders", 201, "{}");
  for (int i = 1; i <= 8; ++i) Send(Order("R" + std::to_string(i)), i);
  ASSERT_EQ(inner_.Waiting("/orders"), 8);
  for (int i = 1; i <= 8; ++i) inner_.Answer("/orders", 401, "{}");
  EXPECT_EQ(inner_.Waiting("/oauth/token"), 1);
  inner_.Answer("/oauth/token", 200, Token("T2", 3600));
  ASSERT_EQ(inner_.Waiting("/orders"), 8);
  for (int i = 1; i <= 8; ++i) {
    EXPECT_EQ(HeaderOf(inner_.Answer("/orders", 201, "{}"), "Authorization"), "Bearer T2");
  }
  EXPECT_EQ(inner_.Waiting("/oauth/token"), 0);
}

TEST_F(OAuth2ClientTest, ASecond401ReachesTheCaller) {
  Send(Order("A"), 0);
  inner_.Answer("/oauth/token", 200, Token("T1", 3600));
  inner_.Answer("/orders", 401, "{}");
  inner_.Answer("/oauth/token", 200, Token("T2", 3600));
  inner_.Answer("/orders", 401, "{}");
  ASSERT_TRUE(AnswerOf(0).has_value());
  EXPECT_EQ(AnswerOf(0)->outcome.status, 401);
  EXPECT_TRUE(AnswerOf(0)->outcome.identity_refused) << "the credentials' rights, not business";
  EXPECT_NE(AnswerOf(0)->error.find("target 'erp' refused a newly issued token"),
            std::string::npos);
  EXPECT_EQ(inner_.Waiting("/"), 0) << "sent twice at most";
}

TEST_F(OAuth2ClientTest, RefusedCredentialsAreNotSentOnAndNameTheTarget) {
  Send(Order("A"), 0);
  Send(Order("B"), 1);
  inner_.Answer("/oauth/token", 401,
                R"({"error":"invalid_client","error_description":"Client authentication failed"})");
  EXPECT_EQ(inner_.Waiting("/orders"), 0);
  for (int slot : {0, 1}) {
    auto answer = AnswerOf(slot);
    ASSERT_TRUE(answer.has_value());
    EXPECT_EQ(answer->outcome.kind, CallOutcome::Kind::kInvalid);
    EXPECT_TRUE(answer->outcome.identity_refused);
    EXPECT_FALSE(answer->outcome.sent);
    EXPECT_NE(answer->error.find("target 'erp'"), std::string::npos) << answer->error;
    EXPECT_NE(answer->error.find("invalid_client"), std::string::npos) << answer->error;
    EXPECT_EQ(answer->error.find("s3cr3t"), std::string::npos) << answer->error;
    EXPECT_EQ(Classify(answer->outcome, {}), ErrorClass::kRejected);
  }
}

TEST_F(OAuth2ClientTest, AFailingTokenEndpointLeavesTheRequestUnsentAndIsAskedAgain) {
  Send(Order("A"), 0);
  inner_.Answer("/oauth/token", 503, "");
  ASSERT_TRUE(AnswerOf(0).has_value());
  EXPECT_EQ(AnswerOf(0)->outcome.kind, CallOutcome::Kind::kNotSent);
  EXPECT_EQ(Classify(AnswerOf(0)->outcome, {}), ErrorClass::kTransient);
  EXPECT_NE(AnswerOf(0)->error.find("HTTP 503"), std::string::npos);

  Send(Order("A"), 1);  // the retry: a failure is not kept
  inner_.Answer("/oauth/token", 0, "");
  ASSERT_TRUE(AnswerOf(1).has_value());
  EXPECT_EQ(Classify(AnswerOf(1)->outcome, {}), ErrorClass::kTransient);
  EXPECT_NE(AnswerOf(1)->error.find("Couldn't connect"), std::string::npos);

  Send(Order("A"), 2);
  inner_.Answer("/oauth/token", 200, R"({"access_token":"T3","token_type":"mac"})");
  ASSERT_TRUE(AnswerOf(2).has_value());
  EXPECT_TRUE(AnswerOf(2)->outcome.identity_refused) << "only Bearer tokens are understood";
  EXPECT_EQ(inner_.Waiting("/orders"), 0);
}

TEST_F(OAuth2ClientTest, RequestsWithoutCredentialsPassThroughUntouched) {
  HttpRequest plain{"GET", "https://erp.test/orders?ref=A", {}, "", 5000};
  Send(plain, 0);
  EXPECT_EQ(inner_.Waiting("/oauth/token"), 0);
  const HttpRequest sent = inner_.Answer("/orders", 200, "{}");
  EXPECT_EQ(HeaderOf(sent, "Authorization"), "");
  EXPECT_EQ(AnswerOf(0)->outcome.status, 200);
}

TEST_F(OAuth2ClientTest, ATokenThatCouldBreakAHeaderLineIsRefused) {
  Send(Order("A"), 0);
  inner_.Answer("/oauth/token", 200, Token("T1\\r\\nX-Injected: 1", 3600));
  ASSERT_TRUE(AnswerOf(0).has_value());
  EXPECT_TRUE(AnswerOf(0)->outcome.identity_refused);
  EXPECT_EQ(inner_.Waiting("/orders"), 0);
}

TEST_F(OAuth2ClientTest, AnotherSecretIsAnotherToken) {
  Send(Order("A"), 0);
  HttpRequest rotated = Order("B");
  rotated.oauth2.Mutable().client_secret = "rotated";
  Send(rotated, 1);
  EXPECT_EQ(inner_.Waiting("/oauth/token"), 2);
}

}  // namespace
}  // namespace waystone
