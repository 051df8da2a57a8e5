// evidence/environment.h: the facts every result bundle records about where it was made: the git
// sha and dirty flag of the source tree this binary was built from, the build, the CPU, the host
// and the GPUs. One collector for every bundle (bench-serve, layer-diff, the bench/ programs), so
// bundles made by different programs compare field by field.
#pragma once
#include <nlohmann/json.hpp>

namespace k3::evidence {

// {git_sha, git_dirty (untracked files too), build_type, cxx_flags, cuda_build, compiler, cpu,
//  cpu_threads, host, gpu}. git runs in the source tree when it is still there, else in the
// working directory; "" when neither is a checkout.
nlohmann::json environment();
// nvidia-smi's name, driver, current and max SM / memory clocks and memory of every GPU; the
// string "none" without nvidia-smi or GPUs.
nlohmann::json gpu_info();

}  // namespace k3::evidence
