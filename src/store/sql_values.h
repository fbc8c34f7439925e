#pragma once

// Store-internal: persisted enum values as SQL text, so that no number is typed by
// hand into a statement. Both dialects build their statements from these (once,
// into function-local statics), e.g.
//   absl::StrCat("UPDATE alerts SET state = ", SqlValue(AlertState::kResolved), ...)

#include <string>
#include <type_traits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "model/records.h"

namespace waystone {

// Returns the stored number of a persisted enum value ("3").
template <typename Enum>
requires std::is_enum_v<Enum> std::string SqlValue(Enum value) {
  return std::to_string(static_cast<int>(value));
}

// Returns the stored numbers of `values` as an SQL list: "(1, 3)".
template <typename Enum, typename... More>
std::string SqlList(Enum first, More... more) {
  std::string list = absl::StrCat("(", SqlValue(first));
  (absl::StrAppend(&list, ", ", SqlValue(more)), ...);
  list += ")";
  return list;
}

// Instances a worker drives: running or compensating.
inline std::string SqlRunnableStates() {
  return SqlList(InstanceState::kRunning, InstanceState::kCompensating);
}

// Where a reaper looks for leases of dead workers: the rows a worker holds a lease
// on for longer than one action, as conditions that each match a partial index of
// both dialects, so the look reads the work in flight, not every row ever kept.
// Instances a worker drives (instances_due), and those that need attention
// (instances_attention: a worker keeps its lease while a branch beside the failed
// step still has a call out); deliveries pending (deliveries_due). An operator's
// lease, held for one action on an instance in another state, is left to expire.
inline std::vector<std::string> SqlLeasedInstanceRows() {
  return {"state IN " + SqlRunnableStates(),
          absl::StrCat("state = ", SqlValue(InstanceState::kNeedsAttention))};
}
inline std::vector<std::string> SqlLeasedDeliveryRows() {
  return {absl::StrCat("state = ", SqlValue(DeliveryState::kPending))};
}
// The query for the owners of unexpired leases on the `rows` of `table` (fixed
// text, never input), each once, with `now` the dialect's parameter ("$1::bigint",
// "?1"): one SELECT per condition, each read through its partial index, joined by
// UNION.
inline std::string SqlLeaseOwners(const char* table, const std::vector<std::string>& rows,
                                  const char* now) {
  std::vector<std::string> selects;
  for (const std::string& condition : rows) {
    selects.push_back(absl::StrCat("SELECT DISTINCT lease_owner FROM ", table, " WHERE ", condition,
                                   " AND lease_expires_at > ", now, " AND lease_owner <> ''"));
  }
  return absl::StrJoin(selects, " UNION ");
}

// Instances that have finished for good, which gc may collect.
inline std::string SqlFinishedStates() {
  return SqlList(InstanceState::kCompleted, InstanceState::kCompensated, InstanceState::kFailed,
                 InstanceState::kClosed);
}

// Alerts still waiting for an operator: open or acknowledged.
inline std::string SqlLiveAlertStates() {
  return SqlList(AlertState::kOpen, AlertState::kAcknowledged);
}

// Returns each of `names` in double quotes, `"` and `\` escaped with `\`, joined by
// commas: the inside of a JSON array (SQLite's json_each) or of a PostgreSQL text[]
// literal alike.
inline std::string QuoteEach(const std::vector<std::string>& names) {
  std::string list;
  for (const std::string& name : names) {
    if (!list.empty()) list += ",";
    list += "\"";
    for (char c : name) {
      if (c == '"' || c == '\\') list += '\\';
      list += c;
    }
    list += "\"";
  }
  return list;
}

// kNoDueTime as SQL text.
inline std::string SqlNoDueTime() { return std::to_string(kNoDueTime); }

}  // namespace waystone
