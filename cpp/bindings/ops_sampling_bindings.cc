// dsv41rt._core.ops bindings of the sampler (kernels/sampling.h): the filtered distribution and the
// seeded draw; parameters come as a dict whose keys are the SamplingParams fields.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <cstdint>
#include <optional>
#include <string>

#include "bindings/numpy_io.h"
#include "bindings/sampling_params.h"
#include "core/status.h"
#include "kernels/sampling.h"

namespace nb = nanobind;

namespace dsv41rt::bindings {
namespace {

using kernels::SamplingParams;

using Logits = nb::ndarray<const float, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
using Tokens = nb::ndarray<const int32_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;

struct History {
  const int32_t* prompt = nullptr;
  int64_t n_prompt = 0;
  const int32_t* output = nullptr;
  int64_t n_output = 0;
};

History history(const std::optional<Tokens>& prompt, const std::optional<Tokens>& output) {
  History h;
  if (prompt) h.prompt = prompt->data(), h.n_prompt = int64_t(prompt->shape(0));
  if (output) h.output = output->data(), h.n_output = int64_t(output->shape(0));
  return h;
}

nb::ndarray<nb::numpy, float> sampling_probs_np(Logits logits, nb::dict params,
                                                std::optional<Tokens> prompt,
                                                std::optional<Tokens> output) {
  const SamplingParams p = sampling_params_from_dict(params);
  const History h = history(prompt, output);
  const int64_t V = logits.shape(0);
  auto out = new_array<float>({size_t(V)});
  nb::gil_scoped_release release;
  kernels::cpu::sampling_probs(logits.data(), V, p, h.prompt, h.n_prompt, h.output, h.n_output,
                               out.data());
  return out;
}

nb::tuple sample_token_np(Logits logits, nb::dict params, std::optional<Tokens> prompt,
                          std::optional<Tokens> output, uint64_t step) {
  const SamplingParams p = sampling_params_from_dict(params);
  const History h = history(prompt, output);
  const int64_t V = logits.shape(0);
  kernels::SampledToken s;
  {
    nb::gil_scoped_release release;
    s = kernels::cpu::sample_token(logits.data(), V, p, h.prompt, h.n_prompt, h.output, h.n_output,
                                   step);
  }
  auto ids = new_array<int32_t>({s.top_ids.size()});
  auto lps = new_array<float>({s.top_logprobs.size()});
  for (size_t i = 0; i < s.top_ids.size(); ++i) {
    ids.data()[i] = s.top_ids[i];
    lps.data()[i] = s.top_logprobs[i];
  }
  return nb::make_tuple(s.token, s.logprob, ids, lps);
}

}  // namespace

void register_ops_sampling(nb::module_& ops) {
  ops.def("sampling_probs", &sampling_probs_np, nb::arg("logits"), nb::arg("params"),
          nb::arg("prompt").none() = nb::none(), nb::arg("output").none() = nb::none(),
          "The filtered distribution sampled from (kernels/sampling.h): float32 [V].");
  ops.def("sample_token", &sample_token_np, nb::arg("logits"), nb::arg("params"),
          nb::arg("prompt").none() = nb::none(), nb::arg("output").none() = nb::none(),
          nb::arg("step") = 0,
          "One token drawn with the (seed, step) generator: (token, logprob, top_ids int32 [n], "
          "top_logprobs float32 [n]); logprobs are raw (log_softmax of the unmodified logits).");
}

}  // namespace dsv41rt::bindings
