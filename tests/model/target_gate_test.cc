// The rules that protect a fragile target, without I/O: pause, circuit breaker,
// concurrency cap and rate limit (model/target_gate.h).

#include "model/target_gate.h"

#include <gtest/gtest.h>

namespace waystone {
namespace {

TargetControl Control() {
  TargetControl control;
  control.tenant = "acme";
  control.target = "erp";
  return control;
}

TEST(TargetGateTest, APausedTargetAdmitsNothingAndSaysWhoPausedItAndWhy) {
  TargetControl control = Control();
  control.paused = true;
  control.paused_by = "alice";
  control.pause_reason = "ERP maintenance until 06:00";
  control.paused_at = 1'700'000'000'000;
  const Admission admission = Admit(control, {}, 1'700'000'000'500, 1000, 30'000);
  EXPECT_FALSE(admission.admitted);
  EXPECT_TRUE(admission.reason.starts_with(kAwaitingTarget)) << admission.reason;
  EXPECT_NE(admission.reason.find("'erp': paused by alice at 2023-11-14T22:13:20.000Z: ERP "
                                  "maintenance until 06:00"),
            std::string::npos)
      << admission.reason;
  EXPECT_GT(admission.retry_at, 1'700'000'000'500);
}

TEST(TargetGateTest, TheRateLimitSpacesSlotsAndRefusesBeyondTheHorizon) {
  TargetControl control = Control();
  TargetLimits limits;
  limits.rate = 4;  // one slot every 250 ms
  std::vector<Millis> slots;
  for (int i = 0; i < 5; ++i) {
    const Admission a = Admit(control, limits, 10'000, 1000, 30'000);
    ASSERT_TRUE(a.admitted) << i;
    slots.push_back(a.send_at);
  }
  EXPECT_EQ(slots, (std::vector<Millis>{10'000, 10'250, 10'500, 10'750, 11'000}));
  // The sixth would leave at 11 250: more than the horizon ahead, so it asks again later.
  const Admission refused = Admit(control, limits, 10'000, 1000, 30'000);
  EXPECT_FALSE(refused.admitted);
  EXPECT_EQ(refused.retry_at, 10'250);
  EXPECT_NE(refused.reason.find("rate limit of 4 calls a second"), std::string::npos);
  // Time passing frees slots; an idle target does not bank them as a burst.
  const Admission later = Admit(control, limits, 60'000, 1000, 30'000);
  EXPECT_TRUE(later.admitted);
  EXPECT_EQ(later.send_at, 60'000);
  EXPECT_EQ(Admit(control, limits, 60'000, 1000, 30'000).send_at, 60'250);
}

TEST(TargetGateTest, ACallTooLateForItsSlotRetakesTheNextFreeOne) {
  TargetLimits limits;
  limits.rate = 10;  // a slot every 100 ms: late by more than 100 ms is too late
  EXPECT_EQ(LateSlotTolerance(limits), 100);
  EXPECT_FALSE(SlotPassed(limits, 10'000, 10'100));
  EXPECT_TRUE(SlotPassed(limits, 10'000, 10'101));
  limits.rate = 1000;  // a slot every millisecond: 50 ms, the time of a commit
  EXPECT_EQ(LateSlotTolerance(limits), 50);
  EXPECT_FALSE(SlotPassed(limits, 10'000, 10'050));
  EXPECT_TRUE(SlotPassed(limits, 10'000, 10'051));
  EXPECT_FALSE(SlotPassed(TargetLimits(), 10'000, 99'000)) << "no rate limit, no slot";

  TargetControl control = Control();
  limits.rate = 4;  // every 250 ms
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(Admit(control, limits, 10'000, 1000, 30'000).admitted);
  // Slots 10 000, 10 250, 10 500 given out; a held call wakes at 10 400, too late for
  // 10 000: it takes 10 750, after every slot given out, and the next admission 11 000.
  EXPECT_EQ(RetakeSlot(control, limits, 10'400), 10'750);
  EXPECT_EQ(Admit(control, limits, 10'400, 1000, 30'000).send_at, 11'000);
  // Woken after all of them: now, and a slot later for the one after.
  EXPECT_EQ(RetakeSlot(control, limits, 20'000), 20'000);
  EXPECT_EQ(RetakeSlot(control, limits, 20'000), 20'250);
}

TEST(TargetGateTest, ARateThatIsNotAWholeNumberOfMillisecondsStaysExact) {
  TargetControl control = Control();
  TargetLimits limits;
  limits.rate = 300;  // 3.33 ms apart: rounding each to 3 ms would send 333 a second
  Millis last = 0;
  for (int i = 0; i < 300; ++i) {
    const Admission a = Admit(control, limits, 0, 2000, 30'000);
    ASSERT_TRUE(a.admitted);
    last = a.send_at;
  }
  EXPECT_EQ(last, 997);  // the 300th slot: 299 × 3.333 ms
}

TEST(TargetGateTest, TheConcurrencyCapCountsTheCallsUnderWay) {
  TargetControl control = Control();
  TargetLimits limits;
  limits.concurrency = 2;
  control.calls = 1;
  EXPECT_TRUE(Admit(control, limits, 0, 1000, 30'000).admitted);
  control.calls = 2;
  const Admission refused = Admit(control, limits, 0, 1000, 30'000);
  EXPECT_FALSE(refused.admitted);
  EXPECT_NE(refused.reason.find("2 calls under way, its concurrency cap"), std::string::npos);
}

TEST(TargetGateTest, TheCircuitOpensHalfOpensForOneProbeAndCloses) {
  TargetControl control = Control();
  TargetLimits limits;
  limits.breaker_failures = 3;
  limits.cool_down = 5000;
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(Admit(control, limits, 100, 1000, 30'000).admitted);
    Settle(control, limits, false, CallHealth::kFailing, 100);
  }
  EXPECT_TRUE(Admit(control, limits, 100, 1000, 30'000).admitted) << "two failures: still closed";
  Settle(control, limits, false, CallHealth::kFailing, 200);
  EXPECT_EQ(control.open_until, 5200);
  const Admission open = Admit(control, limits, 3000, 1000, 30'000);
  EXPECT_FALSE(open.admitted);
  EXPECT_EQ(open.retry_at, 5200);
  EXPECT_NE(open.reason.find("circuit open after 3 consecutive transient failures, until "),
            std::string::npos)
      << open.reason;
  // Cooled down: one probe, and nobody else while it is out.
  const Admission probe = Admit(control, limits, 5200, 1000, 30'000);
  ASSERT_TRUE(probe.admitted);
  EXPECT_TRUE(probe.probe);
  const Admission second = Admit(control, limits, 5300, 1000, 30'000);
  EXPECT_FALSE(second.admitted);
  EXPECT_NE(second.reason.find("half-open"), std::string::npos);
  // The probe fails: open again for a whole cool-down.
  Settle(control, limits, true, CallHealth::kFailing, 5400);
  EXPECT_EQ(control.open_until, 10'400);
  EXPECT_FALSE(Admit(control, limits, 10'000, 1000, 30'000).admitted);
  // The next probe answers: closed, everyone goes.
  const Admission again = Admit(control, limits, 10'400, 1000, 30'000);
  ASSERT_TRUE(again.probe);
  Settle(control, limits, true, CallHealth::kHealthy, 10'500);
  EXPECT_EQ(control.failures, 0);
  for (int i = 0; i < 3; ++i) {
    const Admission a = Admit(control, limits, 10'600, 1000, 30'000);
    EXPECT_TRUE(a.admitted);
    EXPECT_FALSE(a.probe);
  }
}

TEST(TargetGateTest, AProbeThatDiedOrWasNotSentLetsAnotherProbe) {
  TargetControl control = Control();
  TargetLimits limits;
  limits.breaker_failures = 1;
  limits.cool_down = 1000;
  Settle(control, limits, false, CallHealth::kFailing, 0);
  ASSERT_TRUE(Admit(control, limits, 1000, 1000, 30'000).probe);
  Settle(control, limits, true, CallHealth::kUntold, 1001);  // never left: says nothing
  EXPECT_TRUE(Admit(control, limits, 1002, 1000, 30'000).probe);
  // A probe whose worker died holds the circuit only until its lease ends.
  EXPECT_FALSE(Admit(control, limits, 20'000, 1000, 30'000).admitted);
  EXPECT_TRUE(Admit(control, limits, 31'002, 1000, 30'000).probe);
}

TEST(TargetGateTest, AnAnswerIsHealthyAFailureOrTimeoutIsNotAndOurOwnRefusalSaysNothing) {
  CallOutcome answered;
  answered.status = 422;
  EXPECT_EQ(HealthOf(answered, ErrorClass::kRejected), CallHealth::kHealthy);
  CallOutcome lost;
  lost.kind = CallOutcome::Kind::kLostAfterSend;
  EXPECT_EQ(HealthOf(lost, ErrorClass::kUnknown), CallHealth::kFailing);
  CallOutcome refused;
  refused.kind = CallOutcome::Kind::kNotSent;
  EXPECT_EQ(HealthOf(refused, ErrorClass::kTransient), CallHealth::kFailing);
  CallOutcome changed = refused;
  changed.content_changed = true;
  EXPECT_EQ(HealthOf(changed, ErrorClass::kTransient), CallHealth::kUntold);
}

}  // namespace
}  // namespace waystone
