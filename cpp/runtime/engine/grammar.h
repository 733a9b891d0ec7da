// Grammar-constrained decoding: a request's output held to a grammar (a JSON schema, a tool-call
// format, EBNF, a regex) by masking the logits before each draw (kernels/sampling.h token masks).
//
// xgrammar's C++ core does the work (built in from its source distribution, cmake/Xgrammar.cmake):
// GrammarVocab compiles a grammar against the tokenizer's vocabulary once per request (cached by
// xgrammar across requests), and each RequestGrammar is one request's matcher: which tokens may
// come next, then the token that was drawn. Both run on the host, beside the engine, without
// Python; the mask goes to the device with the forward's other per-step data.
//
// A grammar may start late: with `start_token` (e.g. "</think>") the output is free until that
// token is drawn and held to the grammar after it, and with `start_within` the token is forced
// once that many tokens came without it (so a reasoning model always reaches the constrained part).
//
// Builds without xgrammar (DSV41RT_HAVE_XGRAMMAR unset) refuse grammars at submit, naming why.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/export.h"

namespace dsv41rt {
struct GrammarParams;
}

namespace dsv41rt::engine {

class RequestGrammar;

/// The tokenizer's vocabulary as xgrammar sees it, and the compiler over it. Thread-safe.
class DSV41RT_API GrammarVocab {
 public:
  /// Whether this build has xgrammar.
  static bool available();
  /// tokens[i]: the bytes token i decodes to, "" for a token no grammar may produce (control
  /// tokens); ids past tokens.size() up to vocab_size are such tokens too. stop_token_ids end an
  /// output the grammar has completed (the model's end-of-sequence token). Throws Error when the
  /// build has no xgrammar or the arguments do not fit.
  GrammarVocab(const std::vector<std::string>& tokens, int64_t vocab_size,
               const std::vector<int32_t>& stop_token_ids);
  ~GrammarVocab();
  GrammarVocab(const GrammarVocab&) = delete;
  GrammarVocab& operator=(const GrammarVocab&) = delete;

  int64_t vocab_size() const;
  /// A fresh matcher of `g` (kind "json_object", "json_schema", "structural_tag", "ebnf" or
  /// "regex"); throws Error(kInvalidArgument) naming the kind and what the compiler refused.
  std::shared_ptr<RequestGrammar> compile(const GrammarParams& g) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// One request's place in its grammar. Used by the engine thread only.
class DSV41RT_API RequestGrammar {
 public:
  struct Impl;
  explicit RequestGrammar(std::unique_ptr<Impl> impl);
  ~RequestGrammar();

  /// The tokens allowed next, after `generated` tokens of output, into words
  /// [token_mask_words(vocab)]; false (words untouched) when every token is allowed.
  bool next_mask(uint32_t* words, int64_t generated);
  /// Takes the drawn token; false when the grammar cannot (the mask forbade it).
  bool accept(int32_t token);
  /// The grammar is complete (its stop token was taken): the output ends here.
  bool terminated() const;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace dsv41rt::engine
