// Notifications across SIGKILLs: the `waystone` binary is killed at exact points
// (WAYSTONE_CRASH_AT) before and after every send of a notify step's channels and
// of their corrections, then run again. Counted at counterparts that share no code
// with Waystone (tests/targets/line_target.py, tests/targets/webhook_receiver.py,
// the SMTP server of tests/targets/smtp): no recipient gets a message twice on any
// channel.

#include <signal.h>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "sim/simulator.h"
#include "support/erp_target.h"
#include "support/process.h"
#include "support/temp_dir.h"

namespace waystone {
namespace {

using Json = nlohmann::json;

struct KillCase {
  std::string point;
  std::string step;
  bool undo = false;  // the order is undone (its corrections are sent)
};

void PrintTo(const KillCase& c, std::ostream* os) {
  *os << c.point << ":" << c.step << (c.undo ? " (undone)" : "");
}

class NotifyCrashTest : public ::testing::TestWithParam<KillCase> {
 protected:
  void SetUp() override {
    line_ = std::make_unique<testing::TargetProcess>(
        dir_.path(), "line_target.py", std::vector<std::string>{"--token", "line-token-0"});
    hook_ = std::make_unique<testing::TargetProcess>(dir_.path(), "webhook_receiver.py",
                                                     std::vector<std::string>{});
    ASSERT_TRUE(line_->ok() && hook_->ok());
  }

  testing::ProcessResult Run(const std::string& input,
                             std::map<std::string, std::string> env = {}) {
    env.emplace("WAYSTONE_DB", dir_.File("notify.db"));
    env.emplace("LINE_URL", line_->base_url());
    env.emplace("HOOK_URL", hook_->base_url());
    env.emplace("WAYSTONE_SECRET_LINE_TOKEN", "line-token-0");
    return testing::RunProcess(
        {testing::WaystoneBinary(), "run",
         testing::SourceDir() + "/tests/fixtures/notify-order.yaml", "--input", input},
        env, dir_.path());
  }

  // The texts the LINE simulator delivered to `to`, in order.
  std::vector<std::string> LineTexts(const std::string& to) {
    std::vector<std::string> texts;
    const Json stats = Json::parse(line_->StatsJson());
    for (const Json& d : stats["deliveries"]) {
      if (d["to"] == to) texts.push_back(d["text"].get<std::string>());
    }
    return texts;
  }

  // The texts the webhook receiver delivered (each Webhook-Id once), in order.
  std::vector<std::string> HookTexts() {
    std::vector<std::string> texts;
    const Json stats = Json::parse(hook_->StatsJson());
    for (const Json& d : stats["deliveries"]) {
      texts.push_back(d["body"]["text"].get<std::string>());
    }
    return texts;
  }

  testing::TempDir dir_;
  std::unique_ptr<testing::TargetProcess> line_;
  std::unique_ptr<testing::TargetProcess> hook_;
};

TEST_P(NotifyCrashTest, KilledAtThePointRestartedEachMessageOnce) {
  const KillCase& c = GetParam();
  const std::string input =
      Json{{"id", "o-1"}, {"customer", "c-7"}, {"line_id", "U1"}, {"ship", c.undo ? "fail" : "no"}}
          .dump();
  auto crashed = Run(input, {{"WAYSTONE_CRASH_AT", c.point + ":" + c.step}});
  ASSERT_EQ(crashed.signal, SIGKILL) << "exit " << crashed.exit_code << "\n" << crashed.err;

  auto resumed = Run(input);
  const std::string state = c.undo ? "compensated" : "completed";
  EXPECT_NE(resumed.out.find("state     " + state), std::string::npos)
      << resumed.out << resumed.err;
  const std::string confirmed = "Order ORD-o-1 is confirmed";
  const std::string cancelled = "Order ORD-o-1 is cancelled";
  using Texts = std::vector<std::string>;
  const Texts expected = c.undo ? Texts{confirmed, cancelled} : Texts{confirmed};
  EXPECT_EQ(LineTexts("U1"), expected) << line_->StatsJson();
  EXPECT_EQ(HookTexts(), expected) << hook_->StatsJson();
}

// LINE keeps a retry key 24 hours. Killed after LINE took the push, the worker comes
// back 25 hours later (the step's first send moved back in the database; the LINE
// simulator's clock moved on, so a resend under the old key would be a second
// message): the push is not sent again but waits for an operator.
TEST_F(NotifyCrashTest, PastTheLineKeyWindowAKilledPushIsNotSentAgain) {
  const std::string input =
      Json{{"id", "o-1"}, {"customer", "c-7"}, {"line_id", "U1"}, {"ship", "no"}}.dump();
  auto crashed = Run(input, {{"WAYSTONE_CRASH_AT", "after-call:confirm-line"}});
  ASSERT_EQ(crashed.signal, SIGKILL) << crashed.err;
  constexpr long long kHours25 = 25LL * 3600 * 1000;
  auto moved = testing::RunProcess({"/usr/bin/env", "sqlite3", dir_.File("notify.db"),
                                    "UPDATE steps SET started_at = started_at - " +
                                        std::to_string(kHours25) + " WHERE name = 'confirm-line'"},
                                   {}, dir_.path());
  ASSERT_EQ(moved.exit_code, 0) << moved.err;
  line_->Call("POST", "/_target/clock", R"({"advance_seconds": 90000})");

  auto resumed = Run(input);
  EXPECT_NE(resumed.out.find("state     needs_attention"), std::string::npos)
      << resumed.out << resumed.err;
  EXPECT_NE(resumed.out.find("keeps its key only 1d after the first send"), std::string::npos)
      << resumed.out;
  const Json line = Json::parse(line_->StatsJson());
  EXPECT_EQ(line["requests_total"], 1) << line.dump();
  EXPECT_EQ(LineTexts("U1"), std::vector<std::string>{"Order ORD-o-1 is confirmed"});
}

std::vector<KillCase> Cases() {
  std::vector<KillCase> cases;
  for (const char* step : {"confirm-line", "confirm-webhook"}) {
    for (const char* point : {"before-send", "after-call"}) cases.push_back({point, step});
    for (const char* point : {"before-compensate", "after-compensate"}) {
      cases.push_back({point, step, true});
    }
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(EverySend, NotifyCrashTest, ::testing::ValuesIn(Cases()),
                         [](const auto& info) {
                           std::string name = info.param.point + "_" + info.param.step;
                           for (char& c : name) {
                             if (c == '-') c = '_';
                           }
                           return name;
                         });

// LINE and email side by side (tests/fixtures/notify-email.yaml). Killed once the
// email's `running` checkpoint is written (before it leaves, or after the SMTP server
// took it), the email is `unknown` on restart and waits for an operator: from the
// record the two cannot be told apart, and an SMTP server keeps no key, so it is never
// sent again. LINE resends under its retry key. Killed after LINE's answer while the
// email is still on its way (the server answers 250 late: `slow_smtp`; the kill may
// come before or after it took the message), the email is unknown too: the two went
// at once.
struct EmailKillCase {
  std::string point;
  std::string step;
  std::string state;  // of the instance after the restart
  int emails = 1;     // messages the SMTP server took (-1: at most one)
  bool slow_smtp = false;
};

void PrintTo(const EmailKillCase& c, std::ostream* os) { *os << c.point << ":" << c.step; }

class NotifyEmailCrashTest : public ::testing::TestWithParam<EmailKillCase> {
 protected:
  void SetUp() override {
    line_ = std::make_unique<testing::TargetProcess>(
        dir_.path(), "line_target.py", std::vector<std::string>{"--token", "line-token-0"});
    smtp_ = std::make_unique<testing::SmtpTarget>(dir_.path());
    ASSERT_TRUE(line_->ok() && smtp_->ok());
  }

  testing::ProcessResult Run(const std::string& input,
                             std::map<std::string, std::string> env = {}) {
    env.emplace("WAYSTONE_DB", dir_.File("notify.db"));
    env.emplace("LINE_URL", line_->base_url());
    env.emplace("SMTP_URL", smtp_->smtp_url());
    env.emplace("WAYSTONE_SECRET_LINE_TOKEN", "line-token-0");
    return testing::RunProcess(
        {testing::WaystoneBinary(), "run",
         testing::SourceDir() + "/tests/fixtures/notify-email.yaml", "--input", input},
        env, dir_.path());
  }

  testing::TempDir dir_;
  std::unique_ptr<testing::TargetProcess> line_;
  std::unique_ptr<testing::SmtpTarget> smtp_;
};

TEST_P(NotifyEmailCrashTest, KilledAtThePointRestartedEachMessageAtMostOnce) {
  const EmailKillCase& c = GetParam();
  const std::string input = Json{
      {"id", "o-1"},
      {"customer", "c-7"},
      {"line_id", "U1"},
      {"email", "kim@customer.example"},
      {"ship", "yes"}}.dump();
  if (c.slow_smtp) {
    smtp_->Call("POST", "/_target/faults", R"({"next":["accept_then_wait"],"stall_ms":1500})");
  }
  auto crashed = Run(input, {{"WAYSTONE_CRASH_AT", c.point + ":" + c.step}});
  ASSERT_EQ(crashed.signal, SIGKILL) << "exit " << crashed.exit_code << "\n" << crashed.err;

  auto resumed = Run(input);
  EXPECT_NE(resumed.out.find("state     " + c.state), std::string::npos)
      << resumed.out << resumed.err;
  const Json smtp = Json::parse(smtp_->StatsJson());
  if (c.emails >= 0) {
    EXPECT_EQ(smtp["messages_received"], c.emails) << smtp.dump();
  } else {  // the kill may come before or after the server took the message
    EXPECT_LE(smtp["messages_received"], 1) << smtp.dump();
  }
  EXPECT_EQ(smtp["duplicates"], 0);
  const Json line = Json::parse(line_->StatsJson());
  EXPECT_EQ(line["delivered_by_to"]["U1"], 1) << line.dump();
  if (c.state == "needs_attention") {
    EXPECT_NE(resumed.out.find("confirm-email"), std::string::npos) << resumed.out;
  }
}

INSTANTIATE_TEST_SUITE_P(
    EverySend, NotifyEmailCrashTest,
    ::testing::Values(EmailKillCase{"before-send", "confirm-email", "needs_attention", 0},
                      EmailKillCase{"after-call", "confirm-email", "needs_attention", 1},
                      EmailKillCase{"before-send", "confirm-line", "completed", 1},
                      EmailKillCase{"after-call", "confirm-line", "needs_attention", -1, true}),
    [](const auto& info) {
      std::string name = info.param.point + "_" + info.param.step;
      for (char& c : name) {
        if (c == '-') c = '_';
      }
      return name;
    });

// The order undone after both messages went: the correction goes to LINE and by email.
// Killed while the email's correction was on its way (its attempt begun, before it
// left or after the server took it), it is never sent again: the compensation waits
// for an operator; LINE's correction waits behind it (reverse order).
class NotifyEmailCorrectionCrashTest : public NotifyEmailCrashTest {};

TEST_P(NotifyEmailCorrectionCrashTest, AnEmailCorrectionKilledOnItsWayIsNeverSentAgain) {
  const EmailKillCase& c = GetParam();
  const std::string input = Json{
      {"id", "o-2"},
      {"customer", "c-8"},
      {"line_id", "U2"},
      {"email", "lee@customer.example"},
      {"ship", "fail"}}.dump();
  auto crashed = Run(input, {{"WAYSTONE_CRASH_AT", c.point + ":" + c.step}});
  ASSERT_EQ(crashed.signal, SIGKILL) << "exit " << crashed.exit_code << "\n" << crashed.err;
  auto resumed = Run(input);
  EXPECT_NE(resumed.out.find("state     needs_attention"), std::string::npos)
      << resumed.out << resumed.err;
  EXPECT_NE(resumed.out.find("it is not sent again"), std::string::npos) << resumed.out;
  auto again = Run(input);  // resumed once more: still nothing sent
  EXPECT_NE(again.out.find("state     needs_attention"), std::string::npos) << again.out;
  const Json smtp = Json::parse(smtp_->StatsJson());
  EXPECT_EQ(smtp["messages_received"], c.emails)
      << "the original, and the correction at most once: " << smtp.dump();
  EXPECT_EQ(smtp["duplicates"], 0);
  const Json line = Json::parse(line_->StatsJson());
  EXPECT_EQ(line["delivered_by_to"]["U2"], 1) << "LINE's correction waits behind: " << line.dump();
}

INSTANTIATE_TEST_SUITE_P(
    Corrections, NotifyEmailCorrectionCrashTest,
    ::testing::Values(EmailKillCase{"before-compensate", "confirm-email", "needs_attention", 1},
                      EmailKillCase{"after-compensate", "confirm-email", "needs_attention", 2}),
    [](const auto& info) {
      std::string name = info.param.point;
      for (char& c : name) {
        if (c == '-') c = '_';
      }
      return name;
    });

// The README's tour of examples/order-notify.yaml, as written: the simulator (CRM, ERP,
// LINE) and the SMTP server; the second order's 250 is dropped after the server took it.
TEST(NotifyExampleTest, TheTourRunsAsWritten) {
  testing::TempDir dir;
  auto sim = Simulator::Start({});
  ASSERT_TRUE(sim.ok()) << sim.status();
  testing::SmtpTarget smtp(dir.path());
  ASSERT_TRUE(smtp.ok());
  auto env = testing::SimulatorEnv(
      (*sim)->base_url(), {{"WAYSTONE_DB", dir.File("tour.db")}, {"SMTP_URL", smtp.smtp_url()}});
  auto run = [&](const std::string& order) {
    return testing::RunProcess({testing::WaystoneBinary(), "run",
                                testing::SourceDir() + "/examples/order-notify.yaml", "--input",
                                R"({"source":"crm","order_id":")" + order +
                                    R"(","customer_id":"C-)" + order + R"(","amount":80})"},
                               env, dir.path());
  };
  auto first = run("20");
  EXPECT_EQ(first.exit_code, 0) << first.out << first.err;
  smtp.Call("POST", "/_target/faults", R"({"next":["accept_then_close"]})");
  auto second = run("21");
  EXPECT_EQ(second.exit_code, 3) << second.out << second.err;
  EXPECT_NE(second.out.find("state     needs_attention"), std::string::npos) << second.out;
  EXPECT_NE(second.out.find("receipt-email        unknown"), std::string::npos) << second.out;
  auto again = run("21");  // resumed: still waiting, nothing resent
  EXPECT_EQ(again.exit_code, 3) << again.out << again.err;

  const Json mail = Json::parse(smtp.StatsJson());
  EXPECT_EQ(mail["messages_received"], 2) << mail.dump();
  EXPECT_EQ(mail["duplicates"], 0);
  EXPECT_EQ(mail["messages"][0]["to"], "C-20@example.test");
  const Json stats = Json::parse((*sim)->StatsJson());
  EXPECT_EQ(stats["line_messages"], 2) << stats.dump();
  EXPECT_EQ(stats["duplicate_line_messages"], 0);
  EXPECT_EQ(stats["shipments"], 2);
}

}  // namespace
}  // namespace waystone
