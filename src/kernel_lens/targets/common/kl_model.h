// The interface between a model's generated launch functions and a target's host glue.
#pragma once

#include "kl_runtime.h"

namespace kl {

int launch_count();
// Runs launch `index` of the model (the node attribute `launch`) on the target's context.
Status run_launch(int index, LaunchContext& ctx);

}  // namespace kl
