#include "runtime/engine/grammar.h"

#include <algorithm>
#include <cstring>
#include <exception>

#include "core/status.h"
#include "dsv41rt/runtime.hpp"
#include "kernels/sampling.h"

#if DSV41RT_HAVE_XGRAMMAR
#include <xgrammar/xgrammar.h>
#endif

namespace dsv41rt::engine {

#if DSV41RT_HAVE_XGRAMMAR

namespace xg = xgrammar;

struct GrammarVocab::Impl {
  int64_t vocab_size;
  xg::TokenizerInfo info;
  mutable xg::GrammarCompiler compiler;
  Impl(const std::vector<std::string>& tokens, int64_t V, const std::vector<int32_t>& stops)
      : vocab_size(V),
        info(tokens, xg::VocabType::RAW, int(V), stops),
        // One compile thread: compiles run on the submitting thread, beside the engine's.
        compiler(info, /*max_threads=*/1, /*cache_enabled=*/true) {}
};

struct RequestGrammar::Impl {
  xg::GrammarMatcher matcher;
  int64_t words;
  int32_t start_token;
  int64_t start_within;
  bool started;
};

bool GrammarVocab::available() { return true; }

GrammarVocab::GrammarVocab(const std::vector<std::string>& tokens, int64_t vocab_size,
                           const std::vector<int32_t>& stop_token_ids) {
  DSV41RT_CHECK(
      vocab_size >= 1 && vocab_size <= (int64_t(1) << 30) && int64_t(tokens.size()) <= vocab_size,
      "grammar vocabulary: ", tokens.size(), " tokens for a vocabulary of ", vocab_size);
  DSV41RT_CHECK(!stop_token_ids.empty(), "grammar vocabulary: at least one stop token is needed");
  for (int32_t t : stop_token_ids) {
    DSV41RT_CHECK(t >= 0 && t < vocab_size, "grammar vocabulary: stop token ", t,
                  " is outside the vocabulary [0, ", vocab_size, ")");
  }
  try {
    impl_ = std::make_unique<Impl>(tokens, vocab_size, stop_token_ids);
  } catch (const std::exception& e) {
    DSV41RT_THROW_CODE(kInvalidArgument, "grammar vocabulary: ", e.what());
  }
}

std::shared_ptr<RequestGrammar> GrammarVocab::compile(const GrammarParams& g) const {
  DSV41RT_CHECK_CODE(kInvalidArgument, g.start_token >= -1 && g.start_token < impl_->vocab_size,
                     "grammar start_token ", g.start_token, " is outside the vocabulary");
  DSV41RT_CHECK_CODE(kInvalidArgument, g.start_within >= -1, "grammar start_within must be >= -1");
  DSV41RT_CHECK_CODE(kInvalidArgument, g.start_within == -1 || g.start_token >= 0,
                     "grammar start_within needs a start_token");
  auto compiled = [&]() -> xg::CompiledGrammar {
    xg::GrammarCompiler& c = impl_->compiler;
    if (g.kind == "json_object") {  // compact: no free whitespace for a model to loop on
      return c.CompileJSONSchema(R"({"type": "object"})", /*any_whitespace=*/false);
    }
    if (g.kind == "json_schema") return c.CompileJSONSchema(g.text, /*any_whitespace=*/false);
    if (g.kind == "structural_tag") return c.CompileStructuralTag(g.text);
    if (g.kind == "ebnf") return c.CompileGrammar(g.text, "root");
    if (g.kind == "regex") return c.CompileRegex(g.text);
    DSV41RT_THROW_CODE(kInvalidArgument, "grammar kind '", g.kind,
                       "' is not one of json_object, json_schema, structural_tag, ebnf, regex");
  };
  std::unique_ptr<RequestGrammar::Impl> impl;
  try {
    impl = std::make_unique<RequestGrammar::Impl>(RequestGrammar::Impl{
        xg::GrammarMatcher(compiled()), kernels::token_mask_words(impl_->vocab_size), g.start_token,
        g.start_within, g.start_token < 0});
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    DSV41RT_THROW_CODE(kInvalidArgument, "grammar (", g.kind, "): ", e.what());
  }
  return std::make_shared<RequestGrammar>(std::move(impl));
}

bool RequestGrammar::next_mask(uint32_t* words, int64_t generated) {
  Impl& s = *impl_;
  if (!s.started) {
    if (s.start_within < 0 || generated < s.start_within) return false;
    std::fill(words, words + s.words, 0u);  // past the budget: only the start token
    words[s.start_token / 32] = 1u << (s.start_token % 32);
    return true;
  }
  int64_t shape[1] = {s.words};
  DLTensor t{};
  t.data = words;
  t.device = DLDevice{kDLCPU, 0};
  t.ndim = 1;
  t.dtype = xg::GetBitmaskDLType();
  t.shape = shape;
  s.matcher.FillNextTokenBitmask(&t);
  return true;
}

bool RequestGrammar::accept(int32_t token) {
  Impl& s = *impl_;
  if (!s.started) {
    if (token == s.start_token) s.started = true;
    return true;
  }
  return s.matcher.AcceptToken(token);
}

bool RequestGrammar::terminated() const { return impl_->started && impl_->matcher.IsTerminated(); }

#else  // no xgrammar in this build

struct GrammarVocab::Impl {
  int64_t vocab_size;
};
struct RequestGrammar::Impl {};

bool GrammarVocab::available() { return false; }

GrammarVocab::GrammarVocab(const std::vector<std::string>&, int64_t, const std::vector<int32_t>&) {
  DSV41RT_THROW_CODE(kInvalidArgument,
                     "grammar-constrained decoding is not in this build (configured without "
                     "xgrammar: DSV41RT_WITH_XGRAMMAR, cmake/Xgrammar.cmake)");
}

std::shared_ptr<RequestGrammar> GrammarVocab::compile(const GrammarParams&) const { return {}; }
bool RequestGrammar::next_mask(uint32_t*, int64_t) { return false; }
bool RequestGrammar::accept(int32_t) { return true; }
bool RequestGrammar::terminated() const { return false; }

#endif

GrammarVocab::~GrammarVocab() = default;
int64_t GrammarVocab::vocab_size() const { return impl_->vocab_size; }

RequestGrammar::RequestGrammar(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
RequestGrammar::~RequestGrammar() = default;

}  // namespace dsv41rt::engine
