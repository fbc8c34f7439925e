#include "verify/contract.h"

#include <algorithm>
#include <regex>
#include <set>

#include <nlohmann/json.hpp>

#include "base/status_macros.h"

namespace waystone::verify {
namespace {

using Json = nlohmann::json;

std::string Lower(std::string text) {
  std::transform(text.begin(), text.end(), text.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return text;
}

std::string StepWhere(const WorkflowDefinition& definition, const StepDefinition& step) {
  return definition.source + ":" + std::to_string(step.line) + ": step '" + step.name + "'";
}

// Collects the literal pieces (4 characters or more) of every string in `tree`.
void Fragments(const Json& tree, std::vector<std::string>* into) {
  if (tree.is_object() || tree.is_array()) {
    for (const Json& item : tree) Fragments(item, into);
    return;
  }
  if (!tree.is_string()) return;
  const std::string text = tree.get<std::string>();
  size_t at = 0;
  while (at < text.size()) {
    const size_t open = text.find("{{", at);
    const std::string piece =
        text.substr(at, open == std::string::npos ? std::string::npos : open - at);
    if (piece.size() >= 4) into->push_back(piece);
    if (open == std::string::npos) break;
    const size_t close = text.find("}}", open);
    if (close == std::string::npos) break;
    at = close + 2;
  }
}

// Builds the route of `request` for `step`, or says why verify cannot stand in.
absl::StatusOr<Route> RouteOf(const WorkflowDefinition& definition, const StepDefinition& step,
                              int index, Role role, const RequestSpec& request) {
  static const std::regex kBase(R"(^\{\{\s*env\.([A-Za-z_][A-Za-z0-9_]*)\s*\}\}(.*)$)");
  std::smatch match;
  if (!std::regex_match(request.url, match, kBase)) {
    return absl::InvalidArgumentError(
        StepWhere(definition, step) + ": its " + std::string(RoleName(role)) + " URL '" +
        request.url +
        "' does not start with {{env.NAME}}; verify points each system's base "
        "URL (an env value) at its simulated target");
  }
  Route route;
  route.step = step.name;
  route.step_index = index;
  route.role = role;
  route.method = request.method;
  route.env = match[1];
  route.timeout = request.timeout;
  route.side_effecting = request.SideEffecting();
  std::string rest = match[2];
  rest = rest.substr(0, rest.find('?'));
  for (std::string& segment : PathSegments(rest)) {
    route.segments.push_back(segment.find("{{") != std::string::npos ? "*" : segment);
  }
  route.creates = route.side_effecting && (request.method == "POST" || request.method == "MAIL");
  route.group = step.group;
  route.branch = step.branch;
  if (!request.body_json.empty()) {
    Fragments(Json::parse(request.body_json, nullptr, false), &route.body_fragments);
  }
  if (request.body_kind == BodyKind::kMail) {
    route.method = "MAIL";
    route.side_effecting = true;
    route.creates = true;
    route.mail_delivery = request.mail.delivery;
    return route;  // an SMTP server keeps no key
  }
  route.key_headers.push_back("idempotency-key");
  for (const auto& [name, value] : request.headers) {
    if (value.find("step.idempotency_key") != std::string::npos ||
        value.find("step.key_uuid") != std::string::npos) {
      route.key_headers.push_back(Lower(name));
    }
  }
  return route;
}

std::string Describe(const Route& route) {
  std::string path;
  for (const std::string& segment : route.segments) path += "/" + segment;
  std::string line = "step '" + route.step + "' " + std::string(RoleName(route.role)) + ": " +
                     route.method + " {{env." + route.env + "}}" + path;
  if (route.method == "MAIL") {
    return "step '" + route.step + "' " + std::string(RoleName(route.role)) +
           ": an email to {{env." + route.env +
           "}} (SMTP) -> a message per DATA, known by its Message-ID; no key is kept";
  }
  if (route.role == Role::kLookup) {
    line += route.items_pointer.empty() ? " -> the object found at " + route.found_pointer
                                        : " -> candidates at " + route.items_pointer;
    line += ", matched by its query and path values against the fields of what step '" +
            route.step + "' created";
  } else if (route.creates) {
    line += " -> a new object (unless its path names one), id at " + route.result_pointer;
    line += route.honors_key ? "; the target honours its key" : "; the target ignores keys";
  } else if (route.side_effecting) {
    line += " -> acts on the object its path names (idempotent by its nature)";
  } else {
    line += " -> a read: the object its path names, or one holding what the templates read";
  }
  return line;
}

void Collect(const std::string& text, const std::regex& pattern, std::set<std::string>* into) {
  for (auto it = std::sregex_iterator(text.begin(), text.end(), pattern);
       it != std::sregex_iterator(); ++it) {
    into->insert((*it)[1]);
  }
}

}  // namespace

std::string_view RoleName(Role role) {
  switch (role) {
    case Role::kCall:
      return "call";
    case Role::kLookup:
      return "lookup";
    case Role::kCompensate:
      return "compensate";
  }
  return "?";
}

int Route::Literals() const {
  return static_cast<int>(std::count_if(segments.begin(), segments.end(),
                                        [](const std::string& s) { return s != "*"; }));
}

std::vector<std::string> PathSegments(std::string_view path) {
  std::vector<std::string> segments;
  size_t at = 0;
  while (at <= path.size()) {
    size_t slash = path.find('/', at);
    if (slash == std::string_view::npos) slash = path.size();
    if (slash > at) segments.emplace_back(path.substr(at, slash - at));
    at = slash + 1;
  }
  return segments;
}

absl::StatusOr<Contract> InferContract(const WorkflowDefinition& definition) {
  Contract contract;
  std::set<std::string> url_envs;
  for (size_t i = 0; i < definition.steps.size(); ++i) {
    const StepDefinition& step = definition.steps[i];
    const int index = static_cast<int>(i);
    if (step.kind == StepKind::kWait || step.kind == StepKind::kApproval) {
      contract.waiting_steps.push_back(index);
      continue;
    }
    if (step.kind == StepKind::kSql) {
      // Its statement needs the integration's own tables, which verify's fresh
      // database does not have: every run would fail there, and prove nothing.
      return absl::UnimplementedError(
          "step '" + step.name +
          "' is a sql step; verify does not explore sql steps yet (its "
          "fresh database lacks the integration's tables, so every run would fail there and "
          "prove nothing); docs/definition-reference.md#sql");
    }
    if (step.kind != StepKind::kHttp) continue;
    WS_ASSIGN_OR_RETURN(Route call, RouteOf(definition, step, index, Role::kCall, step.request));
    call.result_pointer = step.result_external_id.empty() ? "/id" : step.result_external_id;
    call.honors_key = step.idempotency_honored;
    for (const std::string& pointer : step.kept_pointers) call.read_pointers.push_back(pointer);
    url_envs.insert(call.env);
    contract.routes.push_back(std::move(call));
    contract.http_steps.push_back(index);
    if (step.lookup) {
      WS_ASSIGN_OR_RETURN(Route lookup,
                          RouteOf(definition, step, index, Role::kLookup, step.lookup->request));
      lookup.items_pointer = step.lookup->items;
      lookup.found_pointer = step.lookup->found;
      lookup.external_id_pointer = step.lookup->external_id;
      const std::string& url = step.lookup->request.url;
      if (const size_t query = url.find('?'); query != std::string::npos) {
        size_t at = query + 1;
        while (at < url.size()) {
          size_t end = url.find('&', at);
          if (end == std::string::npos) end = url.size();
          const std::string pair = url.substr(at, end - at);
          const size_t eq = pair.find('=');
          if (eq != std::string::npos && pair.find("{{", eq) == std::string::npos) {
            lookup.literal_params.push_back(pair.substr(0, eq));
          }
          at = end + 1;
        }
      }
      contract.routes.back().lookup_id_pointer = step.lookup->external_id;
      url_envs.insert(lookup.env);
      contract.routes.push_back(std::move(lookup));
    }
    if (step.compensate) {
      WS_ASSIGN_OR_RETURN(Route compensate, RouteOf(definition, step, index, Role::kCompensate,
                                                    step.compensate->request));
      compensate.result_pointer = "/id";
      // The same system: it honours the compensation's key as it honours the call's.
      compensate.honors_key = step.idempotency_honored;
      url_envs.insert(compensate.env);
      contract.routes.push_back(std::move(compensate));
    }
  }
  if (contract.http_steps.empty()) {
    return absl::InvalidArgumentError(definition.source +
                                      ": calls no HTTP target; there is nothing to verify");
  }
  for (const Route& route : contract.routes) contract.inferred.push_back(Describe(route));
  for (size_t i = 0; i < contract.routes.size(); ++i) {
    for (size_t j = i + 1; j < contract.routes.size(); ++j) {
      const Route& a = contract.routes[i];
      const Route& b = contract.routes[j];
      if (a.method != "MAIL" && a.method == b.method && a.segments == b.segments &&
          a.body_fragments == b.body_fragments && (a.step != b.step || a.role != b.role)) {
        contract.ambiguous.push_back("step '" + b.step + "' " + std::string(RoleName(b.role)) +
                                     " looks like step '" + a.step + "' " +
                                     std::string(RoleName(a.role)) +
                                     " at the target: its requests count as the other's");
      }
    }
  }
  std::set<std::string> envs, secrets;
  Collect(definition.text, std::regex(R"(env\.([A-Za-z_][A-Za-z0-9_]*))"), &envs);
  Collect(definition.text, std::regex(R"(secret\.([A-Za-z_][A-Za-z0-9_]*))"), &secrets);
  contract.url_envs.assign(url_envs.begin(), url_envs.end());
  for (const Route& route : contract.routes) {
    if (route.method == "MAIL" && std::find(contract.smtp_envs.begin(), contract.smtp_envs.end(),
                                            route.env) == contract.smtp_envs.end()) {
      contract.smtp_envs.push_back(route.env);
    }
  }
  for (const std::string& env : envs) {
    if (!url_envs.contains(env)) contract.other_envs.push_back(env);
  }
  contract.secrets.assign(secrets.begin(), secrets.end());
  return contract;
}

const Route* MatchMail(const Contract& contract, std::string_view delivery) {
  const Route* first = nullptr;
  for (const Route& route : contract.routes) {
    if (route.method != "MAIL") continue;
    if (first == nullptr) first = &route;
    // The delivery template with every {{...}} as a wildcard.
    std::string pattern;
    const std::string& text = route.mail_delivery;
    for (size_t at = 0; at < text.size();) {
      const size_t open = text.find("{{", at);
      const size_t close = open == std::string::npos ? std::string::npos : text.find("}}", open);
      if (close == std::string::npos) {
        pattern +=
            std::regex_replace(text.substr(at), std::regex(R"([.^$|()\[\]{}*+?\\])"), "\\$&");
        break;
      }
      pattern += std::regex_replace(text.substr(at, open - at),
                                    std::regex(R"([.^$|()\[\]{}*+?\\])"), "\\$&");
      pattern += ".*";
      at = close + 2;
    }
    if (!text.empty() && std::regex_match(std::string(delivery), std::regex(pattern)))
      return &route;
  }
  return delivery.empty() ? first : nullptr;
}

const Route* MatchRoute(const Contract& contract, std::string_view method, std::string_view path,
                        std::string_view body) {
  const std::vector<std::string> segments = PathSegments(path);
  const Route* best = nullptr;
  size_t best_held = 0;
  for (const Route& route : contract.routes) {
    if (route.method != method || route.segments.size() != segments.size()) continue;
    bool fits = true;
    for (size_t i = 0; i < segments.size() && fits; ++i) {
      fits = route.segments[i] == "*" || route.segments[i] == segments[i];
    }
    if (!fits) continue;
    // How much of its body's literal text the request holds: all of it, or it is
    // another route's request on the same path.
    size_t held = 0;
    bool holds_all = true;
    for (const std::string& fragment : route.body_fragments) {
      if (body.find(fragment) != std::string_view::npos)
        held += fragment.size();
      else
        holds_all = false;
    }
    if (!holds_all && !body.empty()) held = 0;
    if (best == nullptr || route.Literals() > best->Literals() ||
        (route.Literals() == best->Literals() && held > best_held)) {
      best = &route;
      best_held = held;
    }
  }
  return best;
}

std::string SampleValue(const std::string& pointer_or_path) {
  const std::string lower = Lower(pointer_or_path);
  const size_t last = lower.find_last_of("/.");
  const std::string name = last == std::string::npos ? lower : lower.substr(last + 1);
  if (name.find("email") != std::string::npos || name.find("mail") != std::string::npos) {
    return "verify@example.com";
  }
  return "verify" + pointer_or_path;
}

std::string SynthesizeInput(const WorkflowDefinition& definition) {
  std::set<std::string> paths;
  Collect(definition.text, std::regex(R"(input\.([A-Za-z0-9_\-]+(?:\.[A-Za-z0-9_\-]+)*))"), &paths);
  Json input = Json::object();
  for (const std::string& path : paths) {
    Json* at = &input;
    size_t start = 0;
    while (true) {
      const size_t dot = path.find('.', start);
      const std::string name = path.substr(start, dot == std::string::npos ? dot : dot - start);
      if (!at->is_object()) break;  // a shorter path made it a leaf
      if (dot == std::string::npos) {
        if (!at->contains(name)) (*at)[name] = SampleValue("-" + path);
        break;
      }
      Json& next = (*at)[name];
      if (next.is_null()) next = Json::object();
      at = &next;
      start = dot + 1;
    }
  }
  return input.dump();
}

}  // namespace waystone::verify
