// Sampling parameters from a Python dict whose keys are the SamplingParams fields (shared by the
// ops binding and the engine binding).
#pragma once

#include <nanobind/nanobind.h>

#include "dsv41rt/runtime.hpp"
#include "kernels/sampling.h"

namespace dsv41rt::bindings {

/// Missing keys keep the defaults; an unknown key or a value of the wrong type is an Error naming
/// the key. Values are range-checked later by validate_sampling_params.
/// Params: kernels::SamplingParams (the ops) or dsv41rt::SamplingParams (the Runtime); the same
/// field names.
template <class Params = kernels::SamplingParams>
Params sampling_params_from_dict(const nanobind::dict& d);

/// A request's grammar from {kind, text, start_token, start_within} (GrammarParams; {}: none).
GrammarParams grammar_params_from_dict(const nanobind::dict& d);

}  // namespace dsv41rt::bindings
