// cider/core/env.h — environment switches (the A/B variables of the CUDA kernels, docs/cuda/switches.md): a variable
// is read as a flag, an integer or one of a set of words, and any other value is an error naming the operation, the
// variable and what it accepts — never silently taken as the default.
#pragma once

#include <initializer_list>
#include <string>

namespace cider {

// Unset or empty: default_value; "0": false; "1": true; anything else: Error(kInvalidArgument).
bool env_flag(const char* name, bool default_value, const char* op);

// Unset or empty: default_value; a decimal integer in [lo, hi]; anything else: Error(kInvalidArgument).
int env_int(const char* name, int default_value, int lo, int hi, const char* op);

// Unset or empty: default_value; one of `words`; anything else: Error(kInvalidArgument) listing them.
std::string env_word(const char* name, const char* default_value, std::initializer_list<const char*> words,
                     const char* op);

}  // namespace cider
