#include "definition/plan.h"

#include <sstream>

#include "model/duration.h"

namespace waystone {
namespace {

// `text` on one line: each run of blanks and line breaks one space, none at the ends.
std::string OneLine(const std::string& text) {
  std::string out;
  for (char c : text) {
    const bool blank = c == ' ' || c == '\n' || c == '\t' || c == '\r';
    if (blank) {
      if (!out.empty() && out.back() != ' ') out += ' ';
    } else {
      out += c;
    }
  }
  while (!out.empty() && out.back() == ' ') out.pop_back();
  return out;
}

std::string Key(const StepDefinition& step) {
  return step.idempotency_key.empty() ? "{{instance.key}}:" + step.name : step.idempotency_key;
}

std::string RetryText(const RetryPolicy& retry) {
  std::ostringstream out;
  out << "retry up to " << retry.max_attempts << " attempts in all, backoff "
      << retry.initial_interval << "ms x" << retry.multiplier << " up to " << retry.max_interval
      << "ms with full jitter, Retry-After honoured";
  return out.str();
}

}  // namespace

std::string RenderPlan(const WorkflowDefinition& definition) {
  std::ostringstream out;
  out << "Recovery plan for workflow '" << definition.name << "' (" << definition.source << ")\n";
  out << "business key: " << definition.key << "\n";
  out << "definition hash: " << definition.content_hash.substr(0, 16) << "\n";
  for (const TargetSpec& target : definition.targets) {
    out << "target " << target.name << ": " << target.url;
    if (!target.ca_file.empty()) out << "; trusts the CAs of " << target.ca_file;
    if (!target.cert_file.empty()) out << "; client certificate " << target.cert_file;
    if (!target.token_url.empty()) {
      out << "; OAuth2 client credentials from " << target.token_url
          << " (one token per worker, renewed before it expires; a 401 renews it and resends "
             "once)";
    }
    const TargetLimits& limits = target.limits;
    if (limits.rate > 0) out << "; at most " << limits.rate << " calls a second";
    if (limits.concurrency > 0) out << "; at most " << limits.concurrency << " calls at once";
    if (limits.breaker_failures > 0) {
      out << "; circuit opens after " << limits.breaker_failures
          << " consecutive transient failures, one probe after "
          << FormatDuration(limits.cool_down);
    }
    if (limits.Any()) out << " (shared by every worker on the database)";
    out << "; an operator can pause it";
    out << "\n";
  }
  out << "\n";
  int number = 1;
  for (const auto& step : definition.steps) {
    out << number++ << ". " << step.name << "  [" << ToString(step.recovery) << "]"
        << (step.optional ? "  optional" : "") << "\n";
    if (!step.group.empty()) {
      out << "   parallel:   branch " << step.branch + 1 << " of group '" << step.group
          << "': its own checkpoints and retries; a branch waiting for a retry or an event "
             "holds no other (one waiting for an operator pauses the instance); what follows "
             "the group runs once every branch is done\n";
    }
    if (!step.when.Always()) {
      out << "   when:       " << step.when.shown
          << "  (judged once, when the step is first due; otherwise skipped, nothing sent)\n";
    }
    if (step.optional) {
      out << "   optional:   a failure that proves nothing was done (rejected, retries "
             "exhausted) alerts (optional_step_failed) and the workflow goes on without it; "
             "after an unknown outcome or a key conflict it waits for an operator, the steps "
             "before it standing\n";
    }
    if (step.kind == StepKind::kWait) {
      out << "   waits for an event of type " << step.wait_event << " (POST /v1/events)"
          << (step.wait_timeout > 0 ? "; fails after " + FormatDuration(step.wait_timeout)
                                    : std::string("; no deadline"))
          << "; a redelivered event has no second effect\n\n";
      continue;
    }
    if (step.kind == StepKind::kApproval) {
      const ApprovalSpec& a = step.approval;
      std::string material;
      for (const std::string& pointer : a.material) {
        material += (material.empty() ? "" : ", ") + pointer;
      }
      out << "   asks for approval of the input's " << material
          << " (their hash is the data version every decision quotes)\n"
          << "   decided by: "
          << (a.group.empty() ? "tokens of role " + a.role + " or above"
                              : "the tenant's group " + a.group)
          << (a.requester.empty() ? std::string()
                                  : "; never by the requester (" + a.requester + ")")
          << "; the first decision wins, a later one is refused (409) and audited\n"
          << "   rejected:   "
          << (a.on_reject == RejectRoute::kClose  ? "close the instance"
              : a.on_reject == RejectRoute::kWait ? "pause for an operator"
                                                  : "fail the instance and compensate")
          << "\n\n";
      continue;
    }
    if (step.kind == StepKind::kTransform) {
      out << "   computes a value from templates; no external call; rerun on recovery\n\n";
      continue;
    }
    if (step.kind == StepKind::kSql) {
      out << "   runs SQL:   " << OneLine(step.sql.statement.text) << "\n"
          << "   commits with the step's checkpoint and event in one transaction: both or "
             "neither, never one without the other; a failed statement fails the step "
             "(nothing written)\n";
      if (step.compensate_sql) {
        out << "   compensate: " << OneLine(step.compensate_sql->statement.text)
            << "  (committed with the compensation's checkpoint)\n";
      }
      out << "\n";
      continue;
    }
    const bool side_effecting = step.request.SideEffecting();
    const char* failed = step.optional ? "alert and go on without it"
                         : step.recovery == RecoveryClass::kManual || step.pause_on_failure
                             ? "pause for an operator, nothing undone"
                             : "fail the instance and compensate";
    out << "   call:       " << step.request.method << " " << step.request.url << "  (timeout "
        << step.request.timeout << "ms)\n";
    if (step.request.body_kind == BodyKind::kForm) {
      out << "   sends:      form fields (application/x-www-form-urlencoded)\n";
    }
    for (const FileSpec& file : step.request.files) {
      out << "   sends:      "
          << (file.part.empty() ? "the raw bytes of " : "multipart file '" + file.part + "' from ")
          << (file.path.empty() ? "base64 " + file.base64 : "the files folder's " + file.path)
          << ", pinned by SHA-256 before the first attempt (changed later: a conflict, never "
             "sent)\n";
    }
    if (side_effecting && step.request.body_kind == BodyKind::kMail) {
      out << "   idem. key:  " << Key(step)
          << "  (the email's Message-ID derives from it, the "
             "same on every attempt; an SMTP server keeps no key)\n";
    } else if (side_effecting) {
      out << "   idem. key:  " << Key(step) << "  (sent as Idempotency-Key on every attempt"
          << (step.idempotency_honored ? "; the target honours it" : "") << ")\n";
    }
    out << "   transient:  " << RetryText(step.retry) << "; when exhausted: " << failed << "\n";
    out << "   rejected:   no retry; " << failed << "\n";
    out << "   unknown:    ";
    if (!side_effecting) {
      out << "safe to repeat: retry\n";
    } else if (step.lookup) {
      out << "look up " << step.lookup->request.method << " " << step.lookup->request.url;
      if (step.lookup->items.empty()) {
        out << "; found at " << step.lookup->found;
      } else {
        out << "; candidates at " << step.lookup->items;
      }
      for (const auto& [pointer, value] : step.lookup->match) {
        out << ", " << pointer << " = " << value;
      }
      const LookupSpec& lookup = *step.lookup;
      if (!lookup.next_pointer.empty()) {
        out << "; every page, following " << lookup.next_pointer << " (same origin, at most "
            << lookup.max_pages << " pages)";
      } else if (!lookup.page_param.empty()) {
        out << "; every page, counting ?" << lookup.page_param << "= up from " << lookup.first_page
            << " to an empty page (at most " << lookup.max_pages << " pages)";
      }
      out << ", no earlier than " << step.request.timeout << "ms after the request left";
      out << " -> adopt it";
      if (!step.lookup->external_id.empty())
        out << " (external id " << step.lookup->external_id << ")";
      out << "; several -> pause (lookup_contradiction); not found -> resubmit with the same "
             "idempotency key\n";
    } else if (step.recovery == RecoveryClass::kManual) {
      out << "pause; an operator confirms what happened\n";
    } else {
      out << "resubmit with the same idempotency key (the target deduplicates)\n";
    }
    if (!step.errors.empty()) {
      out << "   overrides:  ";
      bool first = true;
      for (const auto& [status, error_class] : step.errors) {
        out << (first ? "" : ", ") << status << " -> " << ToString(error_class);
        first = false;
      }
      out << "\n";
    }
    for (const BodyErrorRule& rule : step.body_errors) {
      out << "   body rule:  ";
      if (rule.status != 0) out << "HTTP " << rule.status << " with ";
      bool first = true;
      for (const auto& [pointer, value] : rule.match) {
        out << (first ? "" : " and ") << pointer << " = " << value;
        first = false;
      }
      out << " -> ";
      switch (rule.verdict) {
        case BodyVerdict::kTransient:
          out << "transient";
          break;
        case BodyVerdict::kRejected:
          out << "rejected";
          break;
        case BodyVerdict::kUnknown:
          out << "unknown";
          break;
        case BodyVerdict::kExists:
          out << "exists: never resent; " << (step.lookup ? "look up and adopt" : "pause");
          break;
      }
      out << "\n";
    }
    if (step.compensate) {
      out << "   compensate: " << step.compensate->request.method << " "
          << step.compensate->request.url << "  key " << Key(step) << ":compensate; "
          << RetryText(step.compensate->retry)
          << "; when it fails: stop, alert, step compensation_failed\n";
    } else if (side_effecting) {
      out << "   compensate: none (stays done if a later step fails)\n";
    }
    out << "\n";
  }
  out << "On failure, completed steps with a compensation are compensated in reverse order.\n";
  bool approvals = false;
  for (const StepDefinition& step : definition.steps) {
    approvals = approvals || step.kind == StepKind::kApproval;
  }
  if (approvals || !definition.revision_reruns.empty()) {
    std::string reruns;
    for (const std::string& name : definition.revision_reruns) {
      reruns += (reruns.empty() ? "" : ", ") + name;
    }
    out << "On a revision of the input (POST /v1/instances/{key}/revise): an open approval "
           "whose material fields changed is cancelled and requested again on the new data; "
        << (reruns.empty() ? std::string("no completed step runs again")
                           : "the completed steps " + reruns + " run again; no other")
        << "; a decided approval is never reopened by a change to its material fields "
           "(refused) unless it was rejected and waits for an operator.\n";
  }
  return out.str();
}

}  // namespace waystone
