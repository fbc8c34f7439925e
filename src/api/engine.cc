// The public Engine over the engine inside: one store, one HTTP client, one
// worker pool, and the definitions registered by name.

#include "waystone/engine.h"

#include <algorithm>
#include <map>
#include <mutex>
#include <utility>

#include <nlohmann/json.hpp>

#include "api/translate.h"
#include "api/workflow.h"
#include "base/manual_clock.h"
#include "base/mutex.h"
#include "base/random.h"
#include "connectors/http/http_client.h"
#include "definition/loader.h"
#include "engine/engine.h"
#include "engine/operate/operations.h"
#include "model/keys.h"
#include "model/states.h"
#include "store/store.h"
#include "waystone/version.h"

namespace waystone::api {
namespace {

// The public states and the engine's, one to one. Their names are the engine's
// own (model/states.h), the ones the HTTP API and the CLI show.
constexpr std::pair<waystone::InstanceState, InstanceState> kStates[] = {
    {waystone::InstanceState::kRunning, InstanceState::kRunning},
    {waystone::InstanceState::kCompleted, InstanceState::kCompleted},
    {waystone::InstanceState::kCompensating, InstanceState::kCompensating},
    {waystone::InstanceState::kCompensated, InstanceState::kCompensated},
    {waystone::InstanceState::kFailed, InstanceState::kFailed},
    {waystone::InstanceState::kNeedsAttention, InstanceState::kNeedsAttention},
    {waystone::InstanceState::kClosed, InstanceState::kClosed},
};

InstanceState FromModel(waystone::InstanceState state) {
  for (const auto& [model, public_state] : kStates) {
    if (model == state) return public_state;
  }
  return InstanceState::kRunning;
}

bool AtRest(waystone::InstanceState state) {
  return state != waystone::InstanceState::kRunning &&
         state != waystone::InstanceState::kCompensating;
}

class ManualClockImpl final : public ManualClock {
 public:
  // (A FakeClock instantiated here would have its waits exported from the library.)
  explicit ManualClockImpl(Millis start) : clock_(MakeManualClock(start)) {}
  std::chrono::system_clock::time_point Now() const override {
    return std::chrono::system_clock::time_point(std::chrono::milliseconds(clock_->NowMillis()));
  }
  void Advance(std::chrono::milliseconds by) override { AdvanceManualClock(*clock_, by.count()); }
  const waystone::Clock* clock() const { return clock_.get(); }

 private:
  std::unique_ptr<Clock> clock_;
};

// What the engine and its handles share: the last of them to go closes it.
struct Shared {
  std::shared_ptr<ManualClock> manual_clock;  // kept while the engine uses it
  std::unique_ptr<Store> store;
  std::unique_ptr<HttpClient> http;
  SeededRandom random;
  std::unique_ptr<waystone::Engine> engine;
  std::string tenant;

  Result<Outcome> Describe(const InstanceRecord& instance) {
    Outcome outcome;
    outcome.key = instance.key;
    outcome.workflow = instance.workflow;
    outcome.state = FromModel(instance.state);
    outcome.at_rest = AtRest(instance.state);
    outcome.reason = instance.status_reason;
    auto steps = store->GetSteps(instance.id);
    if (!steps.ok()) return FromAbsl(steps.status());
    for (const StepRecord& step : *steps) {
      outcome.steps.push_back({step.name, std::string(waystone::ToString(step.state)),
                               step.attempts, step.external_id, step.response_json,
                               step.error_message});
      // A function workflow's output is its last row's, "$return" (code_runner.cc).
      if (instance.state == waystone::InstanceState::kCompleted && step.name == "$return") {
        outcome.output_json = step.response_json;
      }
    }
    return outcome;
  }
};

class InstanceHandle final : public Instance {
 public:
  InstanceHandle(std::shared_ptr<Shared> shared, int64_t id, std::string key, bool created)
      : shared_(std::move(shared)), id_(id), key_(std::move(key)), created_(created) {}

  const std::string& key() const override { return key_; }
  bool created() const override { return created_; }

  Result<Outcome> Wait(std::chrono::milliseconds timeout) override {
    // No deadline overflows: a year is as long as anyone waits.
    const auto bounded = std::clamp<std::chrono::milliseconds>(
        timeout, std::chrono::milliseconds(0), std::chrono::hours(24 * 365));
    auto instance = shared_->engine->AwaitRest(id_, bounded.count());
    if (!instance.ok()) return FromAbsl(instance.status());
    return shared_->Describe(*instance);
  }

  Result<Outcome> Get() override {
    auto instance = shared_->store->GetInstance(id_);
    if (!instance.ok()) return FromAbsl(instance.status());
    return shared_->Describe(*instance);
  }

 private:
  std::shared_ptr<Shared> shared_;
  const int64_t id_;
  const std::string key_;
  const bool created_;
};

class EngineImpl final : public Engine {
 public:
  explicit EngineImpl(std::shared_ptr<Shared> shared) : shared_(std::move(shared)) {}
  ~EngineImpl() override { shared_->engine->Stop(); }

  Status RegisterFile(const std::string& path) override { return Keep(LoadDefinitionFile(path)); }

  Status RegisterYaml(const std::string& text, const std::string& origin) override {
    return Keep(LoadDefinitionText(text, origin));
  }

  Result<std::unique_ptr<Instance>> Start(const std::string& workflow, const std::string& key,
                                          const std::string& input_json) override {
    std::shared_ptr<const WorkflowDefinition> definition;
    {
      MutexLock lock(mu_);
      auto found = definitions_.find(workflow);
      if (found == definitions_.end()) {
        return Status(Status::Code::kNotFound, "no workflow '" + workflow +
                                                   "' is registered with this engine "
                                                   "(RegisterFile, RegisterYaml or Register)");
      }
      definition = found->second;
    }
    StartRequest request;
    request.tenant = shared_->tenant;
    request.input_json = input_json;
    request.key = key;
    auto started = shared_->engine->StartInstance(*definition, request);
    if (!started.ok()) return FromAbsl(started.status());
    if (started->outcome == StartOutcome::kCollected || started->tombstone) {
      return Status(Status::Code::kFailedPrecondition,
                    "instance '" + started->instance.key + "' ended (" +
                        std::string(waystone::ToString(started->instance.state)) +
                        ") and was removed by gc; its key is not started again");
    }
    return std::unique_ptr<Instance>(
        new InstanceHandle(shared_, started->instance.id, started->instance.key,
                           started->outcome == StartOutcome::kCreated));
  }

  Status RegisterTargets(const std::string& yaml, const std::string& origin) override {
    auto targets = LoadTargetsText(yaml, origin);
    if (!targets.ok()) return FromAbsl(targets.status());
    absl::Status added = shared_->engine->AddCodeTargets(*targets, shared_->tenant);
    if (!added.ok()) {
      return Status(Status::Code::kInvalidArgument, origin + ": " + std::string(added.message()));
    }
    return Status();
  }

  Status RegisterFunction(
      const std::string& name,
      std::function<Result<std::string>(Context&, const std::string&)> function) override {
    if (!function) {
      return Status(Status::Code::kInvalidArgument, "workflow '" + name + "' has no function");
    }
    auto registered = shared_->engine->RegisterCode(
        name, std::make_shared<const FunctionWorkflow>(std::move(function)));
    if (!registered.ok()) return FromAbsl(registered.status());
    auto definition = std::make_shared<const WorkflowDefinition>(std::move(*registered));
    MutexLock lock(mu_);
    definitions_[name] = std::move(definition);
    return Status();
  }

  Status Signal(const std::string& key, const std::string& event_type, const std::string& source,
                const std::string& id, const std::string& data_json) override {
    if (source.empty() || id.empty()) {
      return Status(Status::Code::kInvalidArgument, "an event needs its source and its id");
    }
    if (!data_json.empty() &&
        nlohmann::json::parse(data_json, nullptr, /*allow_exceptions=*/false).is_discarded()) {
      return Status(Status::Code::kInvalidArgument, "an event's data must be JSON");
    }
    waystone::Signal signal;
    signal.tenant = shared_->tenant;
    signal.key = key;
    signal.event_type = event_type;
    signal.source = source;
    signal.id = id;
    signal.data_json = data_json.empty() ? "null" : data_json;
    signal.actor = "embedded";
    auto delivered = shared_->engine->operations().Deliver(signal);
    if (!delivered.ok()) return FromAbsl(delivered.status());
    if (delivered->outcome == SignalOutcome::kConflict) {
      return Status(Status::Code::kFailedPrecondition,
                    "event " + source + " " + id + " was received before with other data");
    }
    return Status();
  }

  Result<std::unique_ptr<Instance>> Find(const std::string& key) override {
    auto instance = shared_->store->FindInstance(shared_->tenant, key);
    if (!instance.ok()) return FromAbsl(instance.status());
    return std::unique_ptr<Instance>(new InstanceHandle(shared_, instance->id, key, false));
  }

 private:
  Status Keep(absl::StatusOr<WorkflowDefinition> loaded) {
    if (!loaded.ok()) return FromAbsl(loaded.status());
    if (auto registered = shared_->engine->Register(*loaded); !registered.ok()) {
      return FromAbsl(registered);
    }
    auto definition = std::make_shared<const WorkflowDefinition>(std::move(*loaded));
    MutexLock lock(mu_);
    definitions_[definition->name] = std::move(definition);
    return Status();
  }

  std::shared_ptr<Shared> shared_;
  Mutex mu_;
  std::map<std::string, std::shared_ptr<const WorkflowDefinition>> definitions_
      ABSL_GUARDED_BY(mu_);
};

}  // namespace

const char* ToString(InstanceState state) {
  for (const auto& [model, public_state] : kStates) {
    // The model's names are string literals: .data() is their terminated text.
    if (public_state == state) return waystone::ToString(model).data();
  }
  return "unknown";
}

const char* Version() { return WAYSTONE_VERSION_STRING; }

Instance::~Instance() = default;
ManualClock::~ManualClock() = default;

std::shared_ptr<ManualClock> ManualClock::Create(std::chrono::system_clock::time_point start) {
  return std::make_shared<ManualClockImpl>(
      std::chrono::duration_cast<std::chrono::milliseconds>(start.time_since_epoch()).count());
}
Engine::~Engine() = default;

Result<std::unique_ptr<Engine>> Engine::Open(const EngineOptions& options) {
  if (options.database.empty()) {
    return Status(Status::Code::kInvalidArgument,
                  "EngineOptions.database: a SQLite file or a postgresql:// URI is required");
  }
  if (options.database_connections < 1) {
    return Status(Status::Code::kInvalidArgument,
                  "EngineOptions.database_connections must be at least 1");
  }
  if (!ValidTenantName(options.tenant)) {
    return Status(Status::Code::kInvalidArgument,
                  "EngineOptions.tenant '" + options.tenant +
                      "' is not a tenant name (1 to 64 letters, digits, '.', '_' or '-')");
  }
  if (options.workers < 0) {
    return Status(Status::Code::kInvalidArgument, "EngineOptions.workers must not be negative");
  }
  auto shared = std::make_shared<Shared>();
  shared->tenant = options.tenant;
  StoreOptions store_options;
  store_options.path = options.database;
  store_options.max_connections = options.database_connections;
  auto store = OpenStore(store_options);
  if (!store.ok()) return FromAbsl(store.status());
  shared->store = std::move(*store);
  shared->http = NewCurlHttpClient({});
  waystone::EngineOptions engine_options;
  engine_options.workers = options.workers > 0 ? options.workers : 1;
  engine_options.lease_duration = options.lease.count();
  engine_options.secrets_file = options.secrets_file;
  engine_options.files_dir = options.files_dir;
  const waystone::Clock* clock = SystemClock::Get();
  if (options.clock != nullptr) {
    const auto* manual = dynamic_cast<const ManualClockImpl*>(options.clock.get());
    if (manual == nullptr) {
      return Status(Status::Code::kInvalidArgument,
                    "EngineOptions.clock: a clock from ManualClock::Create is required");
    }
    shared->manual_clock = options.clock;
    clock = manual->clock();
  }
  auto engine = waystone::Engine::Create(shared->store.get(), shared->http.get(), clock,
                                         &shared->random, engine_options);
  if (!engine.ok()) return FromAbsl(engine.status());
  shared->engine = std::move(*engine);
  if (options.workers > 0) shared->engine->Start();
  return std::unique_ptr<Engine>(new EngineImpl(std::move(shared)));
}

}  // namespace waystone::api
