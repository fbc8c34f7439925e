// RequestReader: a step's request, retry, sql statement, lookup pages and error rules.

#include <algorithm>
#include <set>

#include "definition/definition_readers.h"
#include "model/json_text.h"
#include "model/sql_statement.h"

namespace waystone {

using Json = nlohmann::json;

void RequestReader::ReadRequest(const YAML::Node& node, const std::string& step,
                                const std::string& where, RequestSpec* out) {
  if (!node.IsMap()) {
    Error(node, step, where + " must be a mapping with 'method' and 'url'");
    return;
  }
  CheckFields(node, step,
              {"method", "url", "headers", "body", "form", "multipart", "body_file", "timeout"},
              where);
  out->method = RequiredString(node, "method", step);
  for (auto& c : out->method) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  static const std::set<std::string> kMethods = {"GET", "HEAD",  "OPTIONS", "POST",
                                                 "PUT", "PATCH", "DELETE"};
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

void RequestReader::ReadUpload(const YAML::Node& node, const std::string& step,
                               const std::string& where, RequestSpec* out) {
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
      FileSpec file =
          ReadFileSpec(entry.second, step, "multipart file '" + entry.first.Scalar() + "'");
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
        Error(node["headers"], step,
              "a multipart request sets its own Content-Type (with the "
              "boundary); remove the 'Content-Type' header");
      }
    }
  }
}

FileSpec RequestReader::ReadFileSpec(const YAML::Node& node, const std::string& step,
                                     const std::string& what) {
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
    Error(node, step,
          what +
              " needs exactly one of 'path' (under the files folder) or "
              "'base64'");
  }
  return file;
}

void RequestReader::ReadRetry(const YAML::Node& node, const std::string& step, RetryPolicy* out) {
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

void RequestReader::ReadSql(const YAML::Node& node, const std::string& name,
                            const std::string& where, SqlSpec* out) {
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
    if (IsWaystoneTable(word)) {
      Error(node["statement"], name,
            where + ".statement names '" + word +
                "', one of Waystone's own tables; a sql "
                "step reads and writes the integration's tables only (rename a column of that "
                "name)");
    }
  }
  const YAML::Node params = node["params"];
  if (params && !params.IsMap()) {
    Error(params, name,
          "'" + where +
              ".params' must map each :name of the statement to a "
              "template such as \"{{input.order_id}}\"");
    return;
  }
  for (const std::string& wanted : out->statement.names) {
    const YAML::Node value = params ? params[wanted] : params;
    if (wanted == kTenantParam) {
      // Bound by Waystone: the instance's tenant, never a value the definition chooses.
      if (value) {
        Error(value, name,
              where + ".params." + wanted +
                  " is bound by Waystone to the "
                  "instance's tenant; remove it");
      }
      out->params.emplace_back(wanted, "{{instance.tenant}}");
    } else if (!params || !value) {
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
        Error(entry.first, name,
              where + ".params." + key +
                  " is not used by the statement "
                  "(no :" +
                  key + " in it)");
      }
    }
  }
}

void RequestReader::ReadPages(const YAML::Node& pages, const std::string& name, LookupSpec* spec) {
  constexpr int kDefaultMaxPages = 10;
  constexpr int kMostPages = 1000;
  if (!pages.IsMap()) {
    Error(pages, name,
          "'lookup.pages' must be a mapping such as { next: /next, max: 10 } or "
          "{ param: page, first: 1, max: 10 }");
    return;
  }
  CheckFields(pages, name, {"next", "param", "first", "max"}, "lookup.pages");
  if (spec->items.empty()) {
    Error(pages, name,
          "'lookup.pages' needs 'items': the candidates of every page are judged "
          "together");
  }
  if (pages["next"] && pages["param"]) {
    Error(pages, name,
          "'lookup.pages' follows 'next' (a link in each answer) or counts up "
          "'param', not both");
  } else if (pages["next"]) {
    spec->next_pointer = RequiredString(pages, "next", name);
    CheckPointer(pages["next"], name, spec->next_pointer);
  } else if (pages["param"]) {
    spec->page_param = RequiredString(pages, "param", name);
  } else {
    Error(pages, name,
          "'lookup.pages' needs 'next' (a JSON pointer to the next page's link) "
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
      Error(max, name,
            "'lookup.pages.max' must be a whole number from 1 to " + std::to_string(kMostPages));
      spec->max_pages = kDefaultMaxPages;
    }
  }
}

void RequestReader::ReadBodyRules(const YAML::Node& rules, const std::string& name,
                                  std::vector<BodyErrorRule>* out) {
  const std::string shape =
      "'errors.body' is a list of rules such as { match: { /code: "
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
        Error(status, name,
              "'" + (status.IsScalar() ? status.Scalar() : std::string("?")) +
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

}  // namespace waystone
