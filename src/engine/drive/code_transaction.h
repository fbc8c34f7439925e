#pragma once

// A code workflow's transaction step (ctx.Transaction): its function, run by the store
// in the transaction of the step's checkpoint, whose statements are refused Waystone's
// own tables as a sql step's are, and whose events commit with it.

#include <functional>
#include <string>

#include "absl/status/statusor.h"
#include "base/clock.h"
#include "base/mutex.h"
#include "base/random.h"
#include "engine/code_workflow.h"
#include "model/records.h"
#include "store/business_work.h"

namespace waystone {

class TransactionWork final : public BusinessWork {
 public:
  using Fn = std::function<absl::StatusOr<std::string>(CodeTransaction&)>;
  // `tenant_scoped`: every statement must touch only the instance's tenant's rows
  // (model/sql_tenant_scope.h; a runtime with `tenants:`).
  TransactionWork(int index, const Fn& fn, const InstanceRecord& instance, Random& random,
                  Millis now, bool tenant_scoped = false)
      : index_(index),
        fn_(fn),
        instance_(instance),
        random_(random),
        now_(now),
        tenant_scoped_(tenant_scoped) {}

  int step_index() const override { return index_; }

  absl::StatusOr<BusinessWorkResult> Run(StatementRunner& sql) const override;

  // The result of the last run (the one that committed, once Commit returned OK).
  std::string last_result() const {
    MutexLock lock(mu_);
    return last_result_;
  }

 private:
  class Session;  // the CodeTransaction the function is given

  const int index_;
  const Fn fn_;
  const InstanceRecord instance_;
  Random& random_;
  const Millis now_;
  const bool tenant_scoped_;
  mutable Mutex mu_;
  mutable std::string last_result_ ABSL_GUARDED_BY(mu_);
};

}  // namespace waystone
