#include "definition/validate.h"

#include <algorithm>
#include <initializer_list>
#include <optional>
#include <set>
#include <string_view>

#include <nlohmann/json.hpp>

#include "model/template.h"

namespace waystone {
namespace {

using Json = nlohmann::json;
using Path = std::vector<std::string>;

// Every template of `step`, with where it sits: visit(where, text, is_tree,
// sees_itself). A compensation may read its own step's result; nothing else may.
// The one walk the checks and DeriveKeptResponses share.
template <typename Visit>
void ForEachTemplate(const StepDefinition& step, Visit visit) {
  auto request = [&](const RequestSpec& r, const std::string& where, bool sees_itself) {
    visit(where + ".url", r.url, false, sees_itself);
    for (const auto& [name, value] : r.headers) {
      visit(where + ".headers." + name, value, false, sees_itself);
    }
    visit(where + ".body", r.body_json, true, sees_itself);
    visit(where + ".fields", r.fields_json, true, sees_itself);
    for (const FileSpec& file : r.files) {
      const std::string at = where + ".file" + (file.part.empty() ? "" : "." + file.part);
      visit(at + ".path", file.path, false, sees_itself);
      visit(at + ".base64", file.base64, false, sees_itself);
      visit(at + ".filename", file.filename, false, sees_itself);
      visit(at + ".content_type", file.content_type, false, sees_itself);
    }
    if (r.body_kind == BodyKind::kMail) {
      const MailSpec& mail = r.mail;
      for (const auto& [field, text] :
           {std::pair<const char*, const std::string&>{"from", mail.from},
            {"to", mail.to},
            {"subject", mail.subject},
            {"text", mail.text},
            {"message_id", mail.message_id},
            {"delivery", mail.delivery},
            {"user", mail.user},
            {"password", mail.password}}) {
        visit(where + ".mail." + field, text, false, sees_itself);
      }
    }
  };
  // A condition reads like any template (what it reads of an answer is kept).
  if (!step.when.Always()) visit("when", step.when.value, false, false);
  if (!step.when.other.empty()) visit("when", step.when.other, false, false);
  switch (step.kind) {
    case StepKind::kWait:
      return;
    case StepKind::kApproval:
      visit("approval.summary", step.approval.summary, false, false);
      visit("approval.requester", step.approval.requester, false, false);
      return;
    case StepKind::kTransform:
      visit("transform", step.transform_json, true, false);
      return;
    case StepKind::kSql:
      for (const auto& [name, value] : step.sql.params) {
        if (value) visit("sql.params." + name, *value, false, false);
      }
      if (step.compensate_sql) {
        for (const auto& [name, value] : step.compensate_sql->params) {
          if (value) visit("compensate.sql.params." + name, *value, false, true);
        }
      }
      return;
    case StepKind::kHttp:
      break;
  }
  request(step.request, "request", false);
  visit("idempotency.key", step.idempotency_key, false, false);
  if (step.lookup) {
    request(step.lookup->request, "lookup", false);
    for (const auto& [pointer, value] : step.lookup->match) {
      visit("lookup.match." + pointer, value, false, false);
    }
  }
  if (step.compensate) {
    request(step.compensate->request, "compensate", true);
    visit("compensate.idempotency.key", step.compensate->idempotency_key, false, true);
  }
}

// Where a template sits decides what it may refer to.
struct Scope {
  std::set<std::string> roots;  // allowed first segments
  int visible_steps = 0;        // steps[0 .. visible_steps) may be referred to
  int from = -1;                // the step referring (its parallel branch sees no other)
};

// Returns true when `text` is exactly one "{{root.NAME}}" with root among `roots`.
bool OnlyOneReference(const std::string& text, std::initializer_list<std::string_view> roots) {
  const std::optional<Path> path = SolePlaceholder(text);
  return path && path->size() == 2 &&
         std::find(roots.begin(), roots.end(), (*path)[0]) != roots.end();
}

// Returns the placeholder paths of a template's `text` (a JSON tree's strings when
// `tree`); what does not parse gives what was read of it (the checks report it).
std::vector<Path> ReferencesIn(const std::string& text, bool tree) {
  std::vector<Path> out;
  if (text.empty()) return out;
  if (tree) {
    const Json parsed = Json::parse(text, nullptr, false);
    if (!parsed.is_discarded()) (void)CollectTreeReferences(parsed, &out);
    return out;
  }
  if (auto parsed = Template::Parse(text); parsed.ok()) out = parsed->references();
  return out;
}

// The path a `present`/`absent` condition tests; nullopt for other conditions.
std::optional<Path> PresenceSubject(const Condition& when) {
  if (when.test != Condition::Test::kPresent && when.test != Condition::Test::kAbsent) {
    return std::nullopt;
  }
  return SolePlaceholder(when.value);
}

class Validator {
 public:
  Validator(const WorkflowDefinition& definition, std::vector<Diagnostic>* out)
      : definition_(definition), out_(out) {}

  void Run() {
    CheckText(definition_.key, {{"input", "env"}, 0}, 0, "", "key");
    // A target's settings belong to the deployment: environment and secrets only.
    for (const TargetSpec& target : definition_.targets) {
      const std::string where = "target '" + target.name + "'";
      const Scope deployment{{"env", "secret"}, 0};
      CheckText(target.url, deployment, target.line, "", where + " url");
      CheckText(target.ca_file, deployment, target.line, "", where + " tls.ca_file");
      CheckText(target.cert_file, deployment, target.line, "", where + " tls.cert_file");
      CheckText(target.key_file, deployment, target.line, "", where + " tls.key_file");
      CheckText(target.key_password, deployment, target.line, "", where + " tls.key_password");
      CheckText(target.token_url, deployment, target.line, "", where + " oauth2.token_url");
      CheckText(target.client_id, deployment, target.line, "", where + " oauth2.client_id");
      CheckText(target.client_secret, deployment, target.line, "", where + " oauth2.client_secret");
      CheckText(target.scope, deployment, target.line, "", where + " oauth2.scope");
      // Exactly one reference, no literal part: nothing of a secret in the definition.
      if (!target.key_password.empty() && !OnlyOneReference(target.key_password, {"secret"})) {
        Error(target.line, "",
              where +
                  ": tls.key_password must be a secret "
                  "(\"{{secret.NAME}}\"), never a value in the definition");
      }
      if (!target.client_secret.empty() &&
          !OnlyOneReference(target.client_secret, {"secret", "env"})) {
        Error(target.line, "",
              where +
                  ": oauth2.client_secret must come from a secret or the "
                  "environment (\"{{secret.NAME}}\" or \"{{env.NAME}}\"), "
                  "never a value in the definition");
      }
    }
    for (size_t i = 0; i < definition_.steps.size(); ++i) CheckStep(static_cast<int>(i));
    CheckReruns();
  }

 private:
  // What a revision runs again: reads and transforms of the main line only.
  void CheckReruns() {
    for (const std::string& name : definition_.revision_reruns) {
      const int index = definition_.StepIndex(name);
      if (index < 0) {
        Error(definition_.revision_line, "", "revision.reruns: no step '" + name + "'");
        continue;
      }
      const StepDefinition& step = definition_.steps[index];
      const bool reads = step.kind == StepKind::kTransform ||
                         (step.kind == StepKind::kHttp && !step.request.SideEffecting());
      if (!reads || !step.group.empty()) {
        Error(definition_.revision_line, name,
              "revision.reruns: only a read (GET) or a transform of the main line is run again "
              "by a revision; a step that changed something is never redone");
      }
    }
  }

  void Error(int line, const std::string& step, const std::string& message) {
    out_->push_back({definition_.source, line, step, message});
  }

  void CheckPath(const Path& path, const Scope& scope, int line, const std::string& step,
                 const std::string& where) {
    const std::string shown = "{{" + JoinPath(path) + "}}";
    if (!scope.roots.contains(path[0])) {
      std::string allowed;
      for (const auto& root : scope.roots) allowed += (allowed.empty() ? "" : ", ") + root;
      Error(line, step,
            where + ": " + shown + " cannot be used here (allowed roots: " + allowed + ")");
      return;
    }
    if (path[0] == "instance") {
      // instance.id renders as the instance's public id (base/public_id.h), never
      // the database sequence that every tenant shares.
      static const std::set<std::string> kFields = {"key", "ref", "tenant", "id", "trace_id"};
      if (path.size() != 2 || !kFields.contains(path[1])) {
        Error(line, step,
              where + ": " + shown +
                  " is not one of instance.key, instance.ref, "
                  "instance.tenant, instance.id, instance.trace_id");
      }
    } else if (path[0] == "step") {
      static const std::set<std::string> kFields = {"name", "idempotency_key", "key_uuid"};
      if (path.size() != 2 || !kFields.contains(path[1])) {
        Error(
            line, step,
            where + ": " + shown + " is not one of step.name, step.idempotency_key, step.key_uuid");
      }
    } else if (path[0] == "env" || path[0] == "secret") {
      if (path.size() != 2) Error(line, step, where + ": " + shown + " must name one variable");
    } else if (path[0] == "steps") {
      if (path.size() < 3) {
        Error(line, step,
              where + ": " + shown +
                  " must name a step and a field (response, external_id or output)");
        return;
      }
      const int index = definition_.StepIndex(path[1]);
      if (index < 0) {
        Error(line, step,
              where + ": " + shown + " refers to step '" + path[1] + "', which does not exist");
        return;
      }
      if (index >= scope.visible_steps) {
        Error(line, step,
              where + ": " + shown + " refers to step '" + path[1] +
                  "', which has not run yet at this point");
        return;
      }
      if (scope.from >= 0 && definition_.steps[scope.from].Beside(definition_.steps[index])) {
        Error(line, step,
              where + ": " + shown + " refers to step '" + path[1] +
                  "' in another branch of parallel group '" + definition_.steps[index].group +
                  "', which may not have run yet");
        return;
      }
      static const std::set<std::string> kFields = {"response", "external_id", "output"};
      if (!kFields.contains(path[2])) {
        Error(line, step,
              where + ": " + shown +
                  " must use response, external_id or output of a "
                  "step");
      }
      if ((path[2] == "response" || path[2] == "output") &&
          definition_.steps[index].store_response == ResponseKeep::kNone) {
        Error(line, step,
              where + ": " + shown + " reads the answer of step '" + path[1] +
                  "', which keeps none of it (store_response: none)");
      }
    }
  }

  void CheckText(const std::string& text, const Scope& scope, int line, const std::string& step,
                 const std::string& where) {
    auto parsed = Template::Parse(text);
    if (!parsed.ok()) {
      Error(line, step, where + ": " + std::string(parsed.status().message()));
      return;
    }
    for (const auto& path : parsed->references()) CheckPath(path, scope, line, step, where);
  }

  void CheckTree(const std::string& json_text, const Scope& scope, int line,
                 const std::string& step, const std::string& where) {
    if (json_text.empty()) return;
    std::vector<Path> references;
    auto status = CollectTreeReferences(Json::parse(json_text), &references);
    if (!status.ok()) {
      Error(line, step, where + ": " + std::string(status.message()));
      return;
    }
    for (const auto& path : references) CheckPath(path, scope, line, step, where);
  }

  void CheckStep(int index) {
    const StepDefinition& step = definition_.steps[index];
    const Scope before{{"input", "instance", "steps", "env", "secret", "step"}, index, index};
    const Scope including_self{
        {"input", "instance", "steps", "env", "secret", "step"}, index + 1, index};
    CheckCondition(index);
    CheckReports(index);
    WarnOnMaybeMissing(index);
    WarnOnEmptyExternalId(index);
    auto check = [&](const std::string& where, const std::string& text, bool tree,
                     bool sees_itself) {
      if (where == "when") return;  // CheckCondition: a narrower scope
      const Scope& scope = sees_itself ? including_self : before;
      if (tree) {
        CheckTree(text, scope, step.line, step.name, where);
        return;
      }
      CheckText(text, scope, step.line, step.name, where);
      if (!where.ends_with(".url")) return;
      if (auto parsed = Template::Parse(text); parsed.ok()) {
        if (auto unsafe = parsed->CheckUrl(); !unsafe.ok()) {
          Error(step.line, step.name, where + ": " + std::string(unsafe.message()));
        }
      }
    };
    if (step.kind == StepKind::kWait || step.kind == StepKind::kApproval) {
      const char* what = step.kind == StepKind::kWait ? "a wait step" : "an approval step";
      if (step.kind == StepKind::kApproval) ForEachTemplate(step, check);
      if (step.recovery != RecoveryClass::kRepeatable && step.recovery != RecoveryClass::kManual) {
        Error(step.line, step.name,
              std::string(what) +
                  " calls nothing; its recovery is "
                  "'repeatable' or 'manual'");
      }
      if (step.lookup || step.compensate) {
        Error(step.line, step.name,
              std::string(what) + " has no side effect to look up or compensate");
      }
      if (!step.group.empty() && step.kind == StepKind::kApproval) {
        Error(step.line, step.name, "an approval step stands on the main line, not in a branch");
      }
      if (step.optional && step.kind == StepKind::kApproval) {
        Error(step.line, step.name,
              "an approval step is never optional: a rejection would be "
              "passed over");
      }
      return;
    }
    if (step.kind == StepKind::kSql) {
      ForEachTemplate(step, check);
      // What a statement binds can come back in its rows, kept with the step and shown.
      auto no_secrets = [&](const SqlSpec& spec, const std::string& where) {
        for (const auto& [param, value] : spec.params) {
          if (!value) continue;
          for (const Path& path : ReferencesIn(*value, false)) {
            if (!path.empty() && path[0] == "secret") {
              Error(step.line, step.name,
                    where + ".params." + param +
                        " may not bind a secret: "
                        "a statement's rows are kept with the step and shown");
            }
          }
        }
      };
      no_secrets(step.sql, "sql");
      if (step.compensate_sql) no_secrets(*step.compensate_sql, "compensate.sql");
      WarnUnscoped(step);
      if (step.recovery != RecoveryClass::kRepeatable &&
          step.recovery != RecoveryClass::kCompensable) {
        Error(step.line, step.name,
              "a sql step commits with its checkpoint, so it never has an "
              "unknown outcome; its recovery is 'repeatable' (or "
              "'compensable' with compensate.sql)");
      }
      if (step.recovery == RecoveryClass::kCompensable && !step.compensate_sql) {
        Error(step.line, step.name, "recovery 'compensable' needs compensate.sql");
      }
      if (step.lookup) {
        Error(step.line, step.name, "a sql step has no unknown outcome to look up");
      }
      if (!step.idempotency_key.empty() || step.idempotency_honored) {
        Error(step.line, step.name,
              "a sql step needs no idempotency key: it commits exactly "
              "once, with its checkpoint");
      }
      if (!step.group.empty()) {
        Error(step.line, step.name, "a sql step stands on the main line, not in a branch");
      }
      return;
    }
    if (step.kind == StepKind::kTransform) {
      ForEachTemplate(step, check);
      if (step.recovery != RecoveryClass::kRepeatable) {
        Error(step.line, step.name,
              "a transform step has no side effect; its recovery is "
              "'repeatable'");
      }
      if (step.lookup || step.compensate) {
        Error(step.line, step.name, "a transform step has no side effect to look up or compensate");
      }
      return;
    }
    ForEachTemplate(step, check);
    const bool side_effecting = step.request.SideEffecting();
    if (side_effecting && !step.lookup && !step.idempotency_honored &&
        step.recovery != RecoveryClass::kManual) {
      Error(step.line, step.name,
            "side-effecting " + step.request.method +
                " has no 'lookup', does not declare 'idempotency: { honored: true }' and is not "
                "'recovery: manual': a retry after a timeout could act twice");
    }
    if (step.recovery == RecoveryClass::kCompensable && !step.compensate) {
      Error(step.line, step.name, "recovery 'compensable' needs a 'compensate' request");
    }
    if (step.lookup && !step.result_external_id.empty() && step.lookup->external_id.empty()) {
      Error(step.line, step.name,
            "the step records result.external_id, so its lookup needs 'external_id' too: an "
            "adopted object must bring its id");
    }
    if (step.recovery == RecoveryClass::kLookup && !step.lookup) {
      Error(step.line, step.name, "recovery 'lookup' needs a 'lookup' request");
    }
    if (side_effecting) WarnWithoutTenant(step);
    if (step.recovery == RecoveryClass::kRepeatable && side_effecting &&
        !step.idempotency_honored) {
      Error(step.line, step.name,
            "recovery 'repeatable' means safe to redo, but " + step.request.method +
                " changes something and the target does not honour its idempotency key");
    }
  }

  // A notification announces a business outcome only once it is committed: the step
  // it reports runs before it and cannot end without its outcome (optional).
  void CheckReports(int index) {
    const StepDefinition& step = definition_.steps[index];
    if (step.reports.empty()) return;
    if (index > 0 && definition_.steps[index - 1].notify == step.notify) return;  // said once
    const std::string of = "notify '" + step.notify + "' reports step '" + step.reports + "'";
    const int reported = definition_.StepIndex(step.reports);
    if (reported < 0) {
      Error(step.line, step.notify, of + ", which does not exist");
    } else if (reported >= index) {
      Error(step.line, step.notify,
            of +
                ", which has not run yet at this point: a notification is sent only after the "
                "outcome it announces is committed; move it after '" +
                step.reports + "'");
    } else if (definition_.steps[reported].optional) {
      Error(step.line, step.notify,
            of + ", which is optional and may have failed: it would announce what did not "
                 "happen");
    } else if (step.Beside(definition_.steps[reported])) {
      Error(step.line, step.notify,
            of + ", which is in another branch of parallel group '" + step.group +
                "': it may not be committed yet; report it from after the group");
    }
  }

  // A condition reads what is known when the step is first due: the input, the
  // instance, earlier steps and the environment; never a secret (its value would
  // show in the step's reason).
  void CheckCondition(int index) {
    const StepDefinition& step = definition_.steps[index];
    if (step.when.Always()) return;
    const Scope scope{{"input", "instance", "steps", "env"}, index, index};
    CheckText(step.when.value, scope, step.line, step.name, "when");
    if (!step.when.other.empty()) CheckText(step.when.other, scope, step.line, step.name, "when");
  }

  // Warns where a template reads the result of an earlier step that may have none:
  // skipped by its `when`, or failed and passed over (`optional`); the reader then
  // fails when it renders. A reader whose own `when` is `present` on that step's
  // result is guarded (the condition itself reads it safely).
  void WarnOnMaybeMissing(int index) {
    const StepDefinition& step = definition_.steps[index];
    const std::optional<Path> subject = PresenceSubject(step.when);
    std::set<std::string> guarded;  // steps whose result the reader's `present` tests
    if (step.when.test == Condition::Test::kPresent && subject && subject->size() >= 2 &&
        (*subject)[0] == "steps") {
      guarded.insert((*subject)[1]);
    }
    std::set<std::string> warned;
    ForEachTemplate(step, [&](const std::string& where, const std::string& text, bool tree, bool) {
      if (where == "when" && subject) return;  // testing presence is reading it safely
      for (const Path& path : ReferencesIn(text, tree)) {
        if (path.size() < 2 || path[0] != "steps" || guarded.contains(path[1]) ||
            warned.contains(path[1])) {
          continue;
        }
        const int read = definition_.StepIndex(path[1]);
        if (read < 0 || read >= index) continue;
        const StepDefinition& earlier = definition_.steps[read];
        if (earlier.when.Always() && !earlier.optional) continue;
        warned.insert(path[1]);
        const std::string message =
            where + " reads {{" + JoinPath(path) + "}}, but step '" + earlier.name + "' " +
            (earlier.optional ? "is optional (it may fail and be passed over)"
                              : "may be skipped (when: " + earlier.when.shown + ")") +
            ": this step then fails; guard it with when: { present: \"{{" + JoinPath(path) +
            "}}\" }";
        // A required step failing for want of an optional one's result would undo
        // the business for a failed notification: refused. Otherwise a warning.
        if (earlier.optional && !step.optional) {
          Error(step.line, step.name, message + ", or make this step optional too");
        } else {
          Warn(step.line, step.name, message);
        }
      }
    });
  }

  // Warns about a `present`/`absent` condition on the external id of a step that
  // records none (a transform, a call without result.external_id): always "".
  void WarnOnEmptyExternalId(int index) {
    const StepDefinition& step = definition_.steps[index];
    const std::optional<Path> subject = PresenceSubject(step.when);
    if (!subject) return;
    const Path& path = *subject;
    if (path.size() != 3 || path[0] != "steps" || path[2] != "external_id") return;
    const int read = definition_.StepIndex(path[1]);
    if (read < 0 || read >= index) return;
    const StepDefinition& earlier = definition_.steps[read];
    const bool records = earlier.kind == StepKind::kWait ||
                         (earlier.kind == StepKind::kHttp &&
                          (!earlier.result_external_id.empty() ||
                           (earlier.lookup && !earlier.lookup->external_id.empty())));
    if (!records) {
      Warn(step.line, step.name,
           "when: step '" + earlier.name +
               "' records no external id (no result.external_id), "
               "so {{" +
               JoinPath(path) +
               "}} is never present; test what the step keeps of its "
               "answer instead, e.g. {{steps." +
               earlier.name + ".response.id}}");
    }
  }

  // Returns true when `text` refers to the tenant (instance.tenant or instance.ref).
  static bool NamesTenant(const std::string& text) {
    auto parsed = Template::Parse(text);
    if (!parsed.ok()) return false;
    for (const auto& path : parsed->references()) {
      if (path.size() == 2 && path[0] == "instance" && (path[1] == "tenant" || path[1] == "ref")) {
        return true;
      }
    }
    return false;
  }

  // Warns where an identity sent outside leaves the tenant out: two tenants using
  // the same target would meet there (share a key, adopt each other's objects).
  void WarnWithoutTenant(const StepDefinition& step) {
    if (!step.idempotency_key.empty() && !NamesTenant(step.idempotency_key)) {
      Warn(step.line, step.name,
           "idempotency.key does not include {{instance.tenant}} or {{instance.ref}}: served to "
           "more than one tenant, two tenants' requests could share a key at the target");
    }
    if (step.lookup) {
      bool names = NamesTenant(step.lookup->request.url);
      for (const auto& [pointer, value] : step.lookup->match) names = names || NamesTenant(value);
      if (!names) {
        Warn(step.line, step.name,
             "the lookup neither queries nor matches {{instance.ref}} (or {{instance.tenant}}): "
             "served to more than one tenant, it could adopt another tenant's object; add "
             "match: { \"/ref\": \"{{instance.ref}}\" }");
      }
    }
  }

  // A server with `tenants:` refuses a statement that could touch another tenant's rows
  // (model/sql_tenant_scope.h); lint says so wherever the definition is read.
  void WarnUnscoped(const StepDefinition& step) {
    auto warn = [&](const std::string& field, const SqlSpec& spec) {
      if (spec.statement.unscoped.empty()) return;
      Warn(step.line, step.name,
           field + ".statement is not scoped to its tenant: " + spec.statement.unscoped +
               "; a server with tenants: refuses it (docs/definition-reference.md#sql)");
    };
    warn("sql", step.sql);
    if (step.compensate_sql) warn("compensate.sql", *step.compensate_sql);
  }

  void Warn(int line, const std::string& step, const std::string& message) {
    out_->push_back({definition_.source, line, step, message, Severity::kWarning});
  }

  const WorkflowDefinition& definition_;
  std::vector<Diagnostic>* out_;
};

}  // namespace

void ValidateDefinition(const WorkflowDefinition& definition, std::vector<Diagnostic>* out) {
  Validator(definition, out).Run();
}

namespace {

// Every placeholder path in the workflow's templates.
std::vector<Path> AllReferences(const WorkflowDefinition& definition) {
  std::vector<Path> out;
  auto collect = [&out](const std::string&, const std::string& text, bool tree, bool) {
    std::vector<Path> found = ReferencesIn(text, tree);
    out.insert(out.end(), found.begin(), found.end());
  };
  for (const StepDefinition& step : definition.steps) ForEachTemplate(step, collect);
  return out;
}

std::string PointerOf(const Path& path, size_t from) {
  std::string pointer;
  for (size_t i = from; i < path.size(); ++i) {
    pointer += '/';
    for (char c : path[i]) {
      if (c == '~')
        pointer += "~0";
      else if (c == '/')
        pointer += "~1";
      else
        pointer += c;
    }
  }
  return pointer;
}

}  // namespace

void DeriveKeptResponses(WorkflowDefinition* definition) {
  const std::vector<Path> references = AllReferences(*definition);
  for (StepDefinition& step : definition->steps) {
    if (step.store_response != ResponseKeep::kNeeded &&
        step.store_response != ResponseKeep::kListed) {
      continue;
    }
    std::set<std::string> kept(step.kept_pointers.begin(), step.kept_pointers.end());
    for (const Path& path : references) {
      if (path.size() < 3 || path[0] != "steps" || path[1] != step.name) continue;
      if (path[2] != "response" && path[2] != "output") continue;
      kept.insert(PointerOf(path, 3));  // "" when the whole answer is read
    }
    step.kept_pointers.assign(kept.begin(), kept.end());
  }
}

}  // namespace waystone
