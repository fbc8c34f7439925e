#pragma once

// How the definition loader reads YAML: every problem recorded with its line (and
// step) instead of thrown. Includes yaml-cpp and nlohmann/json: for the loader's .cc
// files only (loader.cc, definition_fields.cc and the *_reader.cc files).

#include <initializer_list>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>
#include <yaml-cpp/yaml.h>

#include "base/clock.h"
#include "definition/loader.h"
#include "model/definition.h"

namespace waystone {

// RFC 6901, not the whole document (""): what a redaction may name.
bool ValidJsonPointer(const std::string& text);

// The fields of one YAML document of a definition, read with their problems recorded
// in `diagnostics`. A reader of one part of a definition derives from it; a reader
// of another part is made from it, and shares its source and diagnostics.
class DefinitionFields {
 public:
  DefinitionFields(std::string_view source, std::vector<Diagnostic>* diagnostics)
      : source_(source), diagnostics_(diagnostics) {}

  // A name of letters, digits, '-', '_' and '.' (a workflow, a step, a group).
  static bool ValidName(const std::string& name);
  // Records `message` at `node`'s line, in `step` ("" outside a step).
  void Error(const YAML::Node& node, const std::string& step, const std::string& message);
  // An error for each key of `map` not in `allowed`, naming `where` and the allowed.
  void CheckFields(const YAML::Node& map, const std::string& step,
                   std::initializer_list<std::string_view> allowed, const std::string& where);
  // The non-empty string `field` of `map`; an error, and "", when missing or not one.
  std::string RequiredString(const YAML::Node& map, const char* field, const std::string& step);
  // The string `field` of `map`, "" when absent; an error when not a string.
  std::string OptionalString(const YAML::Node& map, const char* field, const std::string& step);
  // The duration `field` of `map` ("200ms", "2s", "1m"), `fallback` when absent.
  Millis Duration(const YAML::Node& map, const char* field, Millis fallback,
                  const std::string& step);
  // Converts YAML to JSON: quoted scalars stay strings, plain ones become numbers,
  // booleans or null when they read as such.
  // Deeper than kMaxJsonDepth is an error at `step`: what we render, store and
  // send stays bounded.
  nlohmann::json ToJson(const YAML::Node& node, const std::string& step, int depth = 0);
  // Reads the whole number `field` of `map` when present (0 when absent), from `low`
  // to `high`; `what` names it in the error.
  int WholeNumber(const YAML::Node& map, const char* field, int low, int high,
                  const std::string& what);
  // Reads a mapping of JSON pointers to scalar values (`lookup.match`, a body rule's
  // `match`), naming `what` in the errors.
  std::vector<std::pair<std::string, std::string>> PointerValues(const YAML::Node& map,
                                                                 const std::string& name,
                                                                 const std::string& what);
  // An error at `node` when `pointer` (its value) is given and not a JSON pointer.
  void CheckPointer(const YAML::Node& node, const std::string& step, const std::string& pointer);

 private:
  std::string_view source_;
  std::vector<Diagnostic>* diagnostics_;
};

// A step's HTTP request (and its body), retry policy, sql statement, lookup pages and
// error rules: request_reader.cc.
class RequestReader : public DefinitionFields {
 public:
  using DefinitionFields::DefinitionFields;
  explicit RequestReader(const DefinitionFields& fields) : DefinitionFields(fields) {}

  void ReadRequest(const YAML::Node& node, const std::string& step, const std::string& where,
                   RequestSpec* out);
  // Reads a request's `form`, `multipart` or `body_file` (at most one body of any kind).
  void ReadUpload(const YAML::Node& node, const std::string& step, const std::string& where,
                  RequestSpec* out);
  FileSpec ReadFileSpec(const YAML::Node& node, const std::string& step, const std::string& what);
  void ReadRetry(const YAML::Node& node, const std::string& step, RetryPolicy* out);
  // `sql: { statement: "...", params: { name: "{{template}}" } }` at `where`.
  void ReadSql(const YAML::Node& node, const std::string& name, const std::string& where,
               SqlSpec* out);
  // Reads `lookup.pages`: { next: /pointer } or { param: page, first: 1 }, and max.
  void ReadPages(const YAML::Node& pages, const std::string& name, LookupSpec* spec);
  // Reads `errors.body`: a list of { status?, match: { pointer: value }, class }.
  void ReadBodyRules(const YAML::Node& rules, const std::string& name,
                     std::vector<BodyErrorRule>* out);
};

// `targets:` and each target's limits: target_reader.cc.
class TargetReader : public DefinitionFields {
 public:
  using DefinitionFields::DefinitionFields;
  explicit TargetReader(const DefinitionFields& fields) : DefinitionFields(fields) {}

  // Reads `targets:`: name -> { url, tls: { ca_file, cert_file, key_file, key_password },
  // oauth2: { token_url, client_id, client_secret, scope } }.
  void ReadTargets(const YAML::Node& targets, std::vector<TargetSpec>* out);
  // Reads a target's `limits: { rate, concurrency }` and `circuit_breaker: {
  // failures, cool_down }`.
  void ReadLimits(const YAML::Node& spec, const std::string& where, TargetLimits* out);
};

// An `approval` step's `approval:` block: approval_reader.cc.
class ApprovalReader : public DefinitionFields {
 public:
  explicit ApprovalReader(const DefinitionFields& fields) : DefinitionFields(fields) {}
  void ReadApproval(const YAML::Node& node, const std::string& name, ApprovalSpec* out);
};

// A step's `when:` (a template that renders true or false, or a comparison):
// condition_reader.cc.
class ConditionReader : public DefinitionFields {
 public:
  explicit ConditionReader(const DefinitionFields& fields) : DefinitionFields(fields) {}
  void ReadCondition(const YAML::Node& when, const std::string& step, Condition* out);
};

// The message `templates:` and a `notify:` step, which runs as one step per channel
// (notify.h): notify_reader.cc.
class NotifyReader : public RequestReader {
 public:
  explicit NotifyReader(const DefinitionFields& fields) : RequestReader(fields) {}
  void ReadTemplates(const YAML::Node& templates, std::vector<MessageTemplate>* out);
  std::vector<StepDefinition> ReadNotify(const YAML::Node& node,
                                         const std::vector<MessageTemplate>& templates);
};

}  // namespace waystone
