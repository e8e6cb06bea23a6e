// The SIMD targets Highway compiled the kernels for and this CPU runs. Tests pin dispatch to each
// in turn, so that the AVX2 / SSE4 code a user's machine may take is tested here too, not only
// the widest target this machine would pick.
#pragma once

#include <cstdint>
#include <vector>

#include <hwy/targets.h>

namespace escala::test {

inline std::vector<int64_t> simd_targets() { return hwy::SupportedAndGeneratedTargets(); }

inline const char* simd_target_name(int64_t target) { return hwy::TargetName(target); }

// Dispatch goes to `target` only while this lives; then back to the best one.
class PinSimdTarget {
 public:
  explicit PinSimdTarget(int64_t target) { hwy::SetSupportedTargetsForTest(target); }
  ~PinSimdTarget() { hwy::SetSupportedTargetsForTest(0); }
  PinSimdTarget(const PinSimdTarget&) = delete;
  PinSimdTarget& operator=(const PinSimdTarget&) = delete;
};

}  // namespace escala::test
