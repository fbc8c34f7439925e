// An order saga written in C++ (docs/cpp-api.md): read the customer from the CRM,
// create the order in the ERP (looked up before it is ever sent again, cancelled if
// a later step fails), record it in the program's own `orders` table in the
// transaction of the step's checkpoint, and send the customer a message (the target
// deduplicates by idempotency key). Its HTTP calls use libcurl directly: a workflow's
// steps are the program's own code.
//
//   order-saga DATABASE ERP_URL ORDER_ID AMOUNT [TO]
//
// starts (or finds) the order's instance, waits until it is at rest and prints
// "state", "reason" and "output" lines. SAGA_VERSION=2 runs the function with a
// patched message text (ctx.Patched); SAGA_VERSION=3 with a renamed step and no
// patch, which an instance recorded by version 1 refuses (definition_diverged).

#include <curl/curl.h>

#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>
#include <waystone/json_codec.h>
#include <waystone/waystone.h>

namespace api = waystone::api;
using Json = nlohmann::json;

struct Order {
  std::string id;
  int amount = 0;
  std::string to;
};
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(Order, id, amount, to)

struct Receipt {
  std::string erp_id;
  int64_t row = 0;
  std::string message_id;
};
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(Receipt, erp_id, row, message_id)

// One HTTP exchange and how the step reads its failure: refused before it acted
// (4xx: rejected; 503: transient) or without a known outcome (no whole answer, 5xx).
struct Answer {
  long status = 0;
  std::string body;
};

size_t Collect(char* data, size_t size, size_t n, void* into) {
  static_cast<std::string*>(into)->append(data, size * n);
  return size * n;
}

api::Result<Answer> Http(const std::string& method, const std::string& url, const std::string& body,
                         const std::string& key) {
  CURL* curl = curl_easy_init();
  if (curl == nullptr) return api::Status(api::Status::Code::kUnavailable, "curl_easy_init");
  Answer answer;
  curl_slist* headers = curl_slist_append(nullptr, "Content-Type: application/json");
  if (!key.empty()) headers = curl_slist_append(headers, ("Idempotency-Key: " + key).c_str());
  curl_easy_setopt(curl, CURLOPT_URL, url.c_str());
  curl_easy_setopt(curl, CURLOPT_CUSTOMREQUEST, method.c_str());
  if (method == "POST") curl_easy_setopt(curl, CURLOPT_POSTFIELDS, body.c_str());
  curl_easy_setopt(curl, CURLOPT_HTTPHEADER, headers);
  curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, Collect);
  curl_easy_setopt(curl, CURLOPT_WRITEDATA, &answer.body);
  curl_easy_setopt(curl, CURLOPT_TIMEOUT_MS, 5000L);
  curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
  const CURLcode sent = curl_easy_perform(curl);
  curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &answer.status);
  curl_slist_free_all(headers);
  curl_easy_cleanup(curl);
  if (sent == CURLE_COULDNT_CONNECT) {
    return api::Status(api::Status::Code::kUnavailable, "cannot connect to " + url);
  }
  if (sent != CURLE_OK) {  // it may have arrived and acted: unknown
    return api::Status(api::Status::Code::kDeadlineExceeded,
                       method + " " + url + ": " + curl_easy_strerror(sent));
  }
  if (answer.status == 503) return api::Status(api::Status::Code::kUnavailable, answer.body);
  if (answer.status >= 500) return api::Status(api::Status::Code::kDeadlineExceeded, answer.body);
  if (answer.status >= 400) {
    return api::Status(
        api::Status::Code::kFailedPrecondition,
        method + " " + url + ": " + std::to_string(answer.status) + " " + answer.body);
  }
  return answer;
}

api::Result<Json> Parsed(const api::Result<Answer>& answer) {
  if (!answer.ok()) return answer.status();
  Json body = Json::parse(answer->body, nullptr, false);
  if (body.is_discarded()) return api::Status(api::Status::Code::kDeadlineExceeded, "not JSON");
  return body;
}

api::Workflow<Order, Receipt> OrderSaga(const std::string& erp, int version) {
  return {
      "order-saga", [erp, version](api::Context& ctx, const Order& order) -> api::Result<Receipt> {
        const std::string ref = "shop:" + ctx.key();

        // The CRM read: a read does nothing, so it may simply run again.
        auto customer = ctx.Step<api::Json>("read-customer", [&]() -> api::Result<api::Json> {
          auto found = Parsed(Http("GET", erp + "/erp/orders?ref=crm:" + order.id, "", ""));
          if (!found.ok()) return found.status();
          return api::Json{found->dump()};
        });
        if (!customer.ok()) return customer.status();

        // The ERP order: not repeatable (the ERP makes a new order for every request),
        // so an unknown outcome is looked up by its reference before it is sent again.
        api::StepOptions<std::string> create;
        create.input = api::Encode(order);
        create.repeatable = false;
        create.retry = {4, std::chrono::milliseconds(50), std::chrono::milliseconds(200)};
        create.lookup = [&]() -> api::Result<std::optional<std::string>> {
          auto found = Parsed(Http("GET", erp + "/erp/orders?ref=" + ref, "", ""));
          if (!found.ok()) return found.status();
          for (const Json& item : (*found)["items"]) {
            if (item["ref"] == ref)
              return std::optional<std::string>(item["id"].get<std::string>());
          }
          return std::optional<std::string>();
        };
        // It runs after the function returned: it captures by value.
        create.compensate = [erp](api::Context& later, const std::string& erp_id) -> api::Status {
          auto cancelled = Http("POST", erp + "/erp/orders/" + erp_id + "/cancel", "{}",
                                later.idempotency_key());
          return cancelled.ok() ? api::Status() : cancelled.status();
        };
        auto erp_id = ctx.Step<std::string>(
            "create-order",
            [&]() -> api::Result<std::string> {
              Json body = {{"ref", ref}, {"amount", order.amount}};
              auto created =
                  Parsed(Http("POST", erp + "/erp/orders", body.dump(), ctx.idempotency_key()));
              if (!created.ok()) return created.status();
              return (*created)["id"].get<std::string>();
            },
            create);
        if (!erp_id.ok()) return erp_id.status();

        // The program's own row, in the transaction of the step's checkpoint.
        auto row =
            ctx.Transaction<int64_t>("record-order", [&](api::Tx& tx) -> api::Result<int64_t> {
              auto inserted = tx.Execute(
                  "INSERT INTO orders (order_key, erp_id, amount) VALUES (:key, :erp, :amount) "
                  "RETURNING id",
                  {{"key", order.id}, {"erp", *erp_id}, {"amount", order.amount}});
              if (!inserted.ok()) return inserted.status();
              const Json rows = Json::parse(*inserted);
              tx.Emit("shop.order.recorded", Json{{"order", order.id}, {"erp_id", *erp_id}}.dump());
              return rows["rows"][0]["id"].get<int64_t>();
            });
        if (!row.ok()) return row.status();

        // The message: the target keeps one per idempotency key, so it may run again.
        std::string text = "order " + *erp_id + " is local row " + std::to_string(*row);
        if (version >= 2) {
          auto patched = ctx.Patched("message-names-amount");
          if (!patched.ok()) return patched.status();
          if (*patched) text += " for " + std::to_string(order.amount);
        }
        const Json message = {{"to", order.to}, {"text", text}};
        api::StepOptions<std::string> notify;
        notify.input = message.dump();
        notify.retry = {4, std::chrono::milliseconds(50), std::chrono::milliseconds(200)};
        auto sent = ctx.Step<std::string>(
            version == 3 ? "notify-customer" : "notify",
            [&]() -> api::Result<std::string> {
              auto answer =
                  Parsed(Http("POST", erp + "/notify/messages",
                              order.to.empty() ? Json{{"text", text}}.dump() : message.dump(),
                              ctx.idempotency_key()));
              if (!answer.ok()) return answer.status();
              return (*answer)["id"].get<std::string>();
            },
            notify);
        if (!sent.ok()) {
          if (sent.status().code() == api::Status::Code::kAborted) return sent.status();
          // The order stands no more: the row says so, in its own transaction, before the
          // ERP order is cancelled by create-order's compensation.
          auto undone =
              ctx.Transaction<int64_t>("cancel-row", [&](api::Tx& tx) -> api::Result<int64_t> {
                auto updated = tx.Execute("UPDATE orders SET state = 'cancelled' WHERE id = :id",
                                          {{"id", *row}});
                if (!updated.ok()) return updated.status();
                return Json::parse(*updated)["count"].get<int64_t>();
              });
          if (!undone.ok()) return undone.status();
          return sent.status();
        }
        return Receipt{*erp_id, *row, *sent};
      }};
}

int main(int argc, char** argv) {
  if (argc < 5) {
    std::fprintf(stderr, "usage: %s DATABASE ERP_URL ORDER_ID AMOUNT [TO]\n", argv[0]);
    return 2;
  }
  curl_global_init(CURL_GLOBAL_DEFAULT);
  const char* version = std::getenv("SAGA_VERSION");
  const auto saga = OrderSaga(argv[2], version != nullptr ? std::atoi(version) : 1);

  api::EngineOptions options;
  options.database = argv[1];
  options.workers = 2;
  options.lease = std::chrono::seconds(5);
  auto engine = api::Engine::Open(options);
  if (!engine.ok()) return std::fprintf(stderr, "%s\n", engine.status().ToString().c_str()), 1;
  if (api::Status registered = (*engine)->Register(saga); !registered.ok()) {
    return std::fprintf(stderr, "%s\n", registered.ToString().c_str()), 1;
  }
  const Order order{argv[3], std::atoi(argv[4]), argc > 5 ? argv[5] : ""};
  auto instance = (*engine)->Start(saga, order.id, order);
  if (!instance.ok()) return std::fprintf(stderr, "%s\n", instance.status().ToString().c_str()), 1;
  auto outcome = (*instance)->Wait(std::chrono::seconds(60));
  if (!outcome.ok()) return std::fprintf(stderr, "%s\n", outcome.status().ToString().c_str()), 1;
  std::printf("state %s\nreason %s\noutput %s\n", api::ToString(outcome->state),
              outcome->reason.c_str(), outcome->output_json.c_str());
  auto receipt = api::Output<Receipt>(*outcome);
  if (receipt.ok())
    std::printf("erp %s row %lld\n", receipt->erp_id.c_str(), static_cast<long long>(receipt->row));
  return outcome->at_rest ? 0 : 3;
}
