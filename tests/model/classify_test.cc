#include "model/classify.h"

#include <gtest/gtest.h>

namespace waystone {
namespace {

CallOutcome Response(int status) { return {CallOutcome::Kind::kResponse, status, std::nullopt}; }

TEST(ClassifyTest, SuccessIsNone) {
  EXPECT_EQ(Classify(Response(200), {}), ErrorClass::kNone);
  EXPECT_EQ(Classify(Response(201), {}), ErrorClass::kNone);
  EXPECT_EQ(Classify(Response(204), {}), ErrorClass::kNone);
}

TEST(ClassifyTest, TransientStatuses) {
  for (int status : {408, 429, 503}) {
    EXPECT_EQ(Classify(Response(status), {}), ErrorClass::kTransient) << status;
  }
}

TEST(ClassifyTest, RejectedStatuses) {
  for (int status : {400, 401, 403, 404, 409, 422}) {
    EXPECT_EQ(Classify(Response(status), {}), ErrorClass::kRejected) << status;
  }
}

TEST(ClassifyTest, GatewayTimeoutAndServerErrorsAreUnknown) {
  EXPECT_EQ(Classify(Response(504), {}), ErrorClass::kUnknown);
  // A bad gateway means the origin's answer was lost, not that it did nothing.
  EXPECT_EQ(Classify(Response(502), {}), ErrorClass::kUnknown);
  EXPECT_EQ(Classify(Response(500), {}), ErrorClass::kUnknown);
}

TEST(ClassifyTest, SmtpRepliesByTheirOwnClasses) {
  auto reply = [](int code) {
    CallOutcome outcome = Response(code);
    outcome.smtp = true;
    return outcome;
  };
  EXPECT_EQ(Classify(reply(250), {}), ErrorClass::kNone);
  // 4xx: not taken this time (RFC 5321 §4.2.1), where HTTP would say rejected.
  for (int code : {421, 450, 451, 452}) {
    EXPECT_EQ(Classify(reply(code), {}), ErrorClass::kTransient) << code;
  }
  // 5xx: refused for good, where HTTP would say unknown or transient.
  for (int code : {503, 535, 550, 552, 554}) {
    EXPECT_EQ(Classify(reply(code), {}), ErrorClass::kRejected) << code;
  }
  EXPECT_EQ(Classify(reply(552), {{552, ErrorClass::kTransient}}), ErrorClass::kTransient);
}

TEST(ClassifyTest, TransportOutcomes) {
  EXPECT_EQ(Classify({CallOutcome::Kind::kNotSent, 0, std::nullopt}, {}), ErrorClass::kTransient);
  EXPECT_EQ(Classify({CallOutcome::Kind::kLostAfterSend, 0, std::nullopt}, {}),
            ErrorClass::kUnknown);
  EXPECT_EQ(Classify({CallOutcome::Kind::kInvalid, 0, std::nullopt}, {}), ErrorClass::kRejected);
}

TEST(ClassifyTest, OverridesWinForResponsesOnly) {
  StatusOverrides overrides = {{409, ErrorClass::kTransient}, {503, ErrorClass::kRejected}};
  EXPECT_EQ(Classify(Response(409), overrides), ErrorClass::kTransient);
  EXPECT_EQ(Classify(Response(503), overrides), ErrorClass::kRejected);
  EXPECT_EQ(Classify(Response(422), overrides), ErrorClass::kRejected);
  EXPECT_EQ(Classify({CallOutcome::Kind::kLostAfterSend, 409, std::nullopt}, overrides),
            ErrorClass::kUnknown);
}

}  // namespace
}  // namespace waystone
