// Bearer tokens from the OAuth2 client credentials grant (RFC 6749 §4.4), fetched
// once per credentials and shared by every request that needs one.

#include <algorithm>
#include <cctype>
#include <future>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/base64.h"
#include "base/mutex.h"
#include "base/redact.h"
#include "base/sha256.h"
#include "connectors/http/http_client.h"
#include "model/template.h"

namespace waystone {
namespace {

using Json = nlohmann::json;

// A token is renewed this long before it expires (at most a tenth of its life), so
// that no request leaves with one that runs out on its way.
constexpr Millis kRenewAhead = 30'000;
// The life of a token whose answer gave no expires_in (RFC 6749 §5.1 recommends it).
constexpr Millis kDefaultLifetime = 300'000;

bool IEquals(std::string_view a, std::string_view b) {
  return std::equal(a.begin(), a.end(), b.begin(), b.end(), [](char x, char y) {
    return std::tolower(static_cast<unsigned char>(x)) ==
           std::tolower(static_cast<unsigned char>(y));
  });
}

// What a token request came to: a token, or the answer to give the request that
// waited for it (it was not sent).
struct TokenResult {
  std::string token;  // empty: failed
  Millis lifetime = 0;
  HttpResponse failure;
};

using Waiter = absl::AnyInvocable<void(const TokenResult&) &&>;

// The token of one set of credentials, and the requests waiting for the next one.
struct TokenSlot {
  Mutex mu;
  std::string token ABSL_GUARDED_BY(mu);
  Millis renew_at ABSL_GUARDED_BY(mu) = 0;
  bool fetching ABSL_GUARDED_BY(mu) = false;
  std::vector<Waiter> waiters ABSL_GUARDED_BY(mu);
};

// A request that will not be sent, with `why` (which names the target).
HttpResponse NotSent(std::string why, bool refused) {
  HttpResponse response;
  response.outcome.kind = refused ? CallOutcome::Kind::kInvalid : CallOutcome::Kind::kNotSent;
  response.outcome.identity_refused = refused;
  response.error = std::move(why);
  return response;
}

// The "error (error_description)" of a token endpoint's error answer (RFC 6749 §5.2),
// or its status.
std::string TokenError(const HttpResponse& answer) {
  std::string text = "HTTP " + std::to_string(answer.outcome.status);
  const Json body = Json::parse(answer.body, nullptr, false);
  if (body.is_object() && body.contains("error") && body["error"].is_string()) {
    text += " " + body["error"].get<std::string>();
    if (body.contains("error_description") && body["error_description"].is_string()) {
      text += " (" + body["error_description"].get<std::string>().substr(0, 200) + ")";
    }
  }
  return text;
}

// Reads a token endpoint's answer.
TokenResult ReadToken(const OAuth2Client& client, const HttpResponse& answer) {
  const std::string who = "target '" + client.target + "': token request to " + client.token_url;
  TokenResult result;
  if (answer.outcome.kind != CallOutcome::Kind::kResponse) {
    result.failure = NotSent(who + " failed: " + answer.error, answer.outcome.identity_refused);
    return result;
  }
  const int status = answer.outcome.status;
  if (status == 400 || status == 401 || status == 403) {
    result.failure = NotSent(who + " refused the client credentials: " + TokenError(answer),
                             /*refused=*/true);
    return result;
  }
  if (status < 200 || status > 299) {
    result.failure = NotSent(who + " failed: " + TokenError(answer), false);
    result.failure.outcome.retry_after = answer.outcome.retry_after;
    return result;
  }
  const Json body = Json::parse(answer.body, nullptr, false);
  const bool has_token = body.is_object() && body.contains("access_token") &&
                         body["access_token"].is_string() &&
                         !body["access_token"].get<std::string>().empty();
  if (!has_token) {
    result.failure = NotSent(who + " answered without an access_token", false);
    return result;
  }
  if (!body.contains("token_type") || !body["token_type"].is_string() ||
      !IEquals(body["token_type"].get<std::string>(), "bearer")) {
    result.failure = NotSent(who + " answered a token that is not of type Bearer", true);
    return result;
  }
  result.token = body["access_token"].get<std::string>();
  // RFC 6750 §2.1 b64token: nothing that could end or extend a header line.
  for (const unsigned char c : result.token) {
    if (std::isalnum(c) == 0 &&
        std::string_view("-._~+/=").find(static_cast<char>(c)) == std::string_view::npos) {
      result.token.clear();
      result.failure = NotSent(who +
                                   " answered an access_token with characters a bearer token "
                                   "may not have",
                               true);
      return result;
    }
  }
  // Sent on every call until renewed: a target that echoes it (an error quoting the
  // request) must not get it stored or shown to viewers.
  RegisterSentCredential(result.token);
  result.lifetime = kDefaultLifetime;
  if (body.contains("expires_in")) {
    const Json& expires = body["expires_in"];
    double seconds = -1;
    if (expires.is_number()) {
      seconds = expires.get<double>();
    } else if (expires.is_string()) {  // some servers quote it
      seconds = std::atof(expires.get<std::string>().c_str());
    }
    if (seconds > 0) result.lifetime = static_cast<Millis>(std::min(seconds, 86'400.0) * 1000);
  }
  return result;
}

class OAuth2HttpClient final : public HttpClient {
 public:
  OAuth2HttpClient(HttpClient* inner, const Clock* clock) : inner_(inner), clock_(clock) {}

  HttpResponse Send(const HttpRequest& request) override {
    if (request.oauth2->token_url.empty()) return inner_->Send(request);
    std::promise<HttpResponse> answered;
    std::future<HttpResponse> answer = answered.get_future();
    SendAsync(request,
              [&answered](HttpResponse response) { answered.set_value(std::move(response)); });
    return answer.get();
  }

  void SendAsync(HttpRequest request, HttpDone done) override {
    if (request.oauth2->token_url.empty()) {
      return inner_->SendAsync(std::move(request), std::move(done));
    }
    Authorized(std::move(request), std::move(done), /*again=*/false);
  }

 private:
  // Sends `request` with its credentials' token; on a 401, once `again` with a new one.
  void Authorized(HttpRequest request, HttpDone done, bool again) {
    std::shared_ptr<TokenSlot> shared = SlotOf(*request.oauth2);
    const OAuth2Client client = *request.oauth2;
    const Millis timeout = request.timeout;
    // The waiter is kept in the slot: it holds the slot by plain pointer (slots live
    // as long as this client), never by shared_ptr, which would make a cycle.
    WithToken(shared, client, timeout,
              [this, slot = shared.get(), again, request = std::move(request),
               done = std::move(done)](const TokenResult& result) mutable {
                if (result.token.empty()) return std::move(done)(result.failure);
                HttpRequest sent = request;
                std::erase_if(sent.headers, [](const auto& header) {
                  return IEquals(header.first, "authorization");
                });
                sent.headers.emplace_back("Authorization", "Bearer " + result.token);
                inner_->SendAsync(
                    std::move(sent),
                    [this, slot, again, token = result.token, request = std::move(request),
                     done = std::move(done)](HttpResponse response) mutable {
                      const bool expired = response.outcome.kind == CallOutcome::Kind::kResponse &&
                                           response.outcome.status == 401;
                      response.token_renewed = again;
                      if (expired && again) {
                        // A fresh token refused as well: the credentials' rights (scope,
                        // audience), not a business refusal.
                        response.outcome.identity_refused = true;
                        response.error = "target '" + request.oauth2->target +
                                         "' refused a newly issued token (401)";
                      }
                      if (!expired || again) return std::move(done)(std::move(response));
                      Forget(*slot, token);
                      Authorized(std::move(request), std::move(done), /*again=*/true);
                    });
              });
  }

  // The slot of `client`'s credentials (a changed secret or scope is another slot).
  std::shared_ptr<TokenSlot> SlotOf(const OAuth2Client& client) {
    std::string key = client.token_url;
    for (const std::string* part : {&client.client_id, &client.scope, &client.client_secret}) {
      key += '\n';
      key += *part;
    }
    key = Sha256Hex(key);  // the secret is not kept as a map key for the process's life
    MutexLock lock(mu_);
    std::shared_ptr<TokenSlot>& slot = slots_[key];
    if (slot == nullptr) slot = std::make_shared<TokenSlot>();
    return slot;
  }

  // Calls `waiter` with the slot's token: at once when it has a fresh one, otherwise
  // when the token request under way (started here if none is) is answered.
  void WithToken(const std::shared_ptr<TokenSlot>& slot, const OAuth2Client& client, Millis timeout,
                 Waiter waiter) {
    TokenResult ready;
    bool fetch = false;
    {
      MutexLock lock(slot->mu);
      if (!slot->token.empty() && clock_->NowMillis() < slot->renew_at) {
        ready.token = slot->token;
      } else {
        slot->waiters.push_back(std::move(waiter));
        fetch = !slot->fetching;
        slot->fetching = true;
      }
    }
    if (!ready.token.empty()) return std::move(waiter)(ready);
    if (fetch) Fetch(slot, client, timeout);
  }

  void Fetch(const std::shared_ptr<TokenSlot>& slot, const OAuth2Client& client, Millis timeout) {
    HttpRequest ask;
    ask.method = "POST";
    ask.url = client.token_url;
    ask.timeout = timeout;
    ask.tls = client.tls;
    // RFC 6749 §2.3.1: each part form-encoded, then Basic. Both forms are the client
    // secret too: a token endpoint that echoes the header must not get it stored.
    const std::string pair = FormEncode(client.client_id) + ":" + FormEncode(client.client_secret);
    const std::string basic = Base64Encode(pair);
    RegisterSecretValue(pair);
    RegisterSecretValue(basic);
    ask.headers = {
        {"Content-Type", "application/x-www-form-urlencoded"},
        {"Accept", "application/json"},
        {"Authorization", "Basic " + basic},
    };
    ask.body = "grant_type=client_credentials";
    if (!client.scope.empty()) ask.body += "&scope=" + FormEncode(client.scope);
    const Millis asked_at = clock_->NowMillis();
    inner_->SendAsync(std::move(ask), [slot, client, asked_at](HttpResponse answer) {
      const TokenResult result = ReadToken(client, answer);
      std::vector<Waiter> waiters;
      {
        MutexLock lock(slot->mu);
        slot->fetching = false;
        if (!result.token.empty()) {
          slot->token = result.token;
          slot->renew_at = asked_at + result.lifetime - std::min(kRenewAhead, result.lifetime / 10);
        }
        waiters.swap(slot->waiters);
      }
      for (Waiter& waiter : waiters) std::move(waiter)(result);
    });
  }

  // Drops `token` from `slot` unless a newer one replaced it already.
  static void Forget(TokenSlot& slot, const std::string& token) {
    MutexLock lock(slot.mu);
    if (slot.token == token) slot.token.clear();
  }

  HttpClient* inner_;
  const Clock* clock_;
  Mutex mu_;
  std::map<std::string, std::shared_ptr<TokenSlot>> slots_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

std::unique_ptr<HttpClient> NewOAuth2HttpClient(HttpClient* inner, const Clock* clock) {
  return std::make_unique<OAuth2HttpClient>(inner, clock);
}

}  // namespace waystone
