#include "bindings/sampling_params.h"

#include <nanobind/stl/string.h>

#include <string>

#include "core/status.h"

namespace nb = nanobind;

namespace dsv41rt::bindings {
namespace {

// `what` names the dictionary in messages ("sampling params", "grammar").
template <typename T>
T field(nb::handle value, const char* what, const std::string& key) {
  // bool is an int subclass in Python; a flag where a number belongs is almost surely a mistake.
  DSV41RT_CHECK(!nb::isinstance<nb::bool_>(value), what, ": '", key,
                "' must be a number, got a bool");
  try {
    return nb::cast<T>(value);
  } catch (const nb::python_error&) {
  } catch (const nb::cast_error&) {
  }
  DSV41RT_THROW(what, ": '", key, "' has the wrong type or is out of range: ",
                nb::borrow<nb::str>(nb::repr(value)).c_str());
}

// fn(key, value) for every entry of d whose value is not None (None = the default, as OpenAI
// clients send it); keys must be strings.
template <typename Fn>
void for_each_set(const nb::dict& d, const char* what, Fn&& fn) {
  for (auto [k, v] : d) {
    DSV41RT_CHECK(nb::isinstance<nb::str>(k), what, ": keys must be strings");
    if (!v.is_none()) fn(std::string(nb::borrow<nb::str>(k).c_str()), v);
  }
}

}  // namespace

template <class Params>
Params sampling_params_from_dict(const nb::dict& d) {
  constexpr const char* kWhat = "sampling params";
  Params p;
  for_each_set(d, kWhat, [&](const std::string& key, nb::handle v) {
    if (key == "temperature") {
      p.temperature = field<float>(v, kWhat, key);
    } else if (key == "top_k") {
      p.top_k = field<int32_t>(v, kWhat, key);
    } else if (key == "top_p") {
      p.top_p = field<float>(v, kWhat, key);
    } else if (key == "min_p") {
      p.min_p = field<float>(v, kWhat, key);
    } else if (key == "presence_penalty") {
      p.presence_penalty = field<float>(v, kWhat, key);
    } else if (key == "frequency_penalty") {
      p.frequency_penalty = field<float>(v, kWhat, key);
    } else if (key == "repetition_penalty") {
      p.repetition_penalty = field<float>(v, kWhat, key);
    } else if (key == "seed") {
      p.seed = field<uint64_t>(v, kWhat, key);
    } else if (key == "top_logprobs") {
      p.top_logprobs = field<int32_t>(v, kWhat, key);
    } else {
      DSV41RT_THROW(kWhat, ": unknown key '", key, "'");
    }
  });
  return p;
}

GrammarParams grammar_params_from_dict(const nb::dict& d) {
  constexpr const char* kWhat = "grammar";
  GrammarParams g;
  for_each_set(d, kWhat, [&](const std::string& key, nb::handle v) {
    if (key == "kind" || key == "text") {
      DSV41RT_CHECK(nb::isinstance<nb::str>(v), kWhat, ": '", key, "' must be a string");
      (key == "kind" ? g.kind : g.text) = nb::cast<std::string>(v);
    } else if (key == "start_token") {
      g.start_token = field<int32_t>(v, kWhat, key);
    } else if (key == "start_within") {
      g.start_within = field<int64_t>(v, kWhat, key);
    } else {
      DSV41RT_THROW(kWhat, ": unknown key '", key, "'");
    }
  });
  return g;
}

template kernels::SamplingParams sampling_params_from_dict<kernels::SamplingParams>(
    const nb::dict&);
template SamplingParams sampling_params_from_dict<SamplingParams>(const nb::dict&);

}  // namespace dsv41rt::bindings
