// The message `templates:` and a `notify:` step, read into the steps it runs as
// (one per channel, notify.h). Declared in definition_readers.h.

#include <algorithm>
#include <string>
#include <vector>

#include "definition/definition_readers.h"
#include "definition/notify.h"

namespace waystone {
namespace {
using Json = nlohmann::json;
}  // namespace

// Reads `templates:`: name -> { version: N, text: "..." }.
void NotifyReader::ReadTemplates(const YAML::Node& templates, std::vector<MessageTemplate>* out) {
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
    if (!version || !YAML::convert<int>::decode(version, message.version) || message.version < 1) {
      Error(version ? version : spec, "",
            where +
                " needs 'version', a whole number from 1: a delivery's identity holds "
                "it, so a changed text is a new version");
    }
    message.text = RequiredString(spec, "text", "");
    message.subject = OptionalString(spec, "subject", "");
    out->push_back(std::move(message));
  }
}

// Reads a `notify:` step into the steps it runs as (notify.h), one per channel.
std::vector<StepDefinition> NotifyReader::ReadNotify(
    const YAML::Node& node, const std::vector<MessageTemplate>& templates) {
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
    Error(notify, name,
          "'notify' must be a mapping with 'reports', 'template', 'recipient' "
          "and 'channels'");
    return {};
  }
  CheckFields(notify, name, {"reports", "template", "correction", "recipient", "event", "channels"},
              "notify");
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
  if (const YAML::Node when = node["when"]) {
    ConditionReader(*this).ReadCondition(when, name, &spec.when);
  }
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
        Error(settings[field], name,
              "'" + where + "." + field +
                  "' must be exactly one "
                  "{{secret.NAME}} or {{env.NAME}}: a credential is never "
                  "written into a definition");
      } else if (path && (*path)[0] != "secret" && (*path)[0] != "env") {
        Error(settings[field], name,
              "'" + where + "." + field +
                  "' must come from "
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
          Error(settings["timeout"], name,
                "'" + where + ".timeout' is at least 1s (default " +
                    std::to_string(kEmailTimeout / 60000) + "m)");
        }
        read.timeout = std::max<Millis>(timeout, 0);
      }
      if (!read.url.empty() && !read.url.starts_with("{{") && !read.url.starts_with("smtp://") &&
          !read.url.starts_with("smtps://")) {
        Error(settings["url"], name,
              "'" + where +
                  ".url' is the SMTP server: "
                  "smtp://host:port or smtps://host:port");
      }
      if (read.user.empty() != read.password.empty()) {
        Error(settings, name, "'" + where + "': 'user' and 'password' go together (SMTP AUTH)");
      }
      credential("password", read.password);
      if (message != nullptr && message->subject.empty()) {
        Error(settings, name,
              "'" + where + "': template '" + message->name +
                  "' has no 'subject', which an email needs");
      }
      if (correction != nullptr && correction->subject.empty()) {
        Error(notify["correction"], name,
              "'" + where + "': correction template '" + correction->name +
                  "' has no 'subject', which an email needs");
      }
    } else {
      Error(entry.first, name, "unknown channel '" + channel + "' (known: line, webhook, email)");
      continue;
    }
    spec.channels.push_back(std::move(read));
  }
  if (message == nullptr) return {};
  return ExpandNotify(spec, *message, correction);
}

}  // namespace waystone
