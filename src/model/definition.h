#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "base/clock.h"
#include "model/classify.h"
#include "model/condition.h"
#include "model/retry_policy.h"
#include "model/sql_statement.h"
#include "model/states.h"
#include "model/target_gate.h"

namespace waystone {

// A loaded, validated workflow definition. Immutable value types; templates are
// kept as text (and JSON template trees as JSON text) so this header stays light.

// A file a request sends, its bytes from exactly one of `path` or `base64`. Every
// string is a template.
struct FileSpec {
  std::string part;          // multipart: the part's name ("" for a raw body)
  std::string path;          // relative to the engine's files folder (--files)
  std::string base64;        // the bytes in base64 (from the input or an earlier answer)
  std::string filename;      // multipart: the name the receiver sees; default: path's last segment
  std::string content_type;  // default application/octet-stream
};

// What a request's body is.
enum class BodyKind : uint8_t {
  kJson = 1,       // `body`: a JSON template tree (or no body)
  kForm = 2,       // `form`: application/x-www-form-urlencoded fields
  kMultipart = 3,  // `multipart`: multipart/form-data fields and files
  kFile = 4,       // `body_file`: the raw bytes of one file
  kMail = 5,       // an email (RFC 5322) sent over SMTP to an smtp:// or smtps:// URL
};

// An email a request sends (BodyKind::kMail). Every string is a template.
struct MailSpec {
  std::string from;  // the sender's address (envelope and From:)
  std::string to;    // the one recipient's address (envelope and To:)
  std::string subject;
  std::string text;        // plain text, UTF-8
  std::string message_id;  // the Message-ID's left part; its right part is the From domain
  std::string delivery;    // X-Waystone-Delivery: the delivery's identity
  std::string user;        // SMTP AUTH; "" = none
  std::string password;    // a secret ({{secret.NAME}} or {{env.NAME}})
};

// An HTTP request whose strings are templates.
struct RequestSpec {
  std::string method;                                        // upper case: GET, POST, ...
  std::string url;                                           // template
  std::vector<std::pair<std::string, std::string>> headers;  // name, value template
  BodyKind body_kind = BodyKind::kJson;
  std::string body_json;        // JSON template tree; empty: no body
  std::string fields_json;      // kForm, kMultipart: JSON object, field name -> template
  std::vector<FileSpec> files;  // kMultipart: its files; kFile: exactly one
  MailSpec mail;                // kMail
  Millis timeout = 10'000;

  // Returns true for methods that change something on the other side.
  bool SideEffecting() const;
};

// How to ask the target whether an earlier submission took effect.
// With `found`, the object at that pointer is the one found (and `external_id`
// points into the whole response). With `items`, the array at that pointer holds
// candidates (and `external_id` points into the one candidate). Either way a
// candidate counts only when every `match` pointer (relative to it) equals its
// rendered template; more than one candidate is a contradiction.
struct LookupSpec {
  RequestSpec request;
  std::string found;        // JSON pointer: present and not null = found
  std::string items;        // JSON pointer to an array of candidates (instead of `found`)
  std::string external_id;  // JSON pointer to the external id
  std::vector<std::pair<std::string, std::string>> match;  // pointer, value template
  // `pages:` (with `items` only): every page is read and their candidates judged
  // together. Either `next_pointer` names the next page's link in each answer (a
  // path, "?query" or a same-origin URL; absent, null or "" on the last page), or
  // `page_param` is a query parameter counted up from `first_page` until a page
  // holds no candidate. More pages than `max_pages` leaves the lookup unproven.
  std::string next_pointer;
  std::string page_param;
  int first_page = 1;
  int max_pages = 1;  // 1: not paginated

  bool Paginated() const { return !next_pointer.empty() || !page_param.empty(); }
};

// What an `errors.body` rule makes of an answer that matches it.
enum class BodyVerdict : uint8_t {
  kTransient = 1,  // retried with backoff (a 200 carrying "RATE_LIMIT")
  kRejected = 2,   // not retried (a 200 carrying "VALIDATION")
  kUnknown = 3,    // the outcome is not known: looked up, as after a timeout
  kExists = 4,     // the object exists already ("DUPLICATE"): looked up and adopted
};

// One rule of a step's `errors.body`: a complete answer (with `status`, when set)
// whose JSON body holds every `match` value means `verdict`, whatever its status.
struct BodyErrorRule {
  int status = 0;                                          // 0: any status
  std::vector<std::pair<std::string, std::string>> match;  // JSON pointer, value (text)
  BodyVerdict verdict = BodyVerdict::kTransient;
};

struct CompensationSpec {
  RequestSpec request;
  RetryPolicy retry;
  // Template of the compensation's idempotency key; empty: "<step key>:compensate".
  // A notification's correction has its own delivery identity here.
  std::string idempotency_key;
  // The target keeps no key (an email's SMTP server): a compensation that may have
  // arrived (its answer lost, or the worker stopped while it was on its way) is never
  // sent again by itself; it waits for an operator.
  bool at_most_once = false;
};

enum class StepKind : uint8_t {
  kHttp = 1,       // calls an HTTP API
  kTransform = 2,  // computes a JSON value from templates; no I/O
  kWait = 3,       // waits for an event (POST /v1/events) of a type; its data is the result
  kApproval = 4,   // asks people to approve the instance's material data; waits for a decision
  kSql = 5,        // runs one parameterised statement in the transaction of its checkpoint
};

// A `sql` step (or its compensation): one statement against the Waystone database,
// run in the same transaction as the step's checkpoint and outbox event, so the
// business row and the checkpoint commit together or not at all. Values come only
// through named parameters bound from templates, never spliced into the text.
struct SqlSpec {
  SqlStatement statement;
  // Per parameter name (in statement.names order): its template; nullopt binds NULL.
  std::vector<std::pair<std::string, std::optional<std::string>>> params;
};

// What a rejected approval does to the instance (`approval.on_reject`).
enum class RejectRoute : uint8_t {
  kCompensate = 1,  // the step fails: what completed before it is undone (or failed)
  kClose = 2,       // the instance is closed with the rejection as its reason
  kWait = 3,        // the instance waits for an operator (needs_attention)
};

// An `approval` step: a request bound to the version of the data the approver saw.
// The data version is the SHA-256 of the `material` fields of the instance's input
// (rules/approvals.h); a decision quotes it, so one about other data is refused.
struct ApprovalSpec {
  std::vector<std::string> material;  // JSON pointers into the input ("/amount")
  std::string summary;                // template: the text the approver reads ("" = none)
  std::string requester;              // template: who asked; when set, never the approver
  // Who may decide: tokens of this role or above (viewer, operator, admin) ...
  std::string role = "operator";
  // ... or, when set, only the tokens of this group of the instance's tenant
  // (the server config's `groups:`).
  std::string group;
  RejectRoute on_reject = RejectRoute::kCompensate;
  // Deadlines, from when the request opened (durable timers: the step's next
  // attempt time); 0 = none. A reminder (an approval.reminder event), then the
  // request escalates (`escalate_to` may decide too from then on), then it times
  // out with `on_timeout`: reject (as a rejection: on_reject), close, or wait (the
  // step fails and an operator decides).
  Millis remind_after = 0;
  Millis escalate_after = 0;
  std::string escalate_to;
  Millis timeout = 0;
  RejectRoute on_timeout = RejectRoute::kWait;
  bool timeout_rejects = false;  // on_timeout: reject
};

// What a step keeps of the answer it got (`store_response`). Answers hold
// personal data (names, e-mail addresses, LINE ids): by default a step keeps only
// what the workflow's templates read from it.
enum class ResponseKeep : uint8_t {
  kNeeded = 1,  // default: the pointers the templates read (kept_pointers, derived)
  kAll = 2,     // `store_response: all`
  kNone = 3,    // `store_response: none`: nothing (null)
  kListed = 4,  // `store_response: [/id, /status]`: those pointers (plus what is needed)
};

struct StepDefinition {
  std::string name;
  int line = 0;  // where the step starts in its file (1-based)
  StepKind kind = StepKind::kHttp;
  RecoveryClass recovery = RecoveryClass::kRepeatable;
  RequestSpec request;                    // kind == kHttp
  std::string transform_json;             // kind == kTransform: JSON template tree
  std::string wait_event;                 // kind == kWait: the CloudEvents type it waits for
  Millis wait_timeout = 0;                // kind == kWait: fail after this long; 0: wait forever
  ApprovalSpec approval;                  // kind == kApproval
  SqlSpec sql;                            // kind == kSql
  std::optional<SqlSpec> compensate_sql;  // kind == kSql: its compensation (`compensate: { sql }`)
  std::string result_external_id;         // JSON pointer into the response; empty: none
  std::optional<LookupSpec> lookup;
  std::optional<CompensationSpec> compensate;
  RetryPolicy retry;
  StatusOverrides errors;
  std::vector<BodyErrorRule> body_errors;  // `errors.body`, first match wins
  std::string idempotency_key;             // template; empty: "<instance key>:<step name>"
  bool idempotency_honored = false;        // the target deduplicates on Idempotency-Key
  ResponseKeep store_response = ResponseKeep::kNeeded;
  // For kNeeded and kListed: the JSON pointers kept of the answer (kNeeded: derived
  // from the templates by DeriveKeptResponses; "" = the whole answer is read).
  std::vector<std::string> kept_pointers;
  // `when:`: judged when the step is first due; when it does not hold the step is
  // skipped (state skipped, nothing sent) and the workflow goes on.
  Condition when;
  // `optional: true` (non-critical): a failure that proves nothing was done (rejected,
  // retries exhausted) alerts and the workflow goes on without it (FailStep); one that
  // may have acted waits for an operator, nothing before it undone.
  bool optional = false;
  // `on_failure: pause`: a failure (rejected, retries exhausted) pauses the instance
  // for an operator instead of compensating what came before, such as an approval
  // (alert inconsistency_after_approval when an approval before it was approved).
  bool pause_on_failure = false;
  // Statuses that mean "the target accepted this very request before, under its key"
  // (LINE's 409 for a reused X-Line-Retry-Key): the step completes as if it succeeded.
  std::vector<int> accepted_statuses;
  // Response headers whose value is the external id, the first present wins, when
  // `result_external_id` names none (LINE: X-Line-Accepted-Request-Id, X-Line-Request-Id).
  std::vector<std::string> external_id_headers;
  // How long the target deduplicates the step's key after its first use (LINE: 24 h);
  // 0: as long as the key is kept. Past it an unknown outcome is never resent: the
  // step waits for an operator (transitions.h, BeyondKeyWindow).
  Millis key_window = 0;
  // A channel of a `notify` step: the notify step's name ("" for other steps), and
  // the step whose outcome it reports (which must be committed before it is sent).
  std::string notify;
  std::string reports;
  // A branch of a parallel group (`parallel:`, or the channels of a notify step): the
  // group's name ("" for a step of the main line) and the branch's number from 0. A
  // group's steps are consecutive; each branch runs its own steps in order, and the
  // branches' calls are open side by side (no branch waits for another).
  std::string group;
  int branch = -1;

  // Returns true when the step has something that undoes it (`compensate`).
  bool Compensable() const { return compensate.has_value() || compensate_sql.has_value(); }

  // Returns true when `other` is in another branch of this step's group: neither may
  // read the other's outcome.
  bool Beside(const StepDefinition& other) const {
    return !group.empty() && group == other.group && branch != other.branch;
  }
};

// A message template (`templates:`), by name and version: the version is part of
// every delivery's identity, so a changed text is a new version, never a resend.
struct MessageTemplate {
  std::string name;
  int line = 0;
  int version = 0;      // >= 1
  std::string text;     // template: the message's text (LINE, webhook, email)
  std::string subject;  // template: an email's subject ("" = none; email needs one)
};

// A system the workflow calls (`targets:`), by name: every request whose rendered URL
// starts with its rendered `url` is made with its settings. Each string is a template
// over env and secret only: paths and passphrases come from the deployment.
struct TargetSpec {
  std::string name;
  int line = 0;
  std::string url;        // base URL; "https://erp.example.com/api"
  std::string ca_file;    // PEM bundle of the CAs trusted for this target instead of the system's
  std::string cert_file;  // PEM client certificate (mTLS)
  std::string key_file;   // PEM key of the client certificate
  std::string key_password;  // passphrase of key_file, when it has one
  // `oauth2:` client credentials (RFC 6749 §4.4); token_url empty: none.
  std::string token_url;
  std::string client_id;
  std::string client_secret;  // exactly one {{secret.NAME}} or {{env.NAME}}
  std::string scope;
  // `limits: { rate, concurrency }` and `circuit_breaker: { failures, cool_down }`:
  // shared by every call to the target (by its name, per tenant) from every worker.
  TargetLimits limits;
};

struct WorkflowDefinition {
  std::string name;  // `workflow:`
  std::string description;
  std::string key;  // template over input and env: the business key
  // `retention: { step_keys: 30d }`: how long each step's idempotency key stays
  // pinned to its request; 0 = the engine's default.
  Millis step_key_retention = 0;
  // `redact:`: JSON pointers ("/customer/phone") whose values the API shows as
  // "[redacted]" to tokens without see_redacted: in the input, in step results and
  // in whatever quotes a response body.
  std::vector<std::string> redact;
  // `revision: { reruns: [check-credit] }`: the steps a revision of the instance's
  // input runs again when they have completed (reads and transforms only: nothing
  // that changed something is redone by a revision). Every other completed step
  // stands as it was.
  std::vector<std::string> revision_reruns;
  int revision_line = 0;
  std::vector<StepDefinition> steps;
  std::vector<TargetSpec> targets;         // `targets:`, in file order
  std::vector<MessageTemplate> templates;  // `templates:`, in file order
  std::string source;                      // file name (or "<inline>") used in messages
  std::string text;                        // the exact text loaded; pinned on instances
  std::string content_hash;                // SHA-256 of `text`
  // A workflow written as a C++ function (the embedded API's Workflow): no `steps`
  // and no `key` template; its step rows are appended as the function runs, and the
  // process that registered the function is the one that can run it.
  bool code = false;

  // Returns the index of the step named `name`, or -1.
  int StepIndex(std::string_view step_name) const;
};

// OK when every sql statement of `definition` touches only its tenant's rows
// (SqlStatement::unscoped is empty); else InvalidArgument naming the first that may not:
// "source:line: step 'x': sql.statement is not scoped to its tenant: ...". A runtime with
// `tenants:` registers and runs no other.
absl::Status CheckTenantScoped(const WorkflowDefinition& definition);

// The definition of the code workflow `name` (code set, no steps). Its text, which
// instances pin, names it; ParseCodeWorkflowText reads it back.
WorkflowDefinition CodeWorkflowDefinition(const std::string& name);

// The workflow name when `text` is a code workflow's definition text; nullopt for
// any other text (a YAML definition).
std::optional<std::string> ParseCodeWorkflowText(std::string_view text);

}  // namespace waystone
