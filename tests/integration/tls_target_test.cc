// A target's TLS identity (`targets:` with tls.ca_file, cert_file, key_file) against
// tests/targets/mtls_target.py, an HTTPS server written from its README by someone
// who had not read our code (Python's ssl): it trusts only client certificates of a
// CA the test makes with openssl, and counts a request only after the handshake
// accepted the client. What counts is what it received.

#include <cstdlib>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "connectors/http/http_client.h"
#include "definition/loader.h"
#include "engine/engine.h"
#include "store/store.h"
#include "support/erp_target.h"
#include "support/temp_dir.h"

namespace waystone {
namespace {

using Json = nlohmann::json;

// Runs openssl with `args` in `dir`; fails the test when it fails.
void OpenSsl(const std::string& dir, std::vector<std::string> args) {
  args.insert(args.begin(), "/usr/bin/openssl");
  auto done = testing::RunProcess(args, {}, dir);
  ASSERT_EQ(done.exit_code, 0) << done.err;
}

// A CA with a server certificate for 127.0.0.1 and a client certificate; a second,
// unrelated CA with a client certificate of its own (the intruder).
void MakePki(const std::string& dir) {
  auto at = [&](const std::string& file) { return dir + "/" + file; };
  auto ca = [&](const std::string& name) {
    OpenSsl(dir, {"req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", at(name + ".key"),
                  "-out", at(name + ".pem"), "-days", "2", "-subj", "/CN=" + name});
  };
  auto issue = [&](const std::string& ca, const std::string& name, const std::string& cn,
                   const std::string& ext) {
    OpenSsl(dir, {"req", "-newkey", "rsa:2048", "-nodes", "-keyout", at(name + ".key"), "-out",
                  at(name + ".csr"), "-subj", "/CN=" + cn});
    std::vector<std::string> sign = {"x509",
                                     "-req",
                                     "-in",
                                     at(name + ".csr"),
                                     "-CA",
                                     at(ca + ".pem"),
                                     "-CAkey",
                                     at(ca + ".key"),
                                     "-CAcreateserial",
                                     "-out",
                                     at(name + ".pem"),
                                     "-days",
                                     "2"};
    if (!ext.empty()) {
      testing::WriteFile(at(name + ".ext"), ext);
      sign.insert(sign.end(), {"-extfile", at(name + ".ext")});
    }
    OpenSsl(dir, sign);
  };
  ca("ca");
  ca("other-ca");
  issue("ca", "server", "127.0.0.1", "subjectAltName=IP:127.0.0.1,DNS:localhost\n");
  issue("ca", "client", "waystone-worker", "");
  issue("other-ca", "intruder", "intruder", "");
}

class TlsTargetTest : public ::testing::Test {
 public:
  void SetUp() override {
    MakePki(dir_.path());
    if (HasFatalFailure()) return;
    target_ = std::make_unique<testing::TargetProcess>(
        dir_.path(), "mtls_target.py",
        std::vector<std::string>{"--cert", dir_.File("server.pem"), "--key",
                                 dir_.File("server.key"), "--client-ca", dir_.File("ca.pem")});
    ASSERT_TRUE(target_->ok());
    control_port_ =
        testing::WaitForPrefixedNumber(target_->process(), "CONTROL ", std::chrono::seconds(10));
    ASSERT_GT(control_port_, 0);
    setenv("ERP_URL", ("https://127.0.0.1:" + std::to_string(target_->port())).c_str(), 1);
    setenv("ERP_CA_FILE", dir_.File("ca.pem").c_str(), 1);
    setenv("ERP_CERT_FILE", dir_.File("client.pem").c_str(), 1);
    setenv("ERP_KEY_FILE", dir_.File("client.key").c_str(), 1);
    auto store = OpenStore({dir_.File("tls.db")});
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = std::move(*store);
    http_ = NewCurlHttpClient({});
  }

  // One create whose target `erp` carries `tls` (YAML lines under `tls:`).
  static std::string Workflow(const std::string& tls) {
    return R"(workflow: tls-order
key: "{{input.id}}"
targets:
  erp:
    url: "{{env.ERP_URL}}"
    tls:
)" + tls + R"(
steps:
  - name: create-order
    idempotency: { honored: true }
    request:
      method: POST
      url: "{{env.ERP_URL}}/orders"
      body: { ref: "{{instance.ref}}" }
      timeout: 3s
    result: { external_id: /id }
    retry: { max_attempts: 3, initial_interval: 10ms }
)";
  }

  // Runs one instance on an engine made now: it reads the environment as it is.
  InstanceRecord Run(const std::string& text, const std::string& id) {
    auto engine = Engine::Create(store_.get(), http_.get(), SystemClock::Get(), &random_, {});
    EXPECT_TRUE(engine.ok()) << engine.status();
    if (!engine.ok()) return {};
    engine_ = std::move(*engine);
    auto definition = LoadDefinitionText(text, "tls-order.yaml");
    EXPECT_TRUE(definition.ok()) << definition.status();
    if (!definition.ok()) return {};
    auto started = engine_->StartInstance(*definition, {"default", Json{{"id", id}}.dump()});
    EXPECT_TRUE(started.ok()) << started.status();
    if (!started.ok()) return {};
    auto state = engine_->RunUntilRest(started->instance.id, std::stop_token());
    EXPECT_TRUE(state.ok()) << state.status();
    return *store_->GetInstance(started->instance.id);
  }

  // Every attempt's error class and detail, for failure messages.
  std::string AttemptsText(const InstanceRecord& instance) {
    std::string text;
    auto attempts = store_->ListAttempts(instance.id);
    if (!attempts.ok()) return attempts.status().ToString();
    for (const AttemptRecord& a : *attempts) {
      text += std::string(ToString(a.error_class)) + ": " + a.detail + "\n";
    }
    return text;
  }

  StepRecord CreateStep(const InstanceRecord& instance) {
    auto steps = store_->GetSteps(instance.id);
    EXPECT_TRUE(steps.ok() && !steps->empty());
    return steps.ok() && !steps->empty() ? steps->front() : StepRecord{};
  }

  Json Stats() {
    static const std::unique_ptr<HttpClient> plain = NewCurlHttpClient({});
    HttpRequest request{"GET",
                        "http://127.0.0.1:" + std::to_string(control_port_) + "/_target/stats",
                        {},
                        "",
                        5000};
    return Json::parse(plain->Send(request).body);
  }

  testing::TempDir dir_;
  SeededRandom random_{3};
  std::unique_ptr<testing::TargetProcess> target_;
  int control_port_ = -1;
  std::unique_ptr<Store> store_;
  std::unique_ptr<HttpClient> http_;
  std::unique_ptr<Engine> engine_;
};

constexpr char kFullIdentity[] = R"(      ca_file: "{{env.ERP_CA_FILE}}"
      cert_file: "{{env.ERP_CERT_FILE}}"
      key_file: "{{env.ERP_KEY_FILE}}")";

TEST_F(TlsTargetTest, TheTargetsClientCertificateAndPrivateCaMakeTheCall) {
  InstanceRecord instance = Run(Workflow(kFullIdentity), "o-1");
  EXPECT_EQ(instance.state, InstanceState::kCompleted) << instance.status_reason;
  EXPECT_EQ(CreateStep(instance).external_id, "ORD-1");
  const Json stats = Stats();
  EXPECT_EQ(stats["requests"], 1) << stats.dump();
  EXPECT_EQ(stats["client_cns"], Json::array({"waystone-worker"})) << stats.dump();
  EXPECT_EQ(stats["handshake_failures"], 0) << stats.dump();
}

// With TLS 1.3 the server judges our certificate after we have written the request.
// Its alert usually reaches us: the step is rejected naming the target and waits for an
// operator. It can also be lost — to a reset (the attempt reads unknown and is resubmitted
// under the honoured key) or to a close before we read it (a send error: transient, retried
// until the attempts run out; seen under ASan). Either way no request reaches the server's
// application and the step never completes.
void ExpectRefusedAtTls(TlsTargetTest& test, const InstanceRecord& instance) {
  const StepRecord create = test.CreateStep(instance);
  EXPECT_EQ(create.state, StepState::kFailed) << test.AttemptsText(instance);
  EXPECT_GE(create.attempts, 1);
  EXPECT_LE(create.attempts, 3) << test.AttemptsText(instance);
  if (create.error_message.find("TLS with target 'erp' failed") != std::string::npos) {
    // Not compensated away: an operator renews the certificate and retries the step.
    EXPECT_EQ(instance.state, InstanceState::kNeedsAttention) << instance.status_reason;
    EXPECT_NE(instance.status_reason.find("fix the target's certificate, CA"), std::string::npos)
        << instance.status_reason;
    EXPECT_EQ(create.error_class, ErrorClass::kRejected) << create.error_message;
  } else {
    EXPECT_EQ(create.attempts, 3) << "only a lost alert is retried: "
                                  << test.AttemptsText(instance);
    EXPECT_NE(create.error_message.find("retries exhausted"), std::string::npos)
        << create.error_message;
  }
  const Json stats = test.Stats();
  EXPECT_EQ(stats["requests"], 0) << stats.dump();
  EXPECT_GE(stats["handshake_failures"], 1) << stats.dump();
}

// The server wants a certificate we do not send: rejected, the target named.
TEST_F(TlsTargetTest, WithoutAClientCertificateTheStepIsRejectedNamingTheTarget) {
  ExpectRefusedAtTls(*this, Run(Workflow(R"(      ca_file: "{{env.ERP_CA_FILE}}")"), "o-2"));
}

TEST_F(TlsTargetTest, ACertificateFromAnotherCaIsRejectedNamingTheTarget) {
  setenv("ERP_CERT_FILE", dir_.File("intruder.pem").c_str(), 1);
  setenv("ERP_KEY_FILE", dir_.File("intruder.key").c_str(), 1);
  ExpectRefusedAtTls(*this, Run(Workflow(kFullIdentity), "o-3"));
}

// Without the private CA the server's certificate is not trusted: rejected, named.
TEST_F(TlsTargetTest, AServerOutsideTheTrustedCasIsRejectedNamingTheTarget) {
  setenv("ERP_CA_FILE", dir_.File("other-ca.pem").c_str(), 1);
  InstanceRecord instance = Run(Workflow(kFullIdentity), "o-4");
  EXPECT_EQ(instance.state, InstanceState::kNeedsAttention) << instance.status_reason;
  const StepRecord create = CreateStep(instance);
  EXPECT_EQ(create.error_class, ErrorClass::kRejected);
  EXPECT_EQ(create.attempts, 1);
  EXPECT_NE(create.error_message.find("TLS with target 'erp' failed"), std::string::npos)
      << create.error_message;
  EXPECT_EQ(Stats()["requests"], 0);
}

// An encrypted client key opened with its passphrase from a secret.
TEST_F(TlsTargetTest, AnEncryptedKeyIsOpenedWithItsSecretPassphrase) {
  OpenSsl(dir_.path(), {"pkey", "-in", dir_.File("client.key"), "-aes256", "-passout",
                        "pass:s3cret-pass", "-out", dir_.File("client-enc.key")});
  setenv("ERP_KEY_FILE", dir_.File("client-enc.key").c_str(), 1);
  setenv("WAYSTONE_SECRET_ERP_KEY_PASSWORD", "s3cret-pass", 1);
  const std::string identity =
      std::string(kFullIdentity) + "\n      key_password: \"{{secret.ERP_KEY_PASSWORD}}\"";
  InstanceRecord instance = Run(Workflow(identity), "o-6");
  EXPECT_EQ(instance.state, InstanceState::kCompleted) << instance.status_reason;
  EXPECT_EQ(Stats()["client_cns"], Json::array({"waystone-worker"}));
  setenv("WAYSTONE_SECRET_ERP_KEY_PASSWORD", "wrong", 1);
  instance = Run(Workflow(identity), "o-7");
  EXPECT_EQ(instance.state, InstanceState::kNeedsAttention) << instance.status_reason;
  EXPECT_NE(CreateStep(instance).error_message.find("target 'erp'"), std::string::npos);
  EXPECT_EQ(instance.status_reason.find("s3cret"), std::string::npos);
  EXPECT_EQ(Stats()["requests"], 1) << "the wrong passphrase sent nothing";
  unsetenv("WAYSTONE_SECRET_ERP_KEY_PASSWORD");
}

TEST_F(TlsTargetTest, AnUnreadableKeyFileIsRejectedNamingTheTarget) {
  setenv("ERP_KEY_FILE", dir_.File("no-such.key").c_str(), 1);
  InstanceRecord instance = Run(Workflow(kFullIdentity), "o-5");
  EXPECT_EQ(instance.state, InstanceState::kNeedsAttention) << instance.status_reason;
  EXPECT_NE(CreateStep(instance).error_message.find("target 'erp'"), std::string::npos)
      << CreateStep(instance).error_message;
  EXPECT_EQ(Stats()["requests"], 0);
}

TEST(TargetsLoadTest, TargetSettingsComeFromTheDeploymentOnly) {
  auto load = [](const std::string& tls) {
    return LintDefinitionText(R"(workflow: t
key: "{{input.id}}"
targets:
  erp:
    url: "{{env.ERP_URL}}"
    tls:
)" + tls + R"(
steps:
  - name: read
    request: { method: GET, url: "{{env.ERP_URL}}/x" }
)",
                              "t.yaml", nullptr);
  };
  auto text = [](const std::vector<Diagnostic>& d) {
    std::string all;
    for (const auto& one : d) all += one.ToString() + "\n";
    return all;
  };
  EXPECT_TRUE(load("      ca_file: \"{{env.CA}}\"").empty());
  auto d = load("      ca_file: \"{{input.ca}}\"");
  EXPECT_NE(text(d).find("t.yaml:4: target 'erp' tls.ca_file: {{input.ca}} cannot be used here"),
            std::string::npos)
      << text(d);
  d = load("      cert_file: \"{{env.C}}\"");
  EXPECT_NE(text(d).find("needs both 'cert_file' and 'key_file'"), std::string::npos) << text(d);
  d = load(
      "      cert_file: \"{{env.C}}\"\n      key_file: \"{{env.K}}\"\n"
      "      key_password: hunter2");
  EXPECT_NE(text(d).find("tls.key_password must be a secret"), std::string::npos) << text(d);
  d = load("      ca: x");
  EXPECT_NE(text(d).find("unknown field 'ca'"), std::string::npos) << text(d);
}

}  // namespace
}  // namespace waystone
