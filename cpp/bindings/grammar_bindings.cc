// Grammar checks without a model: how much of a token sequence a grammar accepts. The server's
// grammar construction (python/dsv41rt/serve/grammar.py) is tested with it against outputs the
// recipe would misparse, which a random model writes too rarely to test by sampling.
#include <nanobind/nanobind.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <string>
#include <utility>
#include <vector>

#include "bindings/sampling_params.h"
#include "runtime/engine/grammar.h"

namespace nb = nanobind;

namespace dsv41rt::bindings {

void register_grammar(nb::module_& m) {
  m.def(
      "grammar_accepted_prefix",
      [](const std::vector<nb::bytes>& tokens, int64_t vocab_size,
         const std::vector<int32_t>& stop_token_ids, const nb::dict& grammar,
         const std::vector<int32_t>& token_ids) {
        std::vector<std::string> t;
        t.reserve(tokens.size());
        for (const nb::bytes& b : tokens) t.emplace_back(b.c_str(), b.size());
        const GrammarParams g = grammar_params_from_dict(grammar);
        nb::gil_scoped_release release;
        const engine::GrammarVocab vocab(t, vocab_size, stop_token_ids);
        auto matcher = vocab.compile(g);
        int64_t accepted = 0;
        for (int32_t id : token_ids) {
          if (!matcher->accept(id)) break;
          ++accepted;
        }
        return std::make_pair(accepted, matcher->terminated());
      },
      nb::arg("tokens"), nb::arg("vocab_size"), nb::arg("stop_token_ids"), nb::arg("grammar"),
      nb::arg("token_ids"),
      "(how many leading token_ids the grammar accepts, whether it then ended on a stop token). "
      "tokens, vocab_size, stop_token_ids as Runtime.set_grammar_vocab; grammar as add_request's.");
}

}  // namespace dsv41rt::bindings
