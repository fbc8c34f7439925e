#include "verify/oracles.h"

#include <map>
#include <set>

namespace waystone::verify {
namespace {

const RunResult::Step* StepNamed(const RunResult& result, const std::string& name) {
  for (const RunResult::Step& step : result.steps) {
    if (step.name == name) return &step;
  }
  return nullptr;
}

std::string Join(const std::vector<std::string>& items) {
  std::string joined;
  for (const std::string& item : items) joined += (joined.empty() ? "" : ", ") + item;
  return joined;
}

// The events the relay delivered: each at least once with one content, none for a
// step the instance does not record as done, and the instance's last one among them.
void JudgeEvents(const Observed& observed, const RunResult& result,
                 std::vector<std::string>* broken) {
  std::map<std::string, std::string> bodies;
  std::set<std::string> types;
  std::set<std::string> objects;
  for (const Effect& effect : observed.effects) objects.insert(effect.object);
  static const std::set<std::string> kDone{"completed", "compensating", "compensated",
                                           "compensation_failed"};
  for (const DeliveredEvent& event : observed.events) {
    types.insert(event.type);
    auto [it, first] = bodies.emplace(event.id, event.body);
    if (!first && it->second != event.body) {
      broken->push_back("event " + event.id + " was delivered twice with different contents");
    }
    if (event.type != "waystone.step.completed") continue;
    const RunResult::Step* step = StepNamed(result, event.step);
    if (step == nullptr || !kDone.contains(step->state)) {
      broken->push_back("an event says step '" + event.step +
                        "' completed, but the instance records it " +
                        (step == nullptr ? std::string("absent") : step->state));
    }
    if (!event.external_id.empty() && event.external_id.starts_with("v") &&
        event.external_id.find("-" + event.step) != std::string::npos &&
        !objects.contains(event.external_id)) {
      broken->push_back("an event announces '" + event.external_id + "' for step '" + event.step +
                        "', which its target never holds");
    }
  }
  static const std::map<std::string, std::string> kLast{
      {"completed", "waystone.instance.completed"},
      {"compensated", "waystone.instance.compensated"},
      {"failed", "waystone.instance.failed"},
      {"needs_attention", "waystone.instance.needs_attention"}};
  if (auto last = kLast.find(result.state); last != kLast.end() && !types.contains(last->second)) {
    broken->push_back("the instance rests " + result.state + ", but its event " + last->second +
                      " was never delivered (" + std::to_string(observed.events.size()) +
                      " events were)");
  }
}

}  // namespace

std::vector<std::string> Judge(const Contract& contract, const Observed& observed,
                               const RunResult& result, bool clean) {
  std::vector<std::string> broken;
  for (const std::string& request : observed.unmatched) {
    broken.push_back("a request no route of the definition fits reached the target: " + request);
  }
  if (!result.reported) {
    broken.push_back("no result: " + result.problem);
    return broken;
  }
  // At rest, with a reason an operator can act on.
  static const std::set<std::string> kRest{"completed", "compensated", "failed", "closed",
                                           "needs_attention"};
  if (!kRest.contains(result.state)) {
    broken.push_back("the instance did not come to rest once the faults stopped (it is " +
                     result.state + ")");
  } else if (clean && result.state != "completed") {
    broken.push_back("with nothing injected the instance rests " + result.state + " (" +
                     result.reason +
                     "): verify's simulated target does not answer as this "
                     "definition expects, so no other row proves anything");
  } else if (clean) {
    for (const RunResult::Step& step : result.steps) {
      if (step.state != "completed" && step.state != "skipped") {
        broken.push_back("with nothing injected step '" + step.name + "' ended " + step.state +
                         " (" + result.reason +
                         "): verify's simulated target does not answer as this "
                         "definition expects");
      }
    }
  } else if (result.state != "completed" && result.reason.empty()) {
    broken.push_back("the instance rests " + result.state + " without a reason");
  }
  if (result.state == "needs_attention" && result.open_alerts.empty()) {
    broken.push_back("the instance waits for an operator, but no alert says why (" + result.reason +
                     ")");
  }

  // At most one business effect per step identity, its call's and its compensation's.
  std::map<std::string, std::vector<std::string>> created, compensated;
  std::map<std::string, int> created_seq, compensated_seq;
  for (const Effect& effect : observed.effects) {
    auto& into = effect.role == Role::kCompensate ? compensated : created;
    into[effect.step].push_back(effect.object + " (" + effect.action + ")");
    auto& seq = effect.role == Role::kCompensate ? compensated_seq : created_seq;
    if (!seq.contains(effect.step)) seq[effect.step] = effect.seq;
  }
  for (const auto& [step, effects] : created) {
    if (effects.size() > 1) {
      broken.push_back("step '" + step + "' took effect " + std::to_string(effects.size()) +
                       " times at its target: " + Join(effects));
    }
  }
  for (const auto& [step, effects] : compensated) {
    if (effects.size() > 1) {
      broken.push_back("the compensation of '" + step + "' took effect " +
                       std::to_string(effects.size()) + " times: " + Join(effects));
    }
  }

  // What the target holds is what the instance records.
  const bool paused = result.state == "needs_attention";
  for (const auto& [step, effects] : created) {
    const RunResult::Step* recorded = StepNamed(result, step);
    const std::string state = recorded != nullptr ? recorded->state : "absent";
    if (state == "completed" || state == "compensated" || state == "compensating" ||
        state == "compensation_failed") {
      const Effect* first = nullptr;
      for (const Effect& effect : observed.effects) {
        if (effect.step == step && effect.role == Role::kCall) {
          first = &effect;
          break;
        }
      }
      if (first != nullptr && first->action == "create" && recorded != nullptr &&
          !recorded->external_id.empty() && recorded->external_id != first->object) {
        broken.push_back("step '" + step + "' recorded external id '" + recorded->external_id +
                         "', but its target created '" + first->object + "'");
      }
      continue;
    }
    // While the instance waits for an operator, a step that has not settled yet
    // (unknown, or due to be sent again under its key or after its lookup) may hold
    // an effect it does not record; one recorded failed, skipped or compensated may not.
    if (!paused || (state != "unknown" && state != "running" && state != "pending")) {
      broken.push_back("the target holds the effect of step '" + step + "' (" + Join(effects) +
                       "), but the instance records the step " + state + " and rests " +
                       result.state +
                       (paused ? ", asking about another step" : " with no operator asked"));
    }
  }
  // And what the instance records as done, the target holds.
  for (const Route& route : contract.routes) {
    if (route.role != Role::kCall || !route.side_effecting || route.forwarded) continue;
    const RunResult::Step* recorded = StepNamed(result, route.step);
    if (recorded != nullptr && recorded->state == "completed" && !created.contains(route.step)) {
      broken.push_back("the instance records step '" + route.step +
                       "' completed, but its target holds nothing from it");
    }
  }

  // Compensation: only over steps that took effect, exactly once each, in reverse order.
  for (const auto& [step, effects] : compensated) {
    if (!created.contains(step)) {
      broken.push_back("the compensation of '" + step + "' took effect, but the step never did");
    }
  }
  if (result.state == "completed" && !compensated.empty()) {
    broken.push_back("the instance completed, yet compensations took effect");
  }
  if (result.state == "compensated") {
    for (const Route& route : contract.routes) {
      if (route.role != Role::kCompensate || !created.contains(route.step)) continue;
      if (!compensated.contains(route.step)) {
        broken.push_back("the instance is compensated, but step '" + route.step +
                         "' took effect and was never compensated");
      }
    }
  }
  JudgeEvents(observed, result, &broken);
  for (const auto& [step, ids] : result.looked_up) {
    const RunResult::Step* recorded = StepNamed(result, step);
    if (ids.size() > 1) {
      broken.push_back("the lookup of '" + step + "' finds " + std::to_string(ids.size()) +
                       " objects at the target: " + Join(ids));
    } else if (recorded != nullptr && recorded->state == "completed" &&
               !recorded->external_id.empty() &&
               (ids.empty() || ids.front() != recorded->external_id)) {
      broken.push_back("step '" + step + "' recorded '" + recorded->external_id +
                       "', but its lookup finds " +
                       (ids.empty() ? std::string("nothing") : ids.front()));
    }
  }
  auto beside = [&](const std::string& a, const std::string& b) {
    const Route* ra = nullptr;
    const Route* rb = nullptr;
    for (const Route& route : contract.routes) {
      if (route.step == a) ra = &route;
      if (route.step == b) rb = &route;
    }
    return ra != nullptr && rb != nullptr && !ra->group.empty() && ra->group == rb->group &&
           ra->branch != rb->branch;
  };
  for (const auto& [a, a_comp] : compensated_seq) {
    for (const auto& [b, b_comp] : compensated_seq) {
      if (!created_seq.contains(a) || !created_seq.contains(b) || beside(a, b)) continue;
      if (created_seq[a] < created_seq[b] && a_comp < b_comp) {
        broken.push_back("'" + a + "' was compensated before '" + b +
                         "', though it took effect first (compensations run in reverse)");
      }
    }
  }
  return broken;
}

}  // namespace waystone::verify
