#include "bindings/sampling_params.h"

#include <nanobind/stl/string.h>

#include <string>

#include "core/status.h"

namespace nb = nanobind;

namespace dsv41rt::bindings {
namespace {

template <typename T>
T field(nb::handle value, const std::string& key) {
  // bool is an int subclass in Python; a flag where a number belongs is almost surely a mistake.
  DSV41RT_CHECK(!nb::isinstance<nb::bool_>(value), "sampling params: '", key,
                "' must be a number, got a bool");
  try {
    return nb::cast<T>(value);
  } catch (const nb::python_error&) {
  } catch (const nb::cast_error&) {
  }
  DSV41RT_THROW("sampling params: '", key, "' has the wrong type or is out of range: ",
                nb::borrow<nb::str>(nb::repr(value)).c_str());
}

}  // namespace

template <class Params>
Params sampling_params_from_dict(const nb::dict& d) {
  Params p;
  for (auto [k, v] : d) {
    DSV41RT_CHECK(nb::isinstance<nb::str>(k), "sampling params: keys must be strings");
    const std::string key = nb::borrow<nb::str>(k).c_str();
    if (v.is_none()) continue;  // None = the default, as OpenAI clients send it
    if (key == "temperature") {
      p.temperature = field<float>(v, key);
    } else if (key == "top_k") {
      p.top_k = field<int32_t>(v, key);
    } else if (key == "top_p") {
      p.top_p = field<float>(v, key);
    } else if (key == "min_p") {
      p.min_p = field<float>(v, key);
    } else if (key == "presence_penalty") {
      p.presence_penalty = field<float>(v, key);
    } else if (key == "frequency_penalty") {
      p.frequency_penalty = field<float>(v, key);
    } else if (key == "repetition_penalty") {
      p.repetition_penalty = field<float>(v, key);
    } else if (key == "seed") {
      p.seed = field<uint64_t>(v, key);
    } else if (key == "top_logprobs") {
      p.top_logprobs = field<int32_t>(v, key);
    } else {
      DSV41RT_THROW("sampling params: unknown key '", key, "'");
    }
  }
  return p;
}

GrammarParams grammar_params_from_dict(const nb::dict& d) {
  GrammarParams g;
  for (auto [k, v] : d) {
    DSV41RT_CHECK(nb::isinstance<nb::str>(k), "grammar: keys must be strings");
    const std::string key = nb::borrow<nb::str>(k).c_str();
    if (v.is_none()) continue;
    if (key == "kind" || key == "text") {
      DSV41RT_CHECK(nb::isinstance<nb::str>(v), "grammar: '", key, "' must be a string");
      (key == "kind" ? g.kind : g.text) = nb::cast<std::string>(v);
    } else if (key == "start_token") {
      g.start_token = field<int32_t>(v, key);
    } else if (key == "start_within") {
      g.start_within = field<int64_t>(v, key);
    } else {
      DSV41RT_THROW("grammar: unknown key '", key, "'");
    }
  }
  return g;
}

template kernels::SamplingParams sampling_params_from_dict<kernels::SamplingParams>(
    const nb::dict&);
template SamplingParams sampling_params_from_dict<SamplingParams>(const nb::dict&);

}  // namespace dsv41rt::bindings
