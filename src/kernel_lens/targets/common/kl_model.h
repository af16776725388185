// The interface between a model's generated launch functions and a target's host glue.
#pragma once

#include "kl_runtime.h"

namespace kl {

int launch_count();
// Runs launch `index` of the model (the node attribute `launch`) on the target's context.
// Errors (driver failures, a context that cannot be made current, sizes out of range) come
// back as the Status; a kl::RankError thrown by the target's own dim()/input() propagates,
// for the target to turn into its error status.
Status run_launch(int index, LaunchContext& ctx);

}  // namespace kl
