#pragma once

// Inside the API library only: a public Workflow's function as the engine's
// CodeWorkflow.

#include <functional>
#include <string>
#include <utility>

#include "engine/code_workflow.h"
#include "waystone/workflow.h"

namespace waystone::api {

class FunctionWorkflow final : public CodeWorkflow {
 public:
  using Function = std::function<Result<std::string>(Context&, const std::string&)>;
  explicit FunctionWorkflow(Function function) : function_(std::move(function)) {}
  absl::StatusOr<std::string> Run(CodeContext& ctx, const std::string& input_json) const override;

 private:
  Function function_;
};

}  // namespace waystone::api
