#include "store/business_statement.h"

#include <nlohmann/json.hpp>

#include "store/marked_status.h"

namespace waystone {
namespace {

constexpr char kFailed[] = "waystone/statement-failed";

absl::Status Failed(const std::string& message) {
  return MarkedStatus(absl::StatusCode::kInvalidArgument, message, kFailed);
}

}  // namespace

absl::Status StatementFailure(const std::string& message) { return Failed(message); }

absl::Status StatementTrouble(const absl::Status& cause) {
  return absl::UnavailableError(cause.message());
}

bool IsStatementFailure(const absl::Status& status) {
  return HasMark(status, absl::StatusCode::kInvalidArgument, kFailed);
}

absl::Status StatementRows::StartRow() {
  CloseRow();
  if (count_ == kMaxStatementRows) {
    return Failed("the statement returned more than " + std::to_string(kMaxStatementRows) +
                  " rows; a sql step's result is kept with its checkpoint (add a LIMIT, or "
                  "RETURNING only what later steps read)");
  }
  ++count_;
  row_ = "{";
  return absl::OkStatus();
}

void StatementRows::Add(std::string_view column, Type type, std::string_view text) {
  if (row_.size() > 1) row_ += ',';
  row_ += nlohmann::json(std::string(column))
              .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  row_ += ':';
  nlohmann::json value;
  switch (type) {
    case Type::kNull:
      break;
    case Type::kInteger:
    case Type::kReal:
    case Type::kJson:
      value = nlohmann::json::parse(text, nullptr, false);
      if (value.is_discarded()) value = std::string(text);  // NaN, a huge numeric: as text
      break;
    case Type::kDecimal: {
      int digits = 0;
      bool leading = true;
      for (char c : text) {
        if (c == 'e' || c == 'E') break;
        if (c < '0' || c > '9') continue;
        if (leading && c == '0') continue;
        leading = false;
        ++digits;
      }
      value = digits <= 15 ? nlohmann::json::parse(text, nullptr, false) : nlohmann::json();
      if (digits > 15 || value.is_discarded()) value = std::string(text);  // NaN, 20 digits
      break;
    }
    case Type::kText:
      value = std::string(text);
      break;
    case Type::kBoolean:
      value = text == "t" || text == "true" || text == "1";
      break;
  }
  row_ += value.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

void StatementRows::CloseRow() {
  if (row_.empty()) return;
  if (!rows_.empty()) rows_ += ',';
  rows_ += row_;
  rows_ += '}';
  row_.clear();
}

absl::Status StatementRows::Finish(int64_t count, std::string* json) {
  CloseRow();
  *json = "{\"rows\":[" + rows_ + "],\"count\":" + std::to_string(count) + "}";
  if (json->size() > kMaxStatementResultBytes) {
    return Failed("the statement's result is " + std::to_string(json->size()) +
                  " bytes, more than a sql step keeps (" +
                  std::to_string(kMaxStatementResultBytes) + ")");
  }
  return absl::OkStatus();
}

}  // namespace waystone
