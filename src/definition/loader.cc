#include "definition/loader.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>
#include <yaml-cpp/yaml.h>

#include "base/sha256.h"
#include "base/utf8.h"
#include "definition/notify.h"
#include "definition/validate.h"
#include "model/duration.h"
#include "model/json_text.h"
#include "model/template.h"

namespace waystone {
namespace {

// RFC 6901, not the whole document (""): what a redaction may name.
bool ValidJsonPointer(const std::string& text) {
  if (text.size() < 2 || text.front() != '/') return false;
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '~' && (i + 1 == text.size() || (text[i + 1] != '0' && text[i + 1] != '1'))) {
      return false;
    }
  }
  return true;
}

using Json = nlohmann::json;

// Reads one YAML document into a WorkflowDefinition, recording problems with the
// line they were found on. yaml-cpp exceptions stop at this class.
class Reader {
 public:
  Reader(std::string_view source, std::vector<Diagnostic>* diagnostics)
      : source_(source), diagnostics_(diagnostics) {}

  // A document of `targets:` alone (the targets of C++ workflows).
  void ReadTargetsDocument(const YAML::Node& root, WorkflowDefinition* out) {
    if (!root.IsMap() || !root["targets"]) {
      Error(root, "", "a targets document is a mapping with 'targets', e.g. targets: { erp: "
                      "{ url: \"{{env.ERP_URL}}\" } }");
      return;
    }
    CheckFields(root, "", {"targets"}, "targets document");
    ReadTargets(root["targets"], &out->targets);
  }

  void Read(const YAML::Node& root, WorkflowDefinition* out) {
    if (!root.IsMap()) {
      Error(root, "", "a definition is a mapping with 'workflow', 'key' and 'steps'");
      return;
    }
    CheckFields(root, "",
                {"workflow", "description", "key", "retention", "redact", "targets", "templates",
                 "revision", "steps"},
                "definition");
    if (const YAML::Node revision = root["revision"]) {
      out->revision_line = revision.Mark().line + 1;
      const YAML::Node reruns = revision.IsMap() ? revision["reruns"] : YAML::Node();
      if (!revision.IsMap() || !reruns || !reruns.IsSequence()) {
        Error(revision, "", "'revision' must be a mapping such as { reruns: [check-credit] }");
      } else {
        CheckFields(revision, "", {"reruns"}, "revision");
        for (const YAML::Node& step : reruns) {
          if (!step.IsScalar() || step.Scalar().empty()) {
            Error(step, "", "'revision.reruns' lists step names");
          } else {
            out->revision_reruns.push_back(step.Scalar());
          }
        }
      }
    }
    if (const YAML::Node targets = root["targets"]) ReadTargets(targets, &out->targets);
    if (const YAML::Node templates = root["templates"]) ReadTemplates(templates, &out->templates);
    if (const YAML::Node redact = root["redact"]) {
      if (!redact.IsSequence()) {
        Error(redact, "", "'redact' must be a list of JSON pointers such as [/customer/phone]");
      } else {
        for (const YAML::Node& pointer : redact) {
          if (!pointer.IsScalar() || !ValidJsonPointer(pointer.Scalar())) {
            Error(pointer, "", "'redact' entry '" + (pointer.IsScalar() ? pointer.Scalar() : "?") +
                                   "' is not a JSON pointer (it starts with '/'; '~' only as ~0 "
                                   "or ~1)");
          } else {
            out->redact.push_back(pointer.Scalar());
          }
        }
      }
    }
    if (const YAML::Node retention = root["retention"]) {
      if (!retention.IsMap()) {
        Error(retention, "", "'retention' must be a mapping such as { step_keys: 30d }");
      } else {
        CheckFields(retention, "", {"step_keys"}, "retention");
        out->step_key_retention = Duration(retention, "step_keys", 0, "");
        if (retention["step_keys"] && out->step_key_retention < 1000) {
          Error(retention["step_keys"], "", "'retention.step_keys' must be at least 1s");
        }
      }
    }
    out->name = RequiredString(root, "workflow", "");
    out->description = OptionalString(root, "description", "");
    out->key = RequiredString(root, "key", "");
    if (!out->name.empty() && !ValidName(out->name)) {
      Error(root["workflow"], "", "workflow name '" + out->name +
                                      "' may only use letters, digits, '-', '_' and '.'");
    }
    const YAML::Node steps = root["steps"];
    if (!steps) {
      Error(root, "", "missing field 'steps'");
      return;
    }
    if (!steps.IsSequence() || steps.size() == 0) {
      Error(steps, "", "'steps' must be a non-empty list");
      return;
    }
    std::set<std::string> names;
    for (const auto& node : steps) {
      std::vector<StepDefinition> read;
      if (node.IsMap() && node["parallel"]) {
        read = ReadParallel(node, out->templates, &names);
      } else {
        read = ReadEntry(node, out->templates);
        if (read.size() > 1 && !names.insert(read[0].notify).second) {
          Error(node, read[0].notify, "duplicate name (a notify step's name is also the name of "
                                      "its channels' group)");
        }
        if (read.size() > 1) {
          // A notification's channels: a branch each, so one that waits holds no other.
          for (size_t b = 0; b < read.size(); ++b) {
            read[b].group = read[b].notify;
            read[b].branch = static_cast<int>(b);
          }
        }
      }
      for (StepDefinition& step : read) {
        if (!step.name.empty() && !names.insert(step.name).second) {
          Error(node, step.name, "duplicate step name" +
                                     (step.notify.empty() ? std::string()
                                                          : " (a channel of notify '" +
                                                                step.notify + "')"));
        }
        out->steps.push_back(std::move(step));
      }
    }
  }

 private:
  static bool ValidName(const std::string& name) {
    for (char c : name) {
      const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                      c == '-' || c == '_' || c == '.';
      if (!ok) return false;
    }
    return !name.empty();
  }

  void Error(const YAML::Node& node, const std::string& step, const std::string& message) {
    const int line = node.IsDefined() ? node.Mark().line + 1 : 0;
    diagnostics_->push_back({std::string(source_), line, step, message});
  }

  void CheckFields(const YAML::Node& map, const std::string& step,
                   std::initializer_list<std::string_view> allowed, const std::string& where) {
    if (!map.IsMap()) return;
    for (const auto& entry : map) {
      const std::string key = entry.first.Scalar();
      bool known = false;
      for (auto name : allowed) known = known || key == name;
      if (!known) {
        std::string list;
        for (auto name : allowed) list += (list.empty() ? "" : ", ") + std::string(name);
        Error(entry.first, step, "unknown field '" + key + "' in " + where + " (allowed: " + list +
                                     ")");
      }
    }
  }

  std::string RequiredString(const YAML::Node& map, const char* field, const std::string& step) {
    const YAML::Node node = map[field];
    if (!node) {
      Error(map, step, std::string("missing field '") + field + "'");
      return "";
    }
    if (!node.IsScalar() || node.Scalar().empty()) {
      Error(node, step, std::string("'") + field + "' must be a non-empty string");
      return "";
    }
    return node.Scalar();
  }

  std::string OptionalString(const YAML::Node& map, const char* field, const std::string& step) {
    const YAML::Node node = map[field];
    if (!node) return "";
    if (!node.IsScalar()) {
      Error(node, step, std::string("'") + field + "' must be a string");
      return "";
    }
    return node.Scalar();
  }

  Millis Duration(const YAML::Node& map, const char* field, Millis fallback,
                  const std::string& step) {
    const YAML::Node node = map[field];
    if (!node) return fallback;
    auto parsed = node.IsScalar() ? ParseDuration(node.Scalar()) : std::nullopt;
    if (!parsed.has_value()) {
      Error(node, step, std::string("'") + field +
                            "' must be a duration such as 200ms, 2s or 1m");
      return fallback;
    }
    return *parsed;
  }

  // Converts YAML to JSON: quoted scalars stay strings, plain ones become numbers,
  // booleans or null when they read as such.
  // Deeper than kMaxJsonDepth is an error at `step`: what we render, store and
  // send stays bounded.
  Json ToJson(const YAML::Node& node, const std::string& step, int depth = 0) {
    if ((node.IsMap() || node.IsSequence()) && depth >= kMaxJsonDepth) {
      Error(node, step, "nests mappings and lists deeper than " + std::to_string(kMaxJsonDepth) +
                            " levels");
      return nullptr;
    }
    switch (node.Type()) {
      case YAML::NodeType::Map: {
        Json out = Json::object();
        for (const auto& entry : node) {
          out[entry.first.Scalar()] = ToJson(entry.second, step, depth + 1);
        }
        return out;
      }
      case YAML::NodeType::Sequence: {
        Json out = Json::array();
        for (const auto& element : node) out.push_back(ToJson(element, step, depth + 1));
        return out;
      }
      case YAML::NodeType::Scalar: {
        const std::string& text = node.Scalar();
        if (node.Tag() == "?") {
          if (text == "true") return true;
          if (text == "false") return false;
          if (text == "null" || text == "~") return nullptr;
          Json number = Json::parse(text, nullptr, /*allow_exceptions=*/false);
          if (number.is_number()) return number;
        }
        return text;
      }
      case YAML::NodeType::Null:
      case YAML::NodeType::Undefined:
        return nullptr;
    }
    return nullptr;
  }

  void ReadRequest(const YAML::Node& node, const std::string& step, const std::string& where,
                   RequestSpec* out) {
    if (!node.IsMap()) {
      Error(node, step, where + " must be a mapping with 'method' and 'url'");
      return;
    }
    CheckFields(node, step,
                {"method", "url", "headers", "body", "form", "multipart", "body_file", "timeout"},
                where);
    out->method = RequiredString(node, "method", step);
    for (auto& c : out->method) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    static const std::set<std::string> kMethods = {"GET",   "HEAD",   "OPTIONS", "POST",
                                                   "PUT",   "PATCH",  "DELETE"};
    if (!out->method.empty() && !kMethods.contains(out->method)) {
      Error(node["method"], step, "unsupported method '" + out->method + "'");
    }
    out->url = RequiredString(node, "url", step);
    out->timeout = Duration(node, "timeout", out->timeout, step);
    if (out->timeout <= 0) Error(node["timeout"], step, "'timeout' must be positive");
    if (const YAML::Node headers = node["headers"]) {
      if (!headers.IsMap()) {
        Error(headers, step, "'headers' must be a mapping of name to value");
      } else {
        for (const auto& entry : headers) {
          if (!entry.second.IsScalar()) {
            Error(entry.second, step, "header '" + entry.first.Scalar() + "' must be a string");
            continue;
          }
          out->headers.emplace_back(entry.first.Scalar(), entry.second.Scalar());
        }
      }
    }
    if (const YAML::Node body = node["body"]) out->body_json = JsonText(ToJson(body, step));
    ReadUpload(node, step, where, out);
  }

  // Reads a request's `form`, `multipart` or `body_file` (at most one body of any kind).
  void ReadUpload(const YAML::Node& node, const std::string& step, const std::string& where,
                  RequestSpec* out) {
    int bodies = 0;
    for (const char* kind : {"body", "form", "multipart", "body_file"}) bodies += node[kind] ? 1 : 0;
    if (bodies > 1) {
      Error(node, step, where + " has more than one of 'body', 'form', 'multipart', 'body_file'");
      return;
    }
    auto fields = [&](const YAML::Node& map, const std::string& what) {
      if (!map.IsMap()) {
        Error(map, step, what + " must be a mapping of field name to value");
        return;
      }
      for (const auto& entry : map) {
        if (!entry.second.IsScalar()) {
          Error(entry.second, step, what + " field '" + entry.first.Scalar() + "' must be a string");
        }
      }
      out->fields_json = JsonText(ToJson(map, step));
    };
    if (const YAML::Node form = node["form"]) {
      out->body_kind = BodyKind::kForm;
      fields(form, "'form'");
    }
    if (const YAML::Node multipart = node["multipart"]) {
      out->body_kind = BodyKind::kMultipart;
      if (!multipart.IsMap()) {
        Error(multipart, step, "'multipart' must be a mapping with 'fields' and 'files'");
        return;
      }
      CheckFields(multipart, step, {"fields", "files"}, "multipart");
      if (const YAML::Node map = multipart["fields"]) fields(map, "'multipart.fields'");
      const YAML::Node files = multipart["files"];
      if (!files || !files.IsMap() || files.size() == 0) {
        Error(files ? files : multipart, step,
              "'multipart.files' must map part names to files, e.g. { file: { path: ... } }");
        return;
      }
      for (const auto& entry : files) {
        FileSpec file = ReadFileSpec(entry.second, step, "multipart file '" +
                                                             entry.first.Scalar() + "'");
        file.part = entry.first.Scalar();
        out->files.push_back(std::move(file));
      }
    }
    if (const YAML::Node body_file = node["body_file"]) {
      out->body_kind = BodyKind::kFile;
      out->files.push_back(ReadFileSpec(body_file, step, "'body_file'"));
      if (!out->files.back().filename.empty()) {
        Error(body_file, step, "'body_file' sends bare bytes: it has no 'filename'");
      }
    }
    if (out->body_kind == BodyKind::kMultipart) {
      for (const auto& [name, value] : out->headers) {
        std::string lower = name;
        for (auto& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
        if (lower == "content-type") {
          Error(node["headers"], step, "a multipart request sets its own Content-Type (with the "
                                       "boundary); remove the 'Content-Type' header");
        }
      }
    }
  }

  FileSpec ReadFileSpec(const YAML::Node& node, const std::string& step, const std::string& what) {
    FileSpec file;
    if (!node.IsMap()) {
      Error(node, step, what + " must be a mapping with 'path' or 'base64'");
      return file;
    }
    CheckFields(node, step, {"path", "base64", "filename", "content_type"}, what);
    file.path = OptionalString(node, "path", step);
    file.base64 = OptionalString(node, "base64", step);
    file.filename = OptionalString(node, "filename", step);
    file.content_type = OptionalString(node, "content_type", step);
    if (file.path.empty() == file.base64.empty()) {
      Error(node, step, what + " needs exactly one of 'path' (under the files folder) or "
                               "'base64'");
    }
    return file;
  }

  void ReadRetry(const YAML::Node& node, const std::string& step, RetryPolicy* out) {
    if (!node) return;
    if (!node.IsMap()) {
      Error(node, step, "'retry' must be a mapping");
      return;
    }
    CheckFields(node, step, {"max_attempts", "initial_interval", "max_interval", "multiplier"},
                "retry");
    if (const YAML::Node attempts = node["max_attempts"]) {
      int value = 0;
      if (!YAML::convert<int>::decode(attempts, value) || value < 1 || value > 1000) {
        Error(attempts, step, "'max_attempts' must be a whole number from 1 to 1000");
      } else {
        out->max_attempts = value;
      }
    }
    out->initial_interval = Duration(node, "initial_interval", out->initial_interval, step);
    out->max_interval = Duration(node, "max_interval", out->max_interval, step);
    if (const YAML::Node multiplier = node["multiplier"]) {
      double value = 0;
      if (!YAML::convert<double>::decode(multiplier, value) || !(value >= 1.0) || value > 100) {
        Error(multiplier, step, "'multiplier' must be a number from 1 to 100");
      } else {
        out->multiplier = value;
      }
    }
    if (out->max_interval < out->initial_interval) {
      Error(node, step, "'max_interval' is shorter than 'initial_interval'");
    }
  }

  void ReadApproval(const YAML::Node& node, const std::string& name, ApprovalSpec* out) {
    if (!node.IsMap()) {
      Error(node, name, "'approval' must be a mapping such as { material: [/amount] }");
      return;
    }
    CheckFields(node, name,
                {"material", "summary", "requester", "approvers", "on_reject", "remind_after",
                 "escalate_after", "escalate_to", "timeout", "on_timeout"},
                "approval");
    out->remind_after = Duration(node, "remind_after", 0, name);
    out->escalate_after = Duration(node, "escalate_after", 0, name);
    out->escalate_to = OptionalString(node, "escalate_to", name);
    out->timeout = Duration(node, "timeout", 0, name);
    if ((out->escalate_after > 0) != !out->escalate_to.empty()) {
      Error(node, name, "'approval.escalate_after' and 'approval.escalate_to' (a group) go "
                        "together");
    } else if (!out->escalate_to.empty() && !ValidName(out->escalate_to)) {
      Error(node["escalate_to"], name, "'approval.escalate_to' must be a group's name");
    }
    if (const YAML::Node outcome = node["on_timeout"]) {
      const std::string text = outcome.IsScalar() ? outcome.Scalar() : "";
      if (!node["timeout"]) {
        Error(outcome, name, "'approval.on_timeout' needs 'approval.timeout'");
      } else if (text == "reject") {
        out->timeout_rejects = true;
      } else if (text == "close") {
        out->on_timeout = RejectRoute::kClose;
      } else if (text != "wait") {
        Error(outcome, name, "'approval.on_timeout' must be reject, close or wait");
      }
    }
    const YAML::Node material = node["material"];
    if (!material || !material.IsSequence() || material.size() == 0) {
      Error(material ? material : node, name,
            "'approval.material' must list the input's JSON pointers an approval is about, "
            "such as [/amount, /lines]");
    } else {
      for (const YAML::Node& pointer : material) {
        if (!pointer.IsScalar() || !ValidJsonPointer(pointer.Scalar())) {
          Error(pointer, name, "'approval.material' entry '" +
                                   (pointer.IsScalar() ? pointer.Scalar() : "?") +
                                   "' is not a JSON pointer such as /amount");
        } else {
          out->material.push_back(pointer.Scalar());
        }
      }
    }
    out->summary = OptionalString(node, "summary", name);
    out->requester = OptionalString(node, "requester", name);
    if (const YAML::Node approvers = node["approvers"]) {
      if (!approvers.IsMap() || (approvers["role"] ? 1 : 0) + (approvers["group"] ? 1 : 0) != 1) {
        Error(approvers, name, "'approval.approvers' names one 'role' (viewer, operator, admin) "
                               "or one 'group' (of the server config's groups:)");
      } else {
        CheckFields(approvers, name, {"role", "group"}, "approval.approvers");
        out->group = OptionalString(approvers, "group", name);
        if (approvers["role"]) {
          out->role = OptionalString(approvers, "role", name);
          if (out->role != "viewer" && out->role != "operator" && out->role != "admin") {
            Error(approvers["role"], name, "'approval.approvers.role' must be viewer, operator "
                                           "or admin");
          }
        } else if (!ValidName(out->group)) {
          Error(approvers["group"], name, "'approval.approvers.group' must be a name of "
                                          "letters, digits, '-', '_' and '.'");
        }
      }
    }
    if (const YAML::Node route = node["on_reject"]) {
      const std::string text = route.IsScalar() ? route.Scalar() : "";
      if (text == "compensate") out->on_reject = RejectRoute::kCompensate;
      else if (text == "close") out->on_reject = RejectRoute::kClose;
      else if (text == "wait") out->on_reject = RejectRoute::kWait;
      else Error(route, name, "'approval.on_reject' must be compensate, close or wait");
    }
  }

  // `sql: { statement: "...", params: { name: "{{template}}" } }` at `where`.
  void ReadSql(const YAML::Node& node, const std::string& name, const std::string& where,
               SqlSpec* out) {
    if (!node.IsMap()) {
      Error(node, name, "'" + where + "' must be a mapping with 'statement' and 'params'");
      return;
    }
    CheckFields(node, name, {"statement", "params"}, where);
    const std::string text = RequiredString(node, "statement", name);
    if (text.empty()) return;
    auto parsed = ParseSqlStatement(text);
    if (!parsed.ok()) {
      Error(node["statement"], name, where + ".statement: " + std::string(parsed.status().message()));
      return;
    }
    out->statement = std::move(*parsed);
    // Any word that is the name of one of Waystone's tables is refused, wherever it
    // stands (a column of that name too): the lexer need not know where tables go.
    for (const std::string& word : out->statement.identifiers) {
      if (std::find(std::begin(kWaystoneTables), std::end(kWaystoneTables), word) !=
          std::end(kWaystoneTables)) {
        Error(node["statement"], name,
              where + ".statement names '" + word + "', one of Waystone's own tables; a sql "
              "step reads and writes the integration's tables only (rename a column of that "
              "name)");
      }
    }
    const YAML::Node params = node["params"];
    if (params && !params.IsMap()) {
      Error(params, name, "'" + where + ".params' must map each :name of the statement to a "
                          "template such as \"{{input.order_id}}\"");
      return;
    }
    for (const std::string& wanted : out->statement.names) {
      const YAML::Node value = params ? params[wanted] : params;
      if (!params || !value) {
        Error(params ? params : node, name,
              where + ".params has no value for :" + wanted + " of the statement");
      } else if (value.IsNull()) {
        out->params.emplace_back(wanted, std::nullopt);
      } else if (!value.IsScalar()) {
        Error(value, name, where + ".params." + wanted + " must be a template (a string) or null");
      } else {
        out->params.emplace_back(wanted, value.Scalar());
      }
    }
    if (params) {
      for (const auto& entry : params) {
        const std::string key = entry.first.Scalar();
        if (std::find(out->statement.names.begin(), out->statement.names.end(), key) ==
            out->statement.names.end()) {
          Error(entry.first, name, where + ".params." + key + " is not used by the statement "
                                   "(no :" + key + " in it)");
        }
      }
    }
  }

  void ReadStep(const YAML::Node& node, StepDefinition* step) {
    step->line = node.Mark().line + 1;
    if (!node.IsMap()) {
      Error(node, "", "a step is a mapping with at least 'name'");
      return;
    }
    step->name = RequiredString(node, "name", "");
    const std::string& name = step->name;
    if (!name.empty() && !ValidName(name)) {
      Error(node["name"], name, "step names may only use letters, digits, '-', '_' and '.'");
    }
    CheckFields(node, name,
                {"name", "description", "recovery", "request", "transform", "wait", "approval",
                 "sql", "result", "lookup", "compensate", "retry", "errors", "idempotency",
                 "store_response", "when", "optional", "on_failure"},
                "step");
    const YAML::Node request = node["request"];
    const YAML::Node transform = node["transform"];
    const YAML::Node wait = node["wait"];
    const YAML::Node approval = node["approval"];
    const YAML::Node sql = node["sql"];
    if ((request ? 1 : 0) + (transform ? 1 : 0) + (wait ? 1 : 0) + (approval ? 1 : 0) +
            (sql ? 1 : 0) > 1) {
      Error(node, name, "a step has one of 'request', 'transform', 'wait', 'approval' or 'sql'");
    } else if (sql) {
      step->kind = StepKind::kSql;
      ReadSql(sql, name, "sql", &step->sql);
    } else if (approval) {
      step->kind = StepKind::kApproval;
      ReadApproval(approval, name, &step->approval);
    } else if (wait) {
      step->kind = StepKind::kWait;
      if (!wait.IsMap()) {
        Error(wait, name, "'wait' must be a mapping such as { event: com.example.approved }");
      } else {
        CheckFields(wait, name, {"event", "timeout"}, "wait");
        step->wait_event = RequiredString(wait, "event", name);
        step->wait_timeout = Duration(wait, "timeout", 0, name);
      }
    } else if (request) {
      step->kind = StepKind::kHttp;
      ReadRequest(request, name, "request", &step->request);
    } else if (transform) {
      step->kind = StepKind::kTransform;
      step->transform_json = JsonText(ToJson(transform, name));
    } else {
      Error(node, name, "a step needs 'request' (an HTTP call), 'transform' (a computed value), "
                        "'wait' (an event), 'approval' (a decision by people) or 'sql' (a "
                        "statement committed with the step)");
    }

    if (const YAML::Node recovery = node["recovery"]) {
      auto parsed = recovery.IsScalar() ? ParseRecoveryClass(recovery.Scalar()) : std::nullopt;
      if (!parsed) {
        Error(recovery, name, "'recovery' must be one of repeatable, lookup, compensable, manual");
      } else {
        step->recovery = *parsed;
      }
    }

    if (const YAML::Node on_failure = node["on_failure"]) {
      if (!on_failure.IsScalar() || (on_failure.Scalar() != "pause" &&
                                     on_failure.Scalar() != "default")) {
        Error(on_failure, name, "'on_failure' must be pause (wait for an operator, nothing "
                                "undone) or default");
      } else {
        step->pause_on_failure = on_failure.Scalar() == "pause";
      }
    }

    if (const YAML::Node keep = node["store_response"]) {
      if (keep.IsScalar() && keep.Scalar() == "all") {
        step->store_response = ResponseKeep::kAll;
      } else if (keep.IsScalar() && keep.Scalar() == "none") {
        step->store_response = ResponseKeep::kNone;
      } else if (keep.IsSequence()) {
        step->store_response = ResponseKeep::kListed;
        for (const auto& pointer : keep) {
          if (!pointer.IsScalar() || !pointer.Scalar().starts_with("/")) {
            Error(pointer, name, "'store_response' lists JSON pointers such as /id");
            continue;
          }
          step->kept_pointers.push_back(pointer.Scalar());
        }
      } else {
        Error(keep, name, "'store_response' is all, none or a list of JSON pointers such as "
                          "[/id, /status]");
      }
    }

    if (const YAML::Node result = node["result"]) {
      if (!result.IsMap()) {
        Error(result, name, "'result' must be a mapping such as { external_id: \"/id\" }");
      } else {
        CheckFields(result, name, {"external_id"}, "result");
        step->result_external_id = OptionalString(result, "external_id", name);
        CheckPointer(result["external_id"], name, step->result_external_id);
      }
    }

    if (const YAML::Node lookup = node["lookup"]) {
      LookupSpec spec;
      if (!lookup.IsMap()) {
        Error(lookup, name, "'lookup' must be a mapping with 'request' and 'found'");
      } else {
        CheckFields(lookup, name, {"request", "found", "items", "match", "external_id", "pages"},
                    "lookup");
        if (const YAML::Node lookup_request = lookup["request"]) {
          ReadRequest(lookup_request, name, "lookup.request", &spec.request);
          if (spec.request.SideEffecting()) {
            Error(lookup_request, name, "a lookup must not change anything: use GET");
          }
        } else {
          Error(lookup, name, "lookup needs 'request'");
        }
        if (lookup["found"] && lookup["items"]) {
          Error(lookup, name, "a lookup has 'found' (one object) or 'items' (candidates), not both");
        } else if (lookup["items"]) {
          spec.items = RequiredString(lookup, "items", name);
          CheckPointer(lookup["items"], name, spec.items);
        } else {
          spec.found = RequiredString(lookup, "found", name);
          CheckPointer(lookup["found"], name, spec.found);
        }
        if (const YAML::Node match = lookup["match"]) {
          if (!match.IsMap() || match.size() == 0) {
            Error(match, name, "'lookup.match' maps JSON pointers to expected values, e.g. "
                               "{ \"/ref\": \"{{instance.ref}}\" }");
          } else {
            spec.match = PointerValues(match, name, "lookup.match");
          }
        }
        spec.external_id = OptionalString(lookup, "external_id", name);
        CheckPointer(lookup["external_id"], name, spec.external_id);
        if (const YAML::Node pages = lookup["pages"]) ReadPages(pages, name, &spec);
      }
      step->lookup = std::move(spec);
    }

    if (const YAML::Node compensate = node["compensate"]) {
      CompensationSpec spec;
      if (!compensate.IsMap()) {
        Error(compensate, name, "'compensate' must be a mapping with 'request'");
      } else if (step->kind == StepKind::kSql) {
        CheckFields(compensate, name, {"sql"}, "compensate");
        if (const YAML::Node compensate_sql = compensate["sql"]) {
          SqlSpec undo;
          ReadSql(compensate_sql, name, "compensate.sql", &undo);
          step->compensate_sql = std::move(undo);
        } else {
          Error(compensate, name, "a sql step's compensate needs 'sql' (a statement that undoes "
                                  "it, committed with the compensation)");
        }
      } else {
        CheckFields(compensate, name, {"request", "retry"}, "compensate");
        if (const YAML::Node compensate_request = compensate["request"]) {
          ReadRequest(compensate_request, name, "compensate.request", &spec.request);
        } else {
          Error(compensate, name, "compensate needs 'request'");
        }
        ReadRetry(compensate["retry"], name, &spec.retry);
        step->compensate = std::move(spec);
      }
    }

    ReadRetry(node["retry"], name, &step->retry);

    if (const YAML::Node errors = node["errors"]) {
      if (!errors.IsMap()) {
        Error(errors, name, "'errors' must map HTTP status codes to transient, rejected or unknown");
      } else {
        for (const auto& entry : errors) {
          if (entry.first.IsScalar() && entry.first.Scalar() == "body") {
            ReadBodyRules(entry.second, name, &step->body_errors);
            continue;
          }
          int status = 0;
          if (!YAML::convert<int>::decode(entry.first, status) || status < 100 || status > 599) {
            Error(entry.first, name, "'" + entry.first.Scalar() + "' is not an HTTP status code");
            continue;
          }
          auto parsed =
              entry.second.IsScalar() ? ParseErrorClass(entry.second.Scalar()) : std::nullopt;
          if (!parsed) {
            Error(entry.second, name, "error class for " + entry.first.Scalar() +
                                          " must be transient, rejected or unknown");
            continue;
          }
          step->errors[status] = *parsed;
        }
      }
    }

    if (const YAML::Node idempotency = node["idempotency"]) {
      if (!idempotency.IsMap()) {
        Error(idempotency, name, "'idempotency' must be a mapping with 'key' and/or 'honored'");
      } else {
        CheckFields(idempotency, name, {"key", "honored"}, "idempotency");
        step->idempotency_key = OptionalString(idempotency, "key", name);
        if (const YAML::Node honored = idempotency["honored"]) {
          bool value = false;
          if (!YAML::convert<bool>::decode(honored, value)) {
            Error(honored, name, "'honored' must be true or false");
          }
          step->idempotency_honored = value;
        }
      }
    }

    if (const YAML::Node when = node["when"]) ReadCondition(when, name, &step->when);
    if (const YAML::Node optional = node["optional"]) {
      bool value = false;
      if (!YAML::convert<bool>::decode(optional, value)) {
        Error(optional, name, "'optional' must be true or false");
      }
      step->optional = value;
    }
  }

  // Reads one entry of `steps:` (or of a branch): a step, or a notify step's channels.
  std::vector<StepDefinition> ReadEntry(const YAML::Node& node,
                                        const std::vector<MessageTemplate>& templates) {
    if (node.IsMap() && node["notify"]) return ReadNotify(node, templates);
    std::vector<StepDefinition> read;
    ReadStep(node, &read.emplace_back());
    return read;
  }

  // Reads a parallel group: `name` and `parallel:`, a list of branches, each one step
  // (or notify step) or { branch: NAME, steps: [...] }. Its steps are numbered by branch.
  std::vector<StepDefinition> ReadParallel(const YAML::Node& node,
                                           const std::vector<MessageTemplate>& templates,
                                           std::set<std::string>* names) {
    const std::string name = RequiredString(node, "name", "");
    if (!name.empty() && !ValidName(name)) {
      Error(node["name"], name, "group names may only use letters, digits, '-', '_' and '.'");
    }
    if (!name.empty() && !names->insert(name).second) {
      Error(node, name, "duplicate name (a parallel group's name is a step name too)");
    }
    CheckFields(node, name, {"name", "description", "parallel"}, "parallel group");
    const YAML::Node branches = node["parallel"];
    if (!branches.IsSequence() || branches.size() < 2) {
      Error(branches, name, "'parallel' is a list of at least two branches, each a step or "
                            "{ branch: NAME, steps: [...] }");
      return {};
    }
    std::vector<StepDefinition> out;
    int branch = 0;
    for (const auto& entry : branches) {
      std::vector<StepDefinition> read;
      if (entry.IsMap() && entry["steps"]) {
        CheckFields(entry, name, {"branch", "steps"}, "a branch of parallel group '" + name + "'");
        const YAML::Node steps = entry["steps"];
        if (!steps.IsSequence() || steps.size() == 0) {
          Error(steps, name, "a branch's 'steps' must be a non-empty list");
          continue;
        }
        for (const auto& step : steps) {
          if (step.IsMap() && step["parallel"]) {
            Error(step, name, "a parallel group cannot hold another one");
            continue;
          }
          for (StepDefinition& one : ReadEntry(step, templates)) read.push_back(std::move(one));
        }
      } else if (entry.IsMap() && entry["parallel"]) {
        Error(entry, name, "a parallel group cannot hold another one");
        continue;
      } else {
        read = ReadEntry(entry, templates);
      }
      // A notification inside a branch sends its channels in turn, within the branch.
      for (StepDefinition& step : read) {
        step.group = name;
        step.branch = branch;
        out.push_back(std::move(step));
      }
      ++branch;
    }
    return out;
  }

  // Reads `templates:`: name -> { version: N, text: "..." }.
  void ReadTemplates(const YAML::Node& templates, std::vector<MessageTemplate>* out) {
    if (!templates.IsMap()) {
      Error(templates, "", "'templates' maps template names to { version: 1, text: \"...\" }");
      return;
    }
    for (const auto& entry : templates) {
      MessageTemplate message;
      message.name = entry.first.Scalar();
      message.line = entry.first.Mark().line + 1;
      const std::string where = "template '" + message.name + "'";
      if (!ValidName(message.name)) {
        Error(entry.first, "", where + ": names may only use letters, digits, '-', '_' and '.'");
      }
      const YAML::Node& spec = entry.second;
      if (!spec.IsMap()) {
        Error(spec, "", where + " must be a mapping such as { version: 1, text: \"...\" }");
        continue;
      }
      CheckFields(spec, "", {"version", "text", "subject"}, where);
      const YAML::Node version = spec["version"];
      if (!version || !YAML::convert<int>::decode(version, message.version) ||
          message.version < 1) {
        Error(version ? version : spec, "",
              where + " needs 'version', a whole number from 1: a delivery's identity holds "
                      "it, so a changed text is a new version");
      }
      message.text = RequiredString(spec, "text", "");
      message.subject = OptionalString(spec, "subject", "");
      out->push_back(std::move(message));
    }
  }

  // Reads a `notify:` step into the steps it runs as (notify.h), one per channel.
  std::vector<StepDefinition> ReadNotify(const YAML::Node& node,
                                         const std::vector<MessageTemplate>& templates) {
    NotifySpec spec;
    spec.line = node.Mark().line + 1;
    spec.name = RequiredString(node, "name", "");
    const std::string& name = spec.name;
    if (!name.empty() && !ValidName(name)) {
      Error(node["name"], name, "step names may only use letters, digits, '-', '_' and '.'");
    }
    CheckFields(node, name, {"name", "description", "notify", "when", "retry", "critical"},
                "notify step (its channels have their own requests)");
    const YAML::Node notify = node["notify"];
    if (!notify.IsMap()) {
      Error(notify, name, "'notify' must be a mapping with 'reports', 'template', 'recipient' "
                          "and 'channels'");
      return {};
    }
    CheckFields(notify, name,
                {"reports", "template", "correction", "recipient", "event", "channels"}, "notify");
    spec.reports = RequiredString(notify, "reports", name);
    spec.recipient = RequiredString(notify, "recipient", name);
    spec.event = OptionalString(notify, "event", name);
    if (spec.event.empty() && !spec.reports.empty()) {
      spec.event = "{{instance.ref}}/" + spec.reports;
    }
    auto find = [&](const char* field) -> const MessageTemplate* {
      const YAML::Node at = notify[field];
      if (!at) return nullptr;
      const std::string wanted = at.IsScalar() ? at.Scalar() : "";
      for (const MessageTemplate& message : templates) {
        if (message.name == wanted) return &message;
      }
      std::string text = "'";
      text.append(field).append("': no template '").append(wanted).append("' under 'templates:'");
      if (templates.empty()) text.append(" (there are none)");
      for (size_t i = 0; i < templates.size(); ++i) {
        text.append(i == 0 ? " (known: " : ", ").append(templates[i].name);
      }
      if (!templates.empty()) text.append(")");
      Error(at, name, text);
      return nullptr;
    };
    const MessageTemplate* message = find("template");
    if (!notify["template"]) Error(notify, name, "missing field 'template'");
    const MessageTemplate* correction = find("correction");
    if (const YAML::Node critical = node["critical"]) {
      if (!YAML::convert<bool>::decode(critical, spec.critical)) {
        Error(critical, name, "'critical' must be true or false");
      }
    }
    ReadRetry(node["retry"], name, &spec.retry);
    if (const YAML::Node when = node["when"]) ReadCondition(when, name, &spec.when);
    const YAML::Node channels = notify["channels"];
    if (!channels || !channels.IsMap() || channels.size() == 0) {
      Error(channels ? channels : notify, name,
            "'notify.channels' maps channels to their settings, e.g. { line: { to: ..., token: "
            "\"{{secret.LINE_TOKEN}}\" }, webhook: { url: ... } }");
      return {};
    }
    for (const auto& entry : channels) {
      const std::string channel = entry.first.Scalar();
      const YAML::Node& settings = entry.second;
      const std::string where = "notify.channels." + channel;
      if (!settings.IsMap()) {
        Error(settings, name, "'" + where + "' must be a mapping");
        continue;
      }
      // A credential is never written into a definition: exactly one placeholder.
      auto credential = [&](const char* field, const std::string& value) {
        const auto path = SolePlaceholder(value);
        if (!value.empty() && !path) {
          Error(settings[field], name, "'" + where + "." + field + "' must be exactly one "
                                       "{{secret.NAME}} or {{env.NAME}}: a credential is never "
                                       "written into a definition");
        } else if (path && (*path)[0] != "secret" && (*path)[0] != "env") {
          Error(settings[field], name, "'" + where + "." + field + "' must come from "
                                       "{{secret.NAME}} or {{env.NAME}}");
        }
      };
      NotifyChannel read;
      if (channel == "line") {
        read.kind = NotifyChannel::Kind::kLine;
        CheckFields(settings, name, {"to", "token", "url"}, where);
        read.to = RequiredString(settings, "to", name);
        read.token = RequiredString(settings, "token", name);
        read.url = settings["url"] ? RequiredString(settings, "url", name)
                                   : std::string("https://api.line.me");
        credential("token", read.token);
      } else if (channel == "webhook") {
        read.kind = NotifyChannel::Kind::kWebhook;
        CheckFields(settings, name, {"url"}, where);
        read.url = RequiredString(settings, "url", name);
      } else if (channel == "email") {
        read.kind = NotifyChannel::Kind::kEmail;
        CheckFields(settings, name, {"url", "from", "to", "user", "password", "timeout"}, where);
        read.url = RequiredString(settings, "url", name);
        read.from = RequiredString(settings, "from", name);
        read.to = RequiredString(settings, "to", name);
        read.user = OptionalString(settings, "user", name);
        read.password = OptionalString(settings, "password", name);
        if (settings["timeout"]) {
          const Millis timeout = Duration(settings, "timeout", -1, name);  // -1: said already
          if (timeout >= 0 && timeout < 1000) {
            Error(settings["timeout"], name, "'" + where + ".timeout' is at least 1s (default " +
                                                 std::to_string(kEmailTimeout / 60000) + "m)");
          }
          read.timeout = std::max<Millis>(timeout, 0);
        }
        if (!read.url.empty() && !read.url.starts_with("{{") &&
            !read.url.starts_with("smtp://") && !read.url.starts_with("smtps://")) {
          Error(settings["url"], name, "'" + where + ".url' is the SMTP server: "
                                       "smtp://host:port or smtps://host:port");
        }
        if (read.user.empty() != read.password.empty()) {
          Error(settings, name, "'" + where + "': 'user' and 'password' go together (SMTP AUTH)");
        }
        credential("password", read.password);
        if (message != nullptr && message->subject.empty()) {
          Error(settings, name, "'" + where + "': template '" + message->name +
                                    "' has no 'subject', which an email needs");
        }
        if (correction != nullptr && correction->subject.empty()) {
          Error(notify["correction"], name, "'" + where + "': correction template '" +
                                                correction->name +
                                                "' has no 'subject', which an email needs");
        }
      } else {
        Error(entry.first, name,
              "unknown channel '" + channel + "' (known: line, webhook, email)");
        continue;
      }
      spec.channels.push_back(std::move(read));
    }
    if (message == nullptr) return {};
    return ExpandNotify(spec, *message, correction);
  }

  // Reads `when:`: a template that renders true or false, or exactly one of
  // { present: "{{path}}" }, { absent: "{{path}}" }, { equals: [a, b] },
  // { not_equals: [a, b] }.
  void ReadCondition(const YAML::Node& when, const std::string& step, Condition* out) {
    static constexpr char kForms[] =
        "'when' is a template that renders true or false (\"{{input.send_email}}\") or one of "
        "{ present: \"{{input.email}}\" }, { absent: ... }, { equals: [\"{{input.channel}}\", "
        "line] }, { not_equals: [...] }";
    using Test = Condition::Test;
    if (when.IsScalar()) {
      out->test = Test::kTrue;
      out->value = when.Scalar();
      out->shown = out->value;
      if (auto parsed = Template::Parse(out->value); !parsed.ok()) {
        Error(when, step, "when: " + std::string(parsed.status().message()));
      } else if (!SolePlaceholder(out->value)) {
        Error(when, step, "'when' as a value is exactly one placeholder that renders true or "
                          "false, such as \"{{input.send_email}}\" (a literal would always or "
                          "never hold: remove the step or the condition instead)");
      }
      return;
    }
    if (!when.IsMap() || when.size() != 1) {
      Error(when, step, kForms);
      return;
    }
    const std::string test = when.begin()->first.Scalar();
    const YAML::Node operand = when.begin()->second;
    if (test == "present" || test == "absent") {
      if (!operand.IsScalar()) {
        Error(operand, step, "'when." + test + "' names one value, e.g. \"{{input.email}}\"");
        return;
      }
      out->test = test == "present" ? Test::kPresent : Test::kAbsent;
      out->value = operand.Scalar();
      if (auto parsed = Template::Parse(out->value); !parsed.ok()) {
        Error(operand, step, "when." + test + ": " + std::string(parsed.status().message()));
      } else if (!SolePlaceholder(out->value)) {
        Error(operand, step, "'when." + test + "' is exactly one placeholder such as "
                             "\"{{input.email}}\", nothing around it");
      }
      out->shown = test + " " + out->value;
      return;
    }
    if (test == "equals" || test == "not_equals") {
      if (!operand.IsSequence() || operand.size() != 2 || !operand[0].IsScalar() ||
          !operand[1].IsScalar()) {
        Error(operand, step, "'when." + test + "' compares two values: [\"{{input.channel}}\", "
                             "line]");
        return;
      }
      out->test = test == "equals" ? Test::kEquals : Test::kNotEquals;
      out->value = operand[0].Scalar();
      out->other = operand[1].Scalar();
      out->shown = out->value + (test == "equals" ? " == " : " != ") + out->other;
      return;
    }
    Error(when.begin()->first, step, kForms);
  }

  // Reads `targets:`: name -> { url, tls: { ca_file, cert_file, key_file, key_password },
  // oauth2: { token_url, client_id, client_secret, scope } }.
  void ReadTargets(const YAML::Node& targets, std::vector<TargetSpec>* out) {
    if (!targets.IsMap() || targets.size() == 0) {
      Error(targets, "", "'targets' maps names to systems, e.g. { erp: { url: \"{{env.ERP_URL}}\","
                         " tls: { ca_file: \"{{env.ERP_CA_FILE}}\" } } }");
      return;
    }
    for (const auto& entry : targets) {
      TargetSpec target;
      target.name = entry.first.Scalar();
      target.line = entry.first.Mark().line + 1;
      const std::string where = "target '" + target.name + "'";
      if (!ValidName(target.name)) {
        Error(entry.first, "", where + ": names may only use letters, digits, '-', '_' and '.'");
      }
      const YAML::Node spec = entry.second;
      if (!spec.IsMap()) {
        Error(spec, "", where + " must be a mapping with 'url'");
        continue;
      }
      CheckFields(spec, "", {"url", "tls", "oauth2", "limits", "circuit_breaker"}, where);
      target.url = RequiredString(spec, "url", "");
      if (const YAML::Node tls = spec["tls"]) {
        if (!tls.IsMap()) {
          Error(tls, "", where + ": 'tls' must be a mapping with ca_file, cert_file, key_file");
        } else {
          CheckFields(tls, "", {"ca_file", "cert_file", "key_file", "key_password"},
                      where + " tls");
          target.ca_file = OptionalString(tls, "ca_file", "");
          target.cert_file = OptionalString(tls, "cert_file", "");
          target.key_file = OptionalString(tls, "key_file", "");
          target.key_password = OptionalString(tls, "key_password", "");
          if (target.cert_file.empty() != target.key_file.empty()) {
            Error(tls, "", where + ": a client certificate needs both 'cert_file' and 'key_file'");
          }
          if (!target.key_password.empty() && target.key_file.empty()) {
            Error(tls, "", where + ": 'key_password' goes with 'key_file'");
          }
        }
      }
      if (const YAML::Node oauth2 = spec["oauth2"]) {
        if (!oauth2.IsMap()) {
          Error(oauth2, "", where + ": 'oauth2' must be a mapping with token_url, client_id and "
                                    "client_secret");
        } else {
          CheckFields(oauth2, "", {"token_url", "client_id", "client_secret", "scope"},
                      where + " oauth2");
          target.token_url = RequiredString(oauth2, "token_url", "");
          target.client_id = RequiredString(oauth2, "client_id", "");
          target.client_secret = RequiredString(oauth2, "client_secret", "");
          target.scope = OptionalString(oauth2, "scope", "");
        }
      }
      ReadLimits(spec, where, &target.limits);
      for (const TargetSpec& other : *out) {
        if (other.name == target.name) Error(entry.first, "", where + " is declared twice");
      }
      out->push_back(std::move(target));
    }
  }

  // Reads a target's `limits: { rate, concurrency }` and `circuit_breaker: {
  // failures, cool_down }`.
  void ReadLimits(const YAML::Node& spec, const std::string& where, TargetLimits* out) {
    if (const YAML::Node limits = spec["limits"]) {
      if (!limits.IsMap()) {
        Error(limits, "", where + ": 'limits' must be a mapping such as { rate: 20, concurrency: 4 }");
      } else {
        CheckFields(limits, "", {"rate", "concurrency"}, where + " limits");
        if (const YAML::Node rate = limits["rate"]) {
          double value = 0;
          if (!YAML::convert<double>::decode(rate, value) || !(value >= 0.01) || value > 10000) {
            Error(rate, "", where + ": 'limits.rate' must be calls a second from 0.01 to 10000");
          } else {
            out->rate = value;
          }
        }
        out->concurrency = WholeNumber(limits, "concurrency", 1, 10000, where + ": 'limits.concurrency'");
      }
    }
    if (const YAML::Node breaker = spec["circuit_breaker"]) {
      if (!breaker.IsMap()) {
        Error(breaker, "", where + ": 'circuit_breaker' must be a mapping such as { failures: 5, "
                                   "cool_down: 30s }");
      } else {
        CheckFields(breaker, "", {"failures", "cool_down"}, where + " circuit_breaker");
        if (!breaker["failures"]) {
          Error(breaker, "", where + ": 'circuit_breaker' needs 'failures' (consecutive transient "
                                     "failures that open it)");
        }
        out->breaker_failures =
            WholeNumber(breaker, "failures", 1, 1000, where + ": 'circuit_breaker.failures'");
        out->cool_down = Duration(breaker, "cool_down", out->cool_down, "");
        if (out->cool_down < 100 || out->cool_down > 24 * 3600 * 1000LL) {
          Error(breaker["cool_down"], "", where + ": 'circuit_breaker.cool_down' must be from 100ms "
                                                  "to 24h");
        }
      }
    }
  }

  // Reads the whole number `field` of `map` when present (0 when absent), from `low`
  // to `high`; `what` names it in the error.
  int WholeNumber(const YAML::Node& map, const char* field, int low, int high,
                  const std::string& what) {
    const YAML::Node node = map[field];
    if (!node) return 0;
    int value = 0;
    if (!YAML::convert<int>::decode(node, value) || value < low || value > high) {
      Error(node, "", what + " must be a whole number from " + std::to_string(low) + " to " +
                          std::to_string(high));
      return 0;
    }
    return value;
  }

  // Reads a mapping of JSON pointers to scalar values (`lookup.match`, a body rule's
  // `match`), naming `what` in the errors.
  std::vector<std::pair<std::string, std::string>> PointerValues(const YAML::Node& map,
                                                                 const std::string& name,
                                                                 const std::string& what) {
    std::vector<std::pair<std::string, std::string>> values;
    for (const auto& entry : map) {
      const std::string pointer = entry.first.Scalar();
      CheckPointer(entry.first, name, pointer);
      if (!entry.second.IsScalar()) {
        Error(entry.second, name, what + " " + pointer + " must be a string");
        continue;
      }
      values.emplace_back(pointer, entry.second.Scalar());
    }
    return values;
  }

  // Reads `lookup.pages`: { next: /pointer } or { param: page, first: 1 }, and max.
  void ReadPages(const YAML::Node& pages, const std::string& name, LookupSpec* spec) {
    constexpr int kDefaultMaxPages = 10;
    constexpr int kMostPages = 1000;
    if (!pages.IsMap()) {
      Error(pages, name, "'lookup.pages' must be a mapping such as { next: /next, max: 10 } or "
                         "{ param: page, first: 1, max: 10 }");
      return;
    }
    CheckFields(pages, name, {"next", "param", "first", "max"}, "lookup.pages");
    if (spec->items.empty()) {
      Error(pages, name, "'lookup.pages' needs 'items': the candidates of every page are judged "
                         "together");
    }
    if (pages["next"] && pages["param"]) {
      Error(pages, name, "'lookup.pages' follows 'next' (a link in each answer) or counts up "
                         "'param', not both");
    } else if (pages["next"]) {
      spec->next_pointer = RequiredString(pages, "next", name);
      CheckPointer(pages["next"], name, spec->next_pointer);
    } else if (pages["param"]) {
      spec->page_param = RequiredString(pages, "param", name);
    } else {
      Error(pages, name, "'lookup.pages' needs 'next' (a JSON pointer to the next page's link) "
                         "or 'param' (the page number's query parameter)");
    }
    if (const YAML::Node first = pages["first"]) {
      if (spec->page_param.empty()) Error(first, name, "'lookup.pages.first' goes with 'param'");
      if (!YAML::convert<int>::decode(first, spec->first_page) || spec->first_page < 0 ||
          spec->first_page > 1'000'000) {
        Error(first, name, "'lookup.pages.first' must be a whole number from 0 to 1000000");
        spec->first_page = 1;
      }
    }
    spec->max_pages = kDefaultMaxPages;
    if (const YAML::Node max = pages["max"]) {
      if (!YAML::convert<int>::decode(max, spec->max_pages) || spec->max_pages < 1 ||
          spec->max_pages > kMostPages) {
        Error(max, name, "'lookup.pages.max' must be a whole number from 1 to " +
                             std::to_string(kMostPages));
        spec->max_pages = kDefaultMaxPages;
      }
    }
  }

  // Reads `errors.body`: a list of { status?, match: { pointer: value }, class }.
  void ReadBodyRules(const YAML::Node& rules, const std::string& name,
                     std::vector<BodyErrorRule>* out) {
    const std::string shape = "'errors.body' is a list of rules such as { match: { /code: "
                              "RATE_LIMIT }, class: transient }";
    if (!rules.IsSequence() || rules.size() == 0) {
      Error(rules, name, shape);
      return;
    }
    for (const YAML::Node& node : rules) {
      if (!node.IsMap()) {
        Error(node, name, shape);
        continue;
      }
      CheckFields(node, name, {"status", "match", "class"}, "an errors.body rule");
      BodyErrorRule rule;
      if (const YAML::Node status = node["status"]) {
        if (!YAML::convert<int>::decode(status, rule.status) || rule.status < 100 ||
            rule.status > 599) {
          Error(status, name, "'" + (status.IsScalar() ? status.Scalar() : std::string("?")) +
                                  "' is not an HTTP status code");
        }
      }
      const YAML::Node match = node["match"];
      if (!match || !match.IsMap() || match.size() == 0) {
        Error(match ? match : node, name,
              "an errors.body rule needs 'match': JSON pointers to the values that mark it, "
              "e.g. { /status: ERROR, /code: RATE_LIMIT }");
      } else {
        rule.match = PointerValues(match, name, "errors.body match");
      }
      const YAML::Node verdict = node["class"];
      const std::string text = verdict && verdict.IsScalar() ? verdict.Scalar() : "";
      if (text == "transient") {
        rule.verdict = BodyVerdict::kTransient;
      } else if (text == "rejected") {
        rule.verdict = BodyVerdict::kRejected;
      } else if (text == "unknown") {
        rule.verdict = BodyVerdict::kUnknown;
      } else if (text == "exists") {
        rule.verdict = BodyVerdict::kExists;
      } else {
        Error(verdict ? verdict : node, name,
              "an errors.body rule's 'class' must be transient, rejected, unknown or exists");
      }
      out->push_back(std::move(rule));
    }
  }

  void CheckPointer(const YAML::Node& node, const std::string& step, const std::string& pointer) {
    if (pointer.empty()) return;
    if (pointer[0] != '/') {
      Error(node, step, "'" + pointer + "' is not a JSON pointer (it must start with '/')");
    }
  }

  std::string_view source_;
  std::vector<Diagnostic>* diagnostics_;
};

}  // namespace

std::string Diagnostic::ToString() const {
  std::string out = source;
  if (line > 0) out.append(":").append(std::to_string(line));
  out += ": ";
  if (severity == Severity::kWarning) out += "warning: ";
  if (!step.empty()) out += "step '" + step + "': ";
  out += message;
  return out;
}

std::vector<Diagnostic> LintDefinitionText(std::string_view text, std::string_view source,
                                           WorkflowDefinition* out) {
  std::vector<Diagnostic> diagnostics;
  WorkflowDefinition definition;
  if (text.size() > kMaxDefinitionBytes) {
    diagnostics.push_back({std::string(source), 0, "",
                           "definition is " + std::to_string(text.size()) +
                               " bytes; the limit is " + std::to_string(kMaxDefinitionBytes)});
    return diagnostics;
  }
  if (const size_t bad = FirstInvalidUtf8(text); bad != std::string_view::npos) {
    const int line = 1 + static_cast<int>(std::count(text.begin(), text.begin() + bad, '\n'));
    diagnostics.push_back({std::string(source), line, "",
                           "not valid UTF-8 (byte " + std::to_string(bad) + ")"});
    return diagnostics;
  }
  try {
    const YAML::Node root = YAML::Load(std::string(text));
    Reader(source, &diagnostics).Read(root, &definition);
  } catch (const YAML::Exception& e) {
    diagnostics.push_back(
        {std::string(source), e.mark.is_null() ? 0 : e.mark.line + 1, "", "malformed YAML/JSON: " + e.msg});
    return diagnostics;
  }
  definition.source = std::string(source);  // before validating: its messages name the file
  if (diagnostics.empty()) ValidateDefinition(definition, &diagnostics);
  // Warnings refuse nothing: a definition that loads keeps what its templates read.
  if (std::none_of(diagnostics.begin(), diagnostics.end(),
                   [](const Diagnostic& d) { return d.severity == Severity::kError; })) {
    DeriveKeptResponses(&definition);
  }
  // Errors first, then warnings, each in the order found.
  std::stable_partition(diagnostics.begin(), diagnostics.end(),
                        [](const Diagnostic& d) { return d.severity == Severity::kError; });
  definition.text = std::string(text);
  definition.content_hash = Sha256Hex(text);
  if (out != nullptr) *out = std::move(definition);
  return diagnostics;
}

absl::StatusOr<WorkflowDefinition> LoadDefinitionText(std::string_view text,
                                                      std::string_view source) {
  WorkflowDefinition definition;
  auto diagnostics = LintDefinitionText(text, source, &definition);
  std::string message;
  for (const auto& d : diagnostics) {
    if (d.severity != Severity::kError) continue;  // warnings are lint's to show
    if (!message.empty()) message.push_back('\n');
    message += d.ToString();
  }
  if (!message.empty()) return absl::InvalidArgumentError(message);
  return definition;
}

absl::StatusOr<std::vector<TargetSpec>> LoadTargetsText(std::string_view text,
                                                        std::string_view source) {
  std::vector<Diagnostic> diagnostics;
  WorkflowDefinition definition;
  definition.source = std::string(source);
  if (text.size() > kMaxDefinitionBytes) {
    return absl::InvalidArgumentError(std::string(source) + ": " + std::to_string(text.size()) +
                                      " bytes; the limit is " +
                                      std::to_string(kMaxDefinitionBytes));
  }
  if (const size_t bad = FirstInvalidUtf8(text); bad != std::string_view::npos) {
    return absl::InvalidArgumentError(std::string(source) + ": not valid UTF-8 (byte " +
                                      std::to_string(bad) + ")");
  }
  try {
    const YAML::Node root = YAML::Load(std::string(text));
    Reader(source, &diagnostics).ReadTargetsDocument(root, &definition);
  } catch (const YAML::Exception& e) {
    diagnostics.push_back({std::string(source), e.mark.is_null() ? 0 : e.mark.line + 1, "",
                           "malformed YAML/JSON: " + e.msg});
  }
  if (diagnostics.empty()) ValidateDefinition(definition, &diagnostics);
  std::string message;
  for (const auto& d : diagnostics) {
    if (d.severity != Severity::kError) continue;
    if (!message.empty()) message.push_back('\n');
    message += d.ToString();
  }
  if (!message.empty()) return absl::InvalidArgumentError(message);
  return std::move(definition.targets);
}

absl::Status ReadFileText(const std::string& path, size_t max_bytes, std::string* out) {
  std::ifstream file(path, std::ios::binary);
  if (!file) return absl::NotFoundError(path + ": cannot be read");
  std::ostringstream buffer;
  buffer << file.rdbuf();
  if (buffer.str().size() > max_bytes) {
    return absl::InvalidArgumentError(path + ": " + std::to_string(buffer.str().size()) +
                                      " bytes; the limit is " + std::to_string(max_bytes));
  }
  *out = buffer.str();
  return absl::OkStatus();
}

absl::StatusOr<WorkflowDefinition> LoadDefinitionFile(const std::string& path) {
  std::string text;
  if (auto status = ReadFileText(path, kMaxDefinitionBytes, &text); !status.ok()) return status;
  return LoadDefinitionText(text, path);
}

}  // namespace waystone
