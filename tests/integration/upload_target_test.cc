// Uploads (`multipart`, `body_file`, `form`) against tests/targets/dms_target.py, a
// document store written from RFC 7578 / RFC 2046 / RFC 9112 by someone who had not
// read our code, parsing multipart with Python's standard library and making a new
// document for every upload it accepts. What counts is what it stored.

#include <filesystem>
#include <fstream>
#include <thread>
#include <tuple>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "base/base64.h"
#include "base/sha256.h"
#include "connectors/http/http_client.h"
#include "definition/loader.h"
#include "engine/engine.h"
#include "store/store.h"
#include "support/erp_target.h"
#include "support/temp_dir.h"

namespace waystone {
namespace {

using Json = nlohmann::json;

// Bytes that trip naive multipart handling: CRLFs, dashes, a fake boundary, NULs.
std::string AwkwardBytes(size_t size, int seed) {
  std::string bytes = "%PDF-1.7\r\n--\r\n------WebKitFormBoundary\r\n--X--\r\n";
  bytes.push_back('\0');
  uint32_t state = static_cast<uint32_t>(seed) * 2654435761u + 1;
  while (bytes.size() < size) {
    state = state * 1664525u + 1013904223u;
    bytes.push_back(static_cast<char>(state >> 24));
  }
  bytes.resize(size);
  return bytes;
}

void WriteBytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// The process's resident memory now and at its peak since the last ResetPeak, in KiB.
long StatusKib(const std::string& field) {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.starts_with(field + ":")) return std::stol(line.substr(field.size() + 1));
  }
  return -1;
}
// Resets the peak to the resident size now (Linux 4.0+); false when it cannot.
bool ResetPeak() {
  std::ofstream clear("/proc/self/clear_refs");
  clear << "5";
  clear.close();
  return !clear.fail() && StatusKib("VmHWM") - StatusKib("VmRSS") < 4 * 1024;
}

class UploadTargetTest : public ::testing::Test {
 public:
  void SetUp() override {
    target_ = std::make_unique<testing::TargetProcess>(dir_.path(), "dms_target.py",
                                                       std::vector<std::string>{});
    ASSERT_TRUE(target_->ok());
    setenv("DMS_URL", target_->base_url().c_str(), 1);
    setenv("DEAD_URL", "http://127.0.0.1:1", 1);  // nothing listens on port 1
    // Each tenant's files are in a folder named after it: this test's instances are
    // tenant "default"'s.
    files_ = dir_.File("files") + "/default";
    std::filesystem::create_directories(files_ + "/invoices");
    auto store = OpenStore({dir_.File("upload.db")});
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = std::move(*store);
    http_ = NewCurlHttpClient({});
    EngineOptions options;
    options.files_dir = dir_.File("files");
    auto engine = Engine::Create(store_.get(), http_.get(), SystemClock::Get(), &random_, options);
    ASSERT_TRUE(engine.ok()) << engine.status();
    engine_ = std::move(*engine);
  }

  // Runs one instance of `yaml` with `input` until it rests.
  InstanceRecord Run(const std::string& yaml, const Json& input,
                     const std::string& tenant = "default") {
    auto definition = LoadDefinitionText(yaml, "upload.yaml");
    EXPECT_TRUE(definition.ok()) << definition.status();
    if (!definition.ok()) return {};
    auto started = engine_->StartInstance(*definition, {tenant, input.dump()});
    EXPECT_TRUE(started.ok()) << started.status();
    if (!started.ok()) return {};
    auto state = engine_->RunUntilRest(started->instance.id, std::stop_token());
    EXPECT_TRUE(state.ok()) << state.status();
    return *store_->GetInstance(started->instance.id);
  }

  StepRecord FirstStep(const InstanceRecord& instance) {
    auto steps = store_->GetSteps(instance.id);
    EXPECT_TRUE(steps.ok() && !steps->empty());
    return steps.ok() && !steps->empty() ? steps->front() : StepRecord{};
  }

  Json Stats() { return Json::parse(target_->StatsJson()); }

  // Requests the target read on `route`.
  int RequestsOn(const Json& stats, const std::string& route) {
    int count = 0;
    for (const Json& request : stats["requests"]) count += request.value("route", "") == route;
    return count;
  }

  // A multipart upload of invoices/<id>.pdf with the field ref, found again by ref.
  static std::string UploadWorkflow(const std::string& retry, const std::string& timeout = "2s") {
    return R"(workflow: upload-invoice
key: "{{input.id}}"
steps:
  - name: upload
    recovery: lookup
    request:
      method: POST
      url: "{{env.DMS_URL}}/dms/documents"
      multipart:
        fields: { ref: "{{input.id}}", title: "Invoice {{input.id}}" }
        files:
          file: { path: "invoices/{{input.id}}.pdf", content_type: application/pdf }
      timeout: )" +
           timeout + R"(
    result: { external_id: /location }
    lookup:
      request: { method: GET, url: "{{env.DMS_URL}}/dms/documents?ref={{input.id}}" }
      items: /items
      match: { /fields/ref: "{{input.id}}" }
      external_id: /location
    retry: )" +
           retry + "\n";
  }

  testing::TempDir dir_;
  std::string files_;
  SeededRandom random_{9};
  std::unique_ptr<testing::TargetProcess> target_;
  std::unique_ptr<Store> store_;
  std::unique_ptr<HttpClient> http_;
  std::unique_ptr<Engine> engine_;
};

TEST_F(UploadTargetTest, AnUploadWhoseAnswerIsLostIsFoundNotSentAgain) {
  const std::string pdf = AwkwardBytes(300'000, 1);
  WriteBytes(files_ + "/invoices/INV-1.pdf", pdf);
  ASSERT_NE(
      target_->Call("POST", "/_target/faults", R"({"upload": {"next": ["close_before_bytes"]}})")
          .find("upload"),
      std::string::npos);
  const InstanceRecord instance =
      Run(UploadWorkflow("{ max_attempts: 3, initial_interval: 10ms }"), {{"id", "INV-1"}});
  EXPECT_EQ(instance.state, InstanceState::kCompleted) << instance.status_reason;
  const Json stats = Stats();
  EXPECT_EQ(stats["documents"].get<int>(), 1) << stats.dump();
  EXPECT_EQ(RequestsOn(stats, "upload"), 1) << "the upload was sent again";
  const std::string sha = Sha256Hex(pdf);
  EXPECT_EQ(stats["by_sha256"].value(sha, 0), 1) << "the stored bytes are not the file's";
  const StepRecord step = FirstStep(instance);
  EXPECT_EQ(step.external_id, "/dms/documents/DOC-1");
  const Json stored = Json::parse(target_->Call("GET", "/dms/documents/DOC-1", ""));
  EXPECT_EQ(stored["size"].get<int>(), 300'000);
  EXPECT_EQ(stored["filename"], "INV-1.pdf");
  EXPECT_EQ(stored["content_type"], "application/pdf");
  EXPECT_EQ(stored["fields"]["title"], "Invoice INV-1");
}

TEST_F(UploadTargetTest, AFileChangedBetweenAttemptsIsAConflictAndNothingMoreIsSent) {
  const std::string path = files_ + "/invoices/INV-2.pdf";
  WriteBytes(path, AwkwardBytes(50'000, 2));
  // The first attempt is refused cleanly: nothing stored.
  ASSERT_NE(target_->Call("POST", "/_target/faults", R"({"upload": {"next": ["status:503"]}})")
                .find("upload"),
            std::string::npos);
  // A 503 read as unknown: the lookup comes no sooner than the request's 3 s timeout
  // after it was sent, finds nothing, and the step is resubmitted: the file is
  // changed in between.
  InstanceRecord instance;
  std::thread run([&] {
    instance = Run(UploadWorkflow("{ max_attempts: 3, initial_interval: 10ms }\n"
                                  "    errors: { 503: unknown }",
                                  "3s"),
                   {{"id", "INV-2"}});
  });
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (RequestsOn(Stats(), "upload") == 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  WriteBytes(path, AwkwardBytes(50'000, 3));  // same size, other bytes
  run.join();
  const Json stats = Stats();
  EXPECT_EQ(RequestsOn(stats, "upload"), 1) << "a changed file was uploaded under the same key";
  EXPECT_EQ(RequestsOn(stats, "search"), 1) << "the lookup before resubmitting";
  EXPECT_EQ(stats["documents"].get<int>(), 0);
  const StepRecord step = FirstStep(instance);
  EXPECT_EQ(step.state, StepState::kFailed);
  EXPECT_NE(step.error_message.find("the request changed since the last attempt"),
            std::string::npos)
      << step.error_message;
}

TEST_F(UploadTargetTest, ALargeFileIsStreamedNotHeldInMemory) {
  std::string big = AwkwardBytes(48 << 20, 4);
  WriteBytes(files_ + "/scan.tiff", big);
  const std::string sha = Sha256Hex(big);
  std::string().swap(big);
  if (!ResetPeak()) GTEST_SKIP() << "this kernel cannot reset the peak resident size";
  const long before = StatusKib("VmRSS");
  const InstanceRecord instance = Run(R"(workflow: upload-scan
key: "{{input.id}}"
steps:
  - name: put-scan
    request:
      method: PUT
      url: "{{env.DMS_URL}}/dms/raw/{{input.id}}"
      body_file: { path: scan.tiff, content_type: image/tiff }
      timeout: 60s
    idempotency: { honored: true }
    result: { external_id: /location }
)",
                                      {{"id", "scan-1"}});
  const long peak = StatusKib("VmHWM");
  EXPECT_EQ(instance.state, InstanceState::kCompleted) << instance.status_reason;
  const Json stored = Json::parse(target_->Call("GET", "/dms/documents/DOC-1", ""));
  EXPECT_EQ(stored["sha256"], sha);
  EXPECT_EQ(stored["size"].get<int>(), 48 << 20);
  EXPECT_EQ(stored["content_type"], "image/tiff");
  ASSERT_GT(before, 0);
  EXPECT_LT(peak - before, 24 * 1024)
      << "a 48 MiB upload raised the peak by " << (peak - before) << " KiB: it was held in memory";
}

TEST_F(UploadTargetTest, BytesFromTheInputAndFormFieldsArriveAsSent) {
  const std::string bytes = AwkwardBytes(4'000, 5);
  const InstanceRecord instance = Run(R"(workflow: upload-inline
key: "{{input.id}}"
steps:
  - name: attach
    request:
      method: POST
      url: "{{env.DMS_URL}}/dms/documents"
      multipart:
        fields: { ref: "{{input.id}}" }
        files:
          file: { base64: "{{input.content}}", filename: note.bin }
    idempotency: { honored: true }
    result: { external_id: /id }
  - name: register
    request:
      method: POST
      url: "{{env.DMS_URL}}/dms/forms"
      form: { ref: "{{input.id}}", note: "a b+c=d&e é", doc: "{{steps.attach.external_id}}" }
    idempotency: { honored: true }
    result: { external_id: /id }
)",
                                      {{"id", "A&B"}, {"content", Base64Encode(bytes)}});
  EXPECT_EQ(instance.state, InstanceState::kCompleted) << instance.status_reason;
  const Json stored = Json::parse(target_->Call("GET", "/dms/documents/DOC-1", ""));
  EXPECT_EQ(stored["sha256"], Sha256Hex(bytes));
  EXPECT_EQ(stored["filename"], "note.bin");
  EXPECT_EQ(stored["content_type"], "application/octet-stream");
  const Json form = Json::parse(target_->Call("GET", "/dms/forms/FORM-1", ""));
  EXPECT_EQ(form["fields"]["ref"], "A&B") << form.dump();
  EXPECT_EQ(form["fields"]["note"], "a b+c=d&e é") << form.dump();
  EXPECT_EQ(form["fields"]["doc"], "DOC-1") << form.dump();
}

TEST_F(UploadTargetTest, AFileOutsideTheFolderIsRefusedAndNothingIsSent) {
  WriteBytes(dir_.File("outside.txt"), "not for upload");
  std::filesystem::create_symlink(dir_.File("outside.txt"), files_ + "/invoices/link.pdf");
  const std::string yaml = R"(workflow: upload-outside
key: "{{input.id}}"
steps:
  - name: upload
    request:
      method: POST
      url: "{{env.DMS_URL}}/dms/documents"
      multipart:
        files:
          file: { path: "{{input.path}}" }
    idempotency: { honored: true }
)";
  for (const auto& [id, path, why] : std::vector<std::tuple<std::string, std::string, std::string>>{
           {"up", "../outside.txt", "may not contain '..'"},
           {"link", "invoices/link.pdf", "leads out of the files folder"},
           {"abs", dir_.File("outside.txt"), "must be a path relative to the files folder"},
           {"none", "invoices/missing.pdf", "no file 'invoices/missing.pdf'"}}) {
    const InstanceRecord instance = Run(yaml, {{"id", id}, {"path", path}});
    const StepRecord step = FirstStep(instance);
    EXPECT_EQ(step.state, StepState::kFailed) << id;
    EXPECT_NE(step.error_message.find(why), std::string::npos) << id << ": " << step.error_message;
  }
  EXPECT_EQ(Stats()["requests_total"].get<int>(), 0);
}

// Issue 45, high 2: globex's instance named acme's confidential document and uploaded
// it to globex's store. Each tenant's paths are resolved in its own folder.
TEST_F(UploadTargetTest, ATenantSendsOnlyFilesFromItsOwnFolder) {
  const std::string secret = AwkwardBytes(4'000, 7);
  std::filesystem::create_directories(dir_.File("files") + "/acme/invoices");
  std::filesystem::create_directories(dir_.File("files") + "/globex");
  WriteBytes(dir_.File("files") + "/acme/invoices/INV-1.pdf", secret);
  const std::string multipart = R"(workflow: upload-path
key: "{{input.id}}"
steps:
  - name: upload
    request:
      method: POST
      url: "{{env.DMS_URL}}/dms/documents"
      multipart:
        files:
          file: { path: "{{input.path}}" }
    idempotency: { honored: true }
)";
  const std::string raw = R"(workflow: put-path
key: "{{input.id}}"
steps:
  - name: raw
    request:
      method: PUT
      url: "{{env.DMS_URL}}/dms/raw/{{input.id}}"
      body_file: { path: "{{input.path}}" }
    idempotency: { honored: true }
)";
  int n = 0;
  for (const std::string* yaml : {&multipart, &raw}) {
    for (const char* path :
         {"acme/invoices/INV-1.pdf", "./acme/invoices/INV-1.pdf", "acme//invoices/INV-1.pdf",
          "../acme/invoices/INV-1.pdf", "invoices/INV-1.pdf"}) {
      const InstanceRecord instance =
          Run(*yaml, {{"id", "g" + std::to_string(n++)}, {"path", path}}, "globex");
      EXPECT_EQ(FirstStep(instance).state, StepState::kFailed) << path;
      EXPECT_NE(instance.state, InstanceState::kCompleted) << path;
    }
  }
  Json stats = Stats();
  EXPECT_EQ(stats["requests_total"].get<int>(), 0) << stats.dump();
  EXPECT_EQ(stats["by_sha256"].value(Sha256Hex(secret), 0), 0) << "acme's file reached globex";
  // acme's own instance sends it, from acme's folder.
  const InstanceRecord own = Run(multipart, {{"id", "a1"}, {"path", "invoices/INV-1.pdf"}}, "acme");
  EXPECT_EQ(own.state, InstanceState::kCompleted) << own.status_reason;
  stats = Stats();
  EXPECT_EQ(stats["by_sha256"].value(Sha256Hex(secret), 0), 1) << stats.dump();
}

// The client's own check on the way: a file whose bytes no longer match their pin
// (changed after the step pinned it) is cut off before its last byte, so the target
// never reads a complete request.
TEST_F(UploadTargetTest, AFileThatNoLongerMatchesItsPinIsCutOffBeforeItsEnd) {
  const std::string path = files_ + "/changed.bin";
  WriteBytes(path, AwkwardBytes(2 << 20, 6));
  auto pinned = Sha256File(path);
  ASSERT_TRUE(pinned.ok());
  WriteBytes(path, AwkwardBytes(2 << 20, 7));  // same size, other bytes, same inode
  FileContent content{path, "", pinned->sha256, pinned->size, pinned->device, pinned->inode};

  HttpRequest raw{"PUT", target_->base_url() + "/dms/raw/changed", {}, "", 10'000};
  raw.body_file = content;
  HttpRequest multipart{"POST", target_->base_url() + "/dms/documents", {}, "", 10'000};
  FormPart part;
  part.name = "file";
  part.is_file = true;
  part.filename = "changed.bin";
  part.file = content;
  multipart.multipart.push_back(part);
  for (const HttpRequest& request : {raw, multipart}) {
    const HttpResponse response = http_->Send(request);
    EXPECT_EQ(response.outcome.kind, CallOutcome::Kind::kNotSent) << request.url;
    EXPECT_TRUE(response.outcome.content_changed) << response.error;
    EXPECT_NE(response.error.find("changed after it was pinned"), std::string::npos)
        << response.error;
  }
  const Json stats = Stats();
  EXPECT_EQ(stats["documents"].get<int>(), 0) << stats.dump();
  EXPECT_EQ(stats["uploads"].get<int>(), 0) << stats.dump();

  // Another file put in its place (a rename over it) is not sent either, even with
  // the very bytes pinned: it is not the file that was pinned.
  WriteBytes(path + ".new", AwkwardBytes(2 << 20, 6));
  auto replaced = Sha256File(path + ".new");
  ASSERT_TRUE(replaced.ok());
  std::filesystem::rename(path + ".new", path);
  raw.body_file = {path, "", replaced->sha256, replaced->size, pinned->device, pinned->inode};
  EXPECT_TRUE(http_->Send(raw).outcome.content_changed);
  EXPECT_EQ(Stats()["uploads"].get<int>(), 0);

  // The same file with its true pin goes through whole.
  auto now = Sha256File(path);
  ASSERT_TRUE(now.ok());
  raw.body_file = {path, "", now->sha256, now->size, now->device, now->inode};
  const HttpResponse response = http_->Send(raw);
  EXPECT_EQ(response.outcome.status, 201) << response.error;
  EXPECT_EQ(Json::parse(response.body)["sha256"], now->sha256);
}

// Not about uploads as such: a transport error under a target names the target.
TEST_F(UploadTargetTest, ATransportErrorNamesItsTarget) {
  const InstanceRecord instance = Run(R"(workflow: dead-target
key: "{{input.id}}"
targets:
  archive: { url: "{{env.DEAD_URL}}" }
steps:
  - name: archive
    request:
      method: PUT
      url: "{{env.DEAD_URL}}/objects/{{input.id}}"
      form: { id: "{{input.id}}" }
    idempotency: { honored: true }
    retry: { max_attempts: 1 }
)",
                                      {{"id", "x"}});
  const StepRecord step = FirstStep(instance);
  EXPECT_EQ(step.state, StepState::kFailed);
  EXPECT_NE(step.error_message.find("target 'archive': "), std::string::npos) << step.error_message;
}

TEST(UploadLoadTest, EachRequestHasOneBodyAndEachFileOneSource) {
  auto lint = [](const std::string& request) {
    std::string all;
    for (const Diagnostic& d : LintDefinitionText(R"(workflow: t
key: "{{input.id}}"
steps:
  - name: up
    idempotency: { honored: true }
    request:
      method: POST
      url: "http://dms.test/docs"
)" + request,
                                                  "t.yaml", nullptr)) {
      all += d.ToString() + "\n";
    }
    return all;
  };
  EXPECT_EQ(lint("      multipart: { files: { file: { path: a.pdf } } }\n"), "");
  EXPECT_EQ(lint("      body_file: { base64: \"{{input.pdf}}\" }\n"), "");
  std::string d = lint("      body: { a: 1 }\n      form: { b: c }\n");
  EXPECT_NE(d.find("more than one of 'body', 'form', 'multipart', 'body_file'"), std::string::npos)
      << d;
  d = lint("      multipart: { files: { file: { path: a.pdf, base64: QQ== } } }\n");
  EXPECT_NE(d.find("multipart file 'file' needs exactly one of 'path'"), std::string::npos) << d;
  d = lint("      multipart: { fields: { a: b } }\n");
  EXPECT_NE(d.find("'multipart.files' must map part names to files"), std::string::npos) << d;
  d = lint(
      "      headers: { Content-Type: multipart/form-data }\n"
      "      multipart: { files: { file: { path: a.pdf } } }\n");
  EXPECT_NE(d.find("sets its own Content-Type"), std::string::npos) << d;
  d = lint("      body_file: { path: \"{{steps.nope.response.x}}\" }\n");
  EXPECT_NE(d.find("request.file.path"), std::string::npos) << d;
}

}  // namespace
}  // namespace waystone
