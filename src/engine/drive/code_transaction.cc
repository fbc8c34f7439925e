#include "engine/drive/code_transaction.h"

#include <algorithm>
#include <map>
#include <vector>

#include "model/sql_statement.h"
#include "store/business_statement.h"

namespace waystone {

class TransactionWork::Session final : public CodeTransaction {
 public:
  Session(StatementRunner& sql, const TransactionWork& work) : sql_(sql), work_(work) {}

  absl::StatusOr<std::string> Execute(const std::string& text,
                                      const std::map<std::string, SqlParam>& params) override {
    auto parsed = ParseSqlStatement(text);
    if (!parsed.ok()) return parsed.status();
    for (const std::string& word : parsed->identifiers) {
      if (IsWaystoneTable(word)) {
        return absl::InvalidArgumentError("statement names '" + word +
                                          "', one of Waystone's own tables");
      }
    }
    if (work_.tenant_scoped_ && !parsed->unscoped.empty()) {
      return absl::InvalidArgumentError("statement is not scoped to its tenant: " +
                                        parsed->unscoped);
    }
    if (params.contains(std::string(kTenantParam))) {
      return absl::InvalidArgumentError(
          "':tenant' is bound by Waystone to the instance's tenant; pass no value for it");
    }
    BusinessStatement statement;
    statement.step_index = work_.index_;
    statement.sqlite = parsed->sqlite;
    statement.postgres = parsed->postgres;
    for (const std::string& name : parsed->names) {
      if (name == kTenantParam) {
        statement.values.push_back({SqlParam::Kind::kText, work_.instance_.tenant});
        continue;
      }
      auto value = params.find(name);
      if (value == params.end()) {
        return absl::InvalidArgumentError("statement parameter ':" + name + "' has no value");
      }
      statement.values.push_back(value->second);
    }
    if (params.size() != parsed->names.size()) {
      for (const auto& [name, value] : params) {
        if (std::find(parsed->names.begin(), parsed->names.end(), name) == parsed->names.end()) {
          return absl::InvalidArgumentError("value for ':" + name +
                                            "', which the statement does not use");
        }
      }
    }
    return sql_.Run(statement);
  }

  void Emit(const std::string& type, const std::string& payload_json) override {
    EventRecord event;
    event.event_id = work_.random_.TimeOrderedHex(work_.now_);
    event.instance_id = work_.instance_.id;
    event.tenant = work_.instance_.tenant;
    event.type = type;
    event.payload_json = payload_json;
    event.created_at = work_.now_;
    events.push_back(std::move(event));
  }

  std::vector<EventRecord> events;

 private:
  StatementRunner& sql_;
  const TransactionWork& work_;
};

absl::StatusOr<BusinessWorkResult> TransactionWork::Run(StatementRunner& sql) const {
  Session session(sql, *this);
  auto result = fn_(session);
  if (!result.ok()) return result.status();
  BusinessWorkResult done{*result, std::move(session.events)};
  MutexLock lock(mu_);
  last_result_ = done.result_json;
  return done;
}

}  // namespace waystone
