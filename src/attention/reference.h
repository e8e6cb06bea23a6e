// Double-precision reference attention (tests and `escala attention --impl reference` only).
#pragma once
#include "escala/attention.h"

namespace escala::attn {
// Assumes validate(p) passed.
void attention_reference(const AttentionParams& p);
}  // namespace escala::attn
