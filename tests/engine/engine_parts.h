#pragma once

#include <memory>
#include <string>

#include <gtest/gtest.h>

#include "base/sha256.h"
#include "store/store.h"
#include "support/temp_dir.h"

namespace waystone::testing {

// A fresh SQLite store with instances to claim: what the CommitQueue and the
// LeaseKeeper tests commit against (they test the queue and the keeper, not a store).
class StoreWithInstances : public ::testing::Test {
 protected:
  void SetUp() override {
    auto store = OpenStore({dir_.File("parts.db")});
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = std::move(*store);
    ASSERT_TRUE(store_->PutDefinition("defhash", "wf", "wf.yaml", "workflow: wf", 0).ok());
  }

  // A start of instance `key` of the one-step workflow "wf" in tenant t1, at `now`.
  static NewInstance StartOf(const std::string& key, Millis now = 1000) {
    NewInstance in;
    in.tenant = "t1";
    in.key = key;
    in.workflow = "wf";
    in.definition_hash = "defhash";
    in.input_json = R"({"a":1})";
    in.input_hash = Sha256Hex(in.input_json);
    in.trace_id = "trace-" + key;
    in.step_names = {"one"};
    in.started_event = {0, "ev-" + key, 0, "t1", "waystone.instance.started", "{}", 0};
    in.now = now;
    return in;
  }

  // Starts instance `key` (running, due at `now`) and claims it for `owner`.
  Lease StartAndClaim(const std::string& key, Millis now, Millis lease_duration,
                      const std::string& owner = "worker-1") {
    auto started = store_->StartInstance(StartOf(key, now));
    EXPECT_TRUE(started.ok()) << started.status();
    if (!started.ok()) return {};
    auto lease = store_->ClaimInstance(started->instance.id, owner, now, lease_duration);
    EXPECT_TRUE(lease.ok()) << lease.status();
    return lease.ok() ? *lease : Lease{};
  }

  InstanceRecord Get(int64_t id) {
    auto instance = store_->GetInstance(id);
    EXPECT_TRUE(instance.ok()) << instance.status();
    return instance.ok() ? *instance : InstanceRecord{};
  }

  TempDir dir_;
  std::unique_ptr<Store> store_;
};

}  // namespace waystone::testing
