#include "definition/loader.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <set>
#include <sstream>

#include "base/sha256.h"
#include "base/utf8.h"
#include "definition/definition_readers.h"
#include "definition/notify.h"
#include "definition/validate.h"
#include "model/duration.h"
#include "model/json_text.h"
#include "model/template.h"

namespace waystone {
namespace {

using Json = nlohmann::json;

// Reads one YAML document into a WorkflowDefinition, recording problems with the
// line they were found on. yaml-cpp exceptions stop at this class.
class Reader : public RequestReader {
 public:
  using RequestReader::RequestReader;

  // A document of `targets:` alone (the targets of C++ workflows).
  void ReadTargetsDocument(const YAML::Node& root, WorkflowDefinition* out) {
    if (!root.IsMap() || !root["targets"]) {
      Error(root, "",
            "a targets document is a mapping with 'targets', e.g. targets: { erp: "
            "{ url: \"{{env.ERP_URL}}\" } }");
      return;
    }
    CheckFields(root, "", {"targets"}, "targets document");
    TargetReader(*this).ReadTargets(root["targets"], &out->targets);
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
    if (const YAML::Node targets = root["targets"]) {
      TargetReader(*this).ReadTargets(targets, &out->targets);
    }
    if (const YAML::Node templates = root["templates"])
      NotifyReader(*this).ReadTemplates(templates, &out->templates);
    if (const YAML::Node redact = root["redact"]) {
      if (!redact.IsSequence()) {
        Error(redact, "", "'redact' must be a list of JSON pointers such as [/customer/phone]");
      } else {
        for (const YAML::Node& pointer : redact) {
          if (!pointer.IsScalar() || !ValidJsonPointer(pointer.Scalar())) {
            Error(pointer, "",
                  "'redact' entry '" + (pointer.IsScalar() ? pointer.Scalar() : "?") +
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
      Error(root["workflow"], "",
            "workflow name '" + out->name + "' may only use letters, digits, '-', '_' and '.'");
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
          Error(node, read[0].notify,
                "duplicate name (a notify step's name is also the name of "
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
          Error(node, step.name,
                "duplicate step name" + (step.notify.empty()
                                             ? std::string()
                                             : " (a channel of notify '" + step.notify + "')"));
        }
        out->steps.push_back(std::move(step));
      }
    }
  }

 private:
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
            (sql ? 1 : 0) >
        1) {
      Error(node, name, "a step has one of 'request', 'transform', 'wait', 'approval' or 'sql'");
    } else if (sql) {
      step->kind = StepKind::kSql;
      ReadSql(sql, name, "sql", &step->sql);
    } else if (approval) {
      step->kind = StepKind::kApproval;
      ApprovalReader(*this).ReadApproval(approval, name, &step->approval);
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
      Error(node, name,
            "a step needs 'request' (an HTTP call), 'transform' (a computed value), "
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
      if (!on_failure.IsScalar() ||
          (on_failure.Scalar() != "pause" && on_failure.Scalar() != "default")) {
        Error(on_failure, name,
              "'on_failure' must be pause (wait for an operator, nothing "
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
        Error(keep, name,
              "'store_response' is all, none or a list of JSON pointers such as "
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
          Error(lookup, name,
                "a lookup has 'found' (one object) or 'items' (candidates), not both");
        } else if (lookup["items"]) {
          spec.items = RequiredString(lookup, "items", name);
          CheckPointer(lookup["items"], name, spec.items);
        } else {
          spec.found = RequiredString(lookup, "found", name);
          CheckPointer(lookup["found"], name, spec.found);
        }
        if (const YAML::Node match = lookup["match"]) {
          if (!match.IsMap() || match.size() == 0) {
            Error(match, name,
                  "'lookup.match' maps JSON pointers to expected values, e.g. "
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
          Error(compensate, name,
                "a sql step's compensate needs 'sql' (a statement that undoes "
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
        Error(errors, name,
              "'errors' must map HTTP status codes to transient, rejected or unknown");
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
            Error(entry.second, name,
                  "error class for " + entry.first.Scalar() +
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

    if (const YAML::Node when = node["when"]) {
      ConditionReader(*this).ReadCondition(when, name, &step->when);
    }
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
    if (node.IsMap() && node["notify"]) return NotifyReader(*this).ReadNotify(node, templates);
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
      Error(branches, name,
            "'parallel' is a list of at least two branches, each a step or "
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
    diagnostics.push_back(
        {std::string(source), line, "", "not valid UTF-8 (byte " + std::to_string(bad) + ")"});
    return diagnostics;
  }
  try {
    const YAML::Node root = YAML::Load(std::string(text));
    Reader(source, &diagnostics).Read(root, &definition);
  } catch (const YAML::Exception& e) {
    diagnostics.push_back({std::string(source), e.mark.is_null() ? 0 : e.mark.line + 1, "",
                           "malformed YAML/JSON: " + e.msg});
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
