// Speculative decoding in the engine (engine/speculation.h, issue 24) on the tiny checkpoint
// (DSV41RT_TEST_CHECKPOINT, with DSpark weights): 16 greedy requests with prompts of 1..300
// tokens, submitted while others run, give the tokens, logprobs, top logprobs and finish reasons
// of the engine without speculation, bitwise, with the DSpark drafter (random weights accept
// almost nothing), with the known continuation as drafts (everything accepted: the counts and the
// number of sampling forwards say so) and with drafts wrong at index j (exactly j accepted); stop
// tokens inside an accepted block (with penalties), a pool small enough to preempt, a cancel
// mid-generation, prefix caching with hits; the pool invariants after every step and no page or
// slot left at the end. Sampling requests speculate by rejection sampling: whole outputs beside
// bitwise greedy ones, and the distribution of 300 of them against plain sampling (chi-square).
// Forced acceptance (benchmarks, not lossless): exactly the forced drafts in the outputs and the
// counters, the target's token after them, clamped counts, stops inside a forced block, the pool
// as plain decoding leaves it (accept_forced itself on made-up rows). Bad configs by message.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/safetensors.h"
#include "core/status.h"
#include "engine_test_util.h"
#include "executor_test_util.h"
#include "runtime/engine/engine.h"
#include "runtime/model/engram_tables.h"
#include "runtime/model/executor.h"
#include "runtime/model/layer_plan.h"
#include "runtime/model/model_config.h"
#include "runtime/model/weights.h"

namespace dsv41rt::engine {
namespace {

using namespace ::dsv41rt::model;  // NOLINT: the loaders of the checkpoint
using Outcome = ::dsv41rt::testing::EngineOutcome;

using ::dsv41rt::testing::checkpoint;
using ::dsv41rt::testing::salted_prompt;

std::shared_ptr<Executor> load(bool drafts = true, int64_t kv_memory = 64ll << 20,
                               int64_t slots = 8) {
  ExecutorOptions options;
  options.kv_memory = kv_memory;
  options.max_num_seqs = slots;
  options.page_tokens = 4;
  options.max_num_batched_tokens = 64;
  return ::dsv41rt::testing::load_tiny_executor(options, drafts);
}

// 16 prompts of 1..300 tokens (page boundaries of 4, the window of 8, long compressions).
std::vector<std::vector<int32_t>> prompts() {
  std::vector<std::vector<int32_t>> p;
  for (int64_t n : {1, 2, 3, 5, 7, 8, 9, 16, 31, 64, 100, 129, 200, 257, 300, 13}) {
    p.push_back(salted_prompt(n, n));
  }
  return p;
}

GenerationParams greedy(int64_t max_new, std::vector<int32_t> stops = {}) {
  GenerationParams g;
  g.max_new_tokens = max_new;
  g.ignore_eos = true;
  g.sampling.temperature = 0.0f;
  g.sampling.top_logprobs = 2;
  g.stop_token_ids = std::move(stops);
  return g;
}

EngineConfig config(int64_t k, DraftSource source = {}) {
  EngineConfig c;
  c.max_num_seqs = 4;
  c.max_num_batched_tokens = 64;
  // Decodes always leave room for their drafts (4 x (1 + 5) + 32 <= 64): exact counts below.
  c.max_prefill_tokens_while_decoding = 32;
  c.speculation.num_speculative_tokens = k;
  c.speculation.draft_source = std::move(source);
  return c;
}

struct Result {
  std::map<int64_t, Outcome> out;
  std::map<int64_t, int64_t> sampling_steps;  ///< outputs carrying tokens, per request
  EngineStats stats;
};

// Submits 6 requests, then 2 more every other step (staggered arrivals), until all ran.
Result run(Engine& engine, const std::vector<std::vector<int32_t>>& ps,
           const std::vector<GenerationParams>& params, int64_t cancel_id = -1) {
  Result r;
  size_t next = 0;
  int64_t step = 0;
  while (next < ps.size() || !engine.idle()) {
    const size_t burst = next == 0 ? 6 : (step % 2 == 0 ? 2 : 0);
    for (size_t i = 0; i < burst && next < ps.size(); ++i, ++next) {
      EXPECT_EQ(engine.submit(ps[next], params[next]), int64_t(next) + 1);
    }
    // Request 2 (a 2-token prompt) is decoding by then, with speculation mid-generation.
    if (cancel_id > 0 && step == 3 && engine.has_request(cancel_id)) engine.cancel(cancel_id);
    for (const RequestOutput& o : engine.step()) {
      ::dsv41rt::testing::collect(o, r.out[o.id]);
      if (!o.new_tokens.empty()) ++r.sampling_steps[o.id];
    }
    engine.check_invariants();
    ++step;
  }
  r.stats = engine.stats();
  engine.reset_prefix_cache();
  EXPECT_EQ(engine.stats().pool.pages_used, 0);
  EXPECT_EQ(engine.stats().pool.slots_used, 0);
  return r;
}

void expect_same(const Result& got, const Result& want) {
  ASSERT_EQ(got.out.size(), want.out.size());
  for (const auto& [id, w] : want.out) {
    SCOPED_TRACE("request " + std::to_string(id));
    const Outcome& g = got.out.at(id);
    EXPECT_EQ(g.tokens, w.tokens);
    EXPECT_EQ(g.logprobs, w.logprobs);  // float ==: bitwise for finite values
    EXPECT_EQ(g.top_logprobs, w.top_logprobs);
    EXPECT_EQ(g.reason, w.reason);
  }
}

class EngineSpeculation : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!checkpoint()) GTEST_SKIP() << "set DSV41RT_TEST_CHECKPOINT to a tiny-v41 checkpoint";
  }
};

constexpr int64_t kMaxNew = 16;

std::vector<GenerationParams> all_greedy(size_t n, int64_t max_new = kMaxNew) {
  return std::vector<GenerationParams>(n, greedy(max_new));
}

// The engine without speculation over prompts(), greedy: what every run below must give.
const Result& baseline() {
  static const Result want = [] {
    Engine plain(load(false), config(0));
    const auto ps = prompts();
    return run(plain, ps, all_greedy(ps.size()));
  }();
  return want;
}

TEST_F(EngineSpeculation, DSparkDraftsGivePlainDecodingBitwise) {
  const auto ps = prompts();
  const Result& want = baseline();
  EXPECT_EQ(want.stats.spec_decode.drafts, 0);
  Engine spec(load(), config(5));
  const Result got = run(spec, ps, all_greedy(ps.size()));
  expect_same(got, want);
  const SpecDecodeStats& s = got.stats.spec_decode;
  EXPECT_GT(s.drafts, 0);
  EXPECT_GE(s.draft_tokens, s.drafts);
  EXPECT_LE(s.accepted_tokens, s.draft_tokens);
  ASSERT_EQ(s.accepted_per_pos.size(), 5u);
}

// Drafts from the known continuation, wrong at index `wrong` (none when >= k).
DraftSource oracle(const Result& want, const std::vector<std::vector<int32_t>>& ps, int64_t wrong) {
  return [&want, &ps, wrong](int64_t id, const std::vector<int32_t>& t, int64_t k) {
    const std::vector<int32_t>& all = want.out.at(id).tokens;
    const size_t g = t.size() - ps[size_t(id - 1)].size();  // generated, the last one unfed
    std::vector<int32_t> d(all.begin() + std::ptrdiff_t(std::min(g, all.size())),
                           all.begin() + std::ptrdiff_t(std::min(g + size_t(k), all.size())));
    if (wrong < int64_t(d.size())) d[size_t(wrong)] = (d[size_t(wrong)] + 1) % 1000;
    return d;
  };
}

TEST_F(EngineSpeculation, OracleDraftsAcceptExactlyTheRightPrefix) {
  const auto ps = prompts();
  const Result& want = baseline();
  for (const auto& [k, wrong] : std::vector<std::pair<int64_t, int64_t>>{{5, 99}, {5, 3}, {2, 0}}) {
    {
      SCOPED_TRACE("k " + std::to_string(k) + ", wrong at " + std::to_string(wrong));
      Engine spec(load(false), config(k, oracle(want, ps, wrong)));
      const Result got = run(spec, ps, all_greedy(ps.size()));
      expect_same(got, want);
      // Per request: the first token from the prompt, then verifies of min(k, left - 1) drafts
      // of which min(j, drafts) are accepted, each emitting those and the bonus token.
      int64_t drafts = 0, drafted = 0, accepted = 0;
      std::vector<int64_t> per_pos(size_t(k), 0);
      for (size_t i = 0; i < ps.size(); ++i) {
        int64_t left = kMaxNew - 1, steps = 1;
        while (left > 0) {
          const int64_t d = std::min(k, left - 1), a = std::min(wrong, d);
          if (d > 0) {
            ++drafts;
            drafted += d;
            accepted += a;
            for (int64_t j = 0; j < a; ++j) ++per_pos[size_t(j)];
          }
          left -= a + 1;
          ++steps;
        }
        EXPECT_EQ(got.sampling_steps.at(int64_t(i) + 1), steps) << "request " << i;
      }
      const SpecDecodeStats& s = got.stats.spec_decode;
      EXPECT_EQ(s.drafts, drafts);
      EXPECT_EQ(s.draft_tokens, drafted);
      EXPECT_EQ(s.accepted_tokens, accepted);
      EXPECT_EQ(s.accepted_per_pos, per_pos);
    }
  }
}

// Verifies, draft tokens and accepted ones of oracle drafts wrong at `wrong` with a fixed k
// (OracleDraftsAcceptExactlyTheRightPrefix): each verify drafts min(k, tokens left - 1).
SpecDecodeStats fixed_k_counts(size_t requests, int64_t k, int64_t wrong) {
  SpecDecodeStats s;
  for (size_t i = 0; i < requests; ++i) {
    for (int64_t left = kMaxNew - 1; left > 0;) {
      const int64_t d = std::min(k, left - 1), a = std::min(wrong, d);
      if (d > 0) ++s.drafts, s.draft_tokens += d, s.accepted_tokens += a;
      left -= a + 1;
    }
  }
  return s;
}

// Self-tuned lengths (draft_length.h, speculative-config without a count), on the 8 short prompts
// (decode-bound, cheap): drafts that are always right are all accepted at (about) the fixed k's
// lengths; drafts that are always wrong shrink to probes; the DSpark drafter (random weights) is
// skipped once its acceptance is known to be low; disable_by_batch_size keeps steps of more
// requests draft-free. Outputs stay the plain engine's bitwise in every case.
TEST_F(EngineSpeculation, SelfTunedLengthsFollowTheAcceptance) {
  const auto all = prompts();
  const std::vector<std::vector<int32_t>> ps(all.begin(), all.begin() + 8);  // 1..16 tokens
  Engine plain(load(false), config(0));
  const Result want = run(plain, ps, all_greedy(ps.size()));
  auto tuned = [](int64_t k, DraftSource source, int64_t disable_by_batch_size = 0) {
    EngineConfig c = config(k, std::move(source));
    c.speculation.self_tuning = true;
    c.speculation.disable_by_batch_size = disable_by_batch_size;
    return c;
  };
  auto tuned_run = [&](bool drafter, EngineConfig c) {
    Engine e(load(drafter), std::move(c));
    const Result got = run(e, ps, all_greedy(ps.size()));
    expect_same(got, want);
    return got.stats.spec_decode;
  };
  const SpecDecodeStats right = fixed_k_counts(ps.size(), 5, 99);
  {
    SCOPED_TRACE("always right");
    const SpecDecodeStats s = tuned_run(false, tuned(5, oracle(want, ps, 99)));
    EXPECT_EQ(s.accepted_tokens, s.draft_tokens);
    EXPECT_GE(double(s.draft_tokens) / double(s.drafts),
              0.9 * double(right.draft_tokens) / double(right.drafts));
  }
  {
    SCOPED_TRACE("always wrong");
    const SpecDecodeStats s = tuned_run(false, tuned(5, oracle(want, ps, 0)));
    EXPECT_EQ(s.accepted_tokens, 0);
    EXPECT_LT(s.draft_tokens * 4, fixed_k_counts(ps.size(), 5, 0).draft_tokens);
  }
  {
    SCOPED_TRACE("DSpark drafter, self-tuned");
    // 8 requests x 15 decode steps: random weights accept almost nothing, so after the first
    // verifies the drafter runs for probes only.
    const SpecDecodeStats s = tuned_run(true, tuned(5, {}));
    EXPECT_GT(s.drafts, 0);
    EXPECT_LT(s.drafts, int64_t(ps.size()) * 15 / 3);
  }
  {
    SCOPED_TRACE("disable_by_batch_size 1");
    const SpecDecodeStats s = tuned_run(false, tuned(5, oracle(want, ps, 99), 1));
    EXPECT_LT(s.drafts, right.drafts);
  }
  EXPECT_THROW(Engine(load(false), tuned(5, oracle(want, ps, 99), -1)), Error);
}

TEST_F(EngineSpeculation, StopTokensInsideAnAcceptedBlockCutTheOutput) {
  const auto ps = prompts();
  const Result& base = baseline();
  // Request i stops at the token it generates at index 2 + i % 9 (its first occurrence); every
  // third one also has penalties, which follow the accepted drafts from row to row.
  std::vector<GenerationParams> params;
  for (size_t i = 0; i < ps.size(); ++i) {
    params.push_back(greedy(kMaxNew, {base.out.at(int64_t(i) + 1).tokens[2 + i % 9]}));
    if (i % 3 == 0) {
      params.back().sampling.repetition_penalty = 1.3f;
      params.back().sampling.frequency_penalty = 0.4f;
      params.back().sampling.presence_penalty = 0.2f;
    }
  }
  Engine plain(load(false), config(0));
  const Result want = run(plain, ps, params);
  int64_t stopped = 0;
  for (const auto& [id, o] : want.out) stopped += o.reason == FinishReason::kStop;
  EXPECT_GE(stopped, int64_t(ps.size()) * 2 / 3);  // the penalised ones may not meet their stop
  Engine spec(load(false), config(5, oracle(want, ps, 99)));
  const Result got = run(spec, ps, params);
  expect_same(got, want);
  // Every draft is the plain run's next token: all accepted, stops and penalties included.
  EXPECT_GT(got.stats.spec_decode.accepted_tokens, 0);
  EXPECT_EQ(got.stats.spec_decode.accepted_tokens, got.stats.spec_decode.draft_tokens);
}

TEST_F(EngineSpeculation, PreemptionAndCancelLeaveNothingBehind) {
  const auto ps = prompts();
  // A pool too small for 4 running requests of up to 320 positions: preemptions recompute.
  // (4.6 MB of scratch for the step's 64 tokens, then ~90 pages of 4 positions.)
  const int64_t small = 5140000;
  Result want = baseline();
  Engine spec(load(false, small), config(5, oracle(want, ps, 2)));
  Result got = run(spec, ps, all_greedy(ps.size()), /*cancel_id=*/2);
  EXPECT_GT(got.stats.scheduler.preemptions, 0) << got.stats.pool.pages_total << " pages";
  EXPECT_GT(got.stats.spec_decode.accepted_tokens, 0);
  // The cancelled request: a prefix of its output, then kAborted; every other one as before.
  const Outcome& cancelled = got.out.at(2);
  EXPECT_EQ(cancelled.reason, FinishReason::kAborted);
  ASSERT_GT(cancelled.tokens.size(), 1u);
  ASSERT_LT(cancelled.tokens.size(), size_t(kMaxNew));
  const std::vector<int32_t>& full = want.out.at(2).tokens;
  EXPECT_TRUE(std::equal(cancelled.tokens.begin(), cancelled.tokens.end(), full.begin()));
  got.out.erase(2);
  want.out.erase(2);
  expect_same(got, want);
}

TEST_F(EngineSpeculation, PrefixCachingStaysExact) {
  // The last prompts continue earlier ones (16 and 31 tokens): they hit the prefix cache, and
  // the DSpark drafter, which has no features of the cached positions, waits for a window of its
  // own; decode-time snapshots are taken between verifies.
  auto ps = prompts();
  ps.resize(10);  // 1..64 tokens (the long ones are covered above)
  for (size_t from : {size_t(7), size_t(8)}) {
    std::vector<int32_t> turn = ps[from];
    const std::vector<int32_t> more = salted_prompt(9, int64_t(from));
    turn.insert(turn.end(), more.begin(), more.end());
    ps.push_back(turn);
  }
  EngineConfig cfg = config(0);
  cfg.enable_prefix_caching = true;
  // Slots enough that no snapshot is evicted before the continuations come.
  const int64_t slots = 40, kv = 64ll << 20;
  Engine plain(load(false, kv, slots), cfg);
  const Result want = run(plain, ps, all_greedy(ps.size()));
  EXPECT_GT(want.stats.prefix_cache.hits, 0);
  for (bool dspark : {true, false}) {
    SCOPED_TRACE(dspark ? "DSpark" : "oracle wrong at 3");
    EngineConfig spec_cfg = config(5, dspark ? DraftSource{} : oracle(want, ps, 3));
    spec_cfg.enable_prefix_caching = true;
    Engine spec(load(dspark, kv, slots), spec_cfg);
    Result got = run(spec, ps, all_greedy(ps.size()));
    EXPECT_GT(got.stats.prefix_cache.hits, 0);
    EXPECT_GT(got.stats.spec_decode.drafts, 0);
    for (auto& [id, o] : got.out) o.cached = -1;  // hits may differ: when snapshots are taken
    expect_same(got, want);
  }
}

// Sampling requests speculate by rejection sampling (test_speculation_sampling.cc checks the
// distribution): not the plain run's draws, but whole outputs with the raw logprobs; the greedy
// requests beside them stay bitwise.
TEST_F(EngineSpeculation, SamplingRequestsSpeculateBesideGreedyOnes) {
  const auto ps = prompts();
  std::vector<GenerationParams> params = all_greedy(ps.size(), 8);
  for (size_t i = 0; i < params.size(); i += 2) {
    params[i].sampling.temperature = 0.8f;
    params[i].sampling.top_k = 3;  // a slice the random drafter's tokens sometimes fall in
    params[i].sampling.seed = 7 + i;
  }
  Engine plain(load(false), config(0));
  const Result want = run(plain, ps, params);
  Engine spec(load(false), config(5, oracle(want, ps, 99)));
  const Result got = run(spec, ps, params);
  ASSERT_EQ(got.out.size(), ps.size());
  for (size_t i = 0; i < ps.size(); ++i) {
    const Outcome& g = got.out.at(int64_t(i) + 1);
    const Outcome& w = want.out.at(int64_t(i) + 1);
    if (i % 2 == 1) {
      EXPECT_EQ(g.tokens, w.tokens) << "greedy request " << i;
      EXPECT_EQ(g.logprobs, w.logprobs) << "greedy request " << i;
    } else {
      EXPECT_EQ(g.tokens.size(), 8u) << "sampling request " << i;
      EXPECT_EQ(g.reason, FinishReason::kLength);
      for (float lp : g.logprobs) EXPECT_TRUE(std::isfinite(lp) && lp <= 0.0f);
    }
  }
  // The plain run's draws as drafts: the sampling requests accept some (with probability p(d)).
  EXPECT_GT(got.stats.spec_decode.accepted_tokens, 0);
}

// Acceptance 2's sampling half at the engine: 300 sampling requests (one 3-token prompt,
// seeds 1..300, top-k 3: a small vocabulary slice) run with and without speculation; the joint
// distribution of their 3 tokens passes a two-sample chi-square test (99.9%). The drafts are
// another request's plain tokens: in the slice, so accepted sometimes, rejected sometimes.
TEST_F(EngineSpeculation, SamplingKeepsTheDistribution) {
  const int64_t n = 300;
  const std::vector<int32_t> prompt = salted_prompt(3, 5);
  std::vector<std::vector<int32_t>> ps(size_t(n), prompt);
  std::vector<GenerationParams> params(size_t(n), greedy(3));
  for (int64_t i = 0; i < n; ++i) {
    params[size_t(i)].sampling.temperature = 1.0f;
    params[size_t(i)].sampling.top_k = 3;
    params[size_t(i)].sampling.seed = uint64_t(i + 1);
  }
  EngineConfig cfg = config(0);
  cfg.max_num_seqs = 64;
  cfg.max_num_batched_tokens = 512;
  cfg.max_prefill_tokens_while_decoding = 0;
  // All submitted at once (staggered arrivals would take 150 steps).
  auto all_at_once = [&](Engine& e) {
    for (int64_t i = 0; i < n; ++i) e.submit(ps[size_t(i)], params[size_t(i)]);
    Result r;
    ::dsv41rt::testing::drain(e, r.out);
    r.stats = e.stats();
    EXPECT_EQ(r.stats.pool.pages_used, 0);
    return r;
  };
  Engine plain(load(false, 64ll << 20, 64), cfg);
  const Result want = all_at_once(plain);
  EngineConfig spec_cfg = cfg;
  spec_cfg.speculation.num_speculative_tokens = 2;
  spec_cfg.speculation.draft_source = [&want, n](int64_t id, const std::vector<int32_t>& t,
                                                 int64_t k) {
    const std::vector<int32_t>& other = want.out.at(id % n + 1).tokens;
    const size_t g = t.size() - 3;
    return std::vector<int32_t>(
        other.begin() + std::ptrdiff_t(std::min(g, other.size())),
        other.begin() + std::ptrdiff_t(std::min(g + size_t(k), other.size())));
  };
  Engine spec(load(false, 64ll << 20, 64), spec_cfg);
  const Result got = all_at_once(spec);
  const SpecDecodeStats& st = got.stats.spec_decode;
  EXPECT_GT(st.accepted_tokens, 0);
  EXPECT_LT(st.accepted_tokens, st.draft_tokens);
  std::map<std::vector<int32_t>, std::pair<int64_t, int64_t>> cells;
  for (int64_t id = 1; id <= n; ++id) {
    ASSERT_EQ(want.out.at(id).tokens.size(), 3u);
    ASSERT_EQ(got.out.at(id).tokens.size(), 3u);
    ++cells[want.out.at(id).tokens].first;
    ++cells[got.out.at(id).tokens].second;
  }
  double x2 = 0;
  for (const auto& [key, c] : cells) {
    x2 += double(c.first - c.second) * double(c.first - c.second) / double(c.first + c.second);
  }
  // The 99.9% quantile of chi-square with df = cells - 1 (Wilson-Hilferty).
  const double df = double(cells.size()) - 1, z = 3.09;
  const double crit = df * std::pow(1 - 2 / (9 * df) + z * std::sqrt(2 / (9 * df)), 3);
  EXPECT_LT(x2, crit) << cells.size() << " cells";
}

// Forced acceptance (SpeculationConfig::forced_acceptance, benchmarks; not lossless): drafts the
// test can find in the outputs, recorded by (request, its token count when drafted).
using Seen = std::map<std::pair<int64_t, size_t>, std::vector<int32_t>>;

struct Forced {
  Result got;
  Seen seen;
};

// An engine whose verifies accept exactly `a` of their drafts (clamped to [0, drafts]); the
// drafts are the plain run's continuation wrong at `wrong` (oracle), for requests 1..ps.size()
// only: later ones decode plainly. Every verify's forced drafts are in the output where drafted.
std::unique_ptr<Engine> forced_engine(int64_t k, int64_t a, int64_t wrong,
                                      const std::vector<std::vector<int32_t>>& ps,
                                      const Result& want, Seen& seen) {
  DraftSource inner = oracle(want, ps, wrong);
  EngineConfig c = config(k,
                          [inner, &seen, &ps](int64_t id, const std::vector<int32_t>& t,
                                              int64_t n) -> std::vector<int32_t> {
                            if (id > int64_t(ps.size())) return {};
                            return seen[{id, t.size()}] = inner(id, t, n);
                          });
  c.speculation.forced_acceptance = [a](int64_t, int64_t) { return a; };
  return std::make_unique<Engine>(load(false), std::move(c));
}

// Runs the prompts (all greedy) on forced_engine(k, a, wrong) into f; returns the engine for
// follow-up requests (it reads f.seen and ps while it runs).
std::unique_ptr<Engine> run_forced(Forced& f, int64_t k, int64_t a, int64_t wrong,
                                   const std::vector<std::vector<int32_t>>& ps,
                                   const Result& want) {
  std::unique_ptr<Engine> e = forced_engine(k, a, wrong, ps, want, f.seen);
  f.got = run(*e, ps, all_greedy(ps.size()));
  return e;
}

void expect_forced_drafts(const Forced& f, const std::vector<std::vector<int32_t>>& ps, int64_t a) {
  for (const auto& [key, d] : f.seen) {
    const auto& [id, size] = key;
    const std::vector<int32_t>& out = f.got.out.at(id).tokens;
    const size_t g = size - ps[size_t(id - 1)].size();  // the first token this verify emits
    for (size_t j = 0; j < std::min(size_t(std::max<int64_t>(a, 0)), d.size()); ++j) {
      ASSERT_LT(g + j, out.size()) << "request " << id;
      EXPECT_EQ(out[g + j], d[j]) << "request " << id << ", token " << g + j;
    }
  }
}

// a = 2 of k = 4, the drafts wrong at 1: every verify emits its 2 drafts (the wrong one too: the
// target would have taken 1) and the target's token after them, so 15 tokens after the prompt's
// take 5 verifies of 3; the counters say 2 per verify. The target's tokens are plain decoding's
// of the forced prefix (prompts that end with it), and undo left the pool as plain decoding
// would: the same prompts again in that engine, without drafts, give the plain tokens bitwise.
TEST_F(EngineSpeculation, ForcedAcceptanceEmitsTheForcedDrafts) {
  const auto ps = prompts();
  const Result& want = baseline();
  Forced f;
  std::unique_ptr<Engine> e = run_forced(f, 4, 2, 1, ps, want);
  expect_forced_drafts(f, ps, 2);
  const SpecDecodeStats& s = f.got.stats.spec_decode;
  const SpecDecodeStats counts = fixed_k_counts(ps.size(), 4, 2);
  EXPECT_EQ(s.drafts, int64_t(ps.size()) * 5);
  EXPECT_EQ(s.drafts, counts.drafts);
  EXPECT_EQ(s.draft_tokens, counts.draft_tokens);
  EXPECT_EQ(s.accepted_tokens, 2 * s.drafts);
  EXPECT_EQ(s.accepted_per_pos, (std::vector<int64_t>{s.drafts, s.drafts, 0, 0}));
  EXPECT_EQ(int64_t(f.seen.size()), s.drafts);
  int64_t differ = 0;
  for (size_t i = 0; i < ps.size(); ++i) {
    const Outcome& o = f.got.out.at(int64_t(i) + 1);
    EXPECT_EQ(f.got.sampling_steps.at(int64_t(i) + 1), 6) << "request " << i;
    ASSERT_EQ(o.tokens.size(), size_t(kMaxNew));
    EXPECT_EQ(o.reason, FinishReason::kLength);
    for (float lp : o.logprobs) EXPECT_TRUE(std::isfinite(lp) && lp <= 0.0f);
    differ += o.tokens != want.out.at(int64_t(i) + 1).tokens;
  }
  EXPECT_EQ(differ, int64_t(ps.size()));  // the wrong drafts are in every output
  // The target's tokens (positions 0, 3, 6, ...) of the 8 short prompts: plain decoding's first
  // token after the prompt and the output before it.
  Engine plain(load(false), config(0));
  std::map<int64_t, std::pair<size_t, int32_t>> asked;  // id -> (request, position)
  for (size_t i = 0; i < 8; ++i) {
    const std::vector<int32_t>& out = f.got.out.at(int64_t(i) + 1).tokens;
    for (size_t p = 3; p < out.size(); p += 3) {
      std::vector<int32_t> prompt = ps[i];
      prompt.insert(prompt.end(), out.begin(), out.begin() + std::ptrdiff_t(p));
      asked[plain.submit(prompt, greedy(1))] = {i, p};
    }
  }
  for (const auto& [id, o] : ::dsv41rt::testing::drain(plain)) {
    const auto [i, p] = asked.at(id);
    const Outcome& g = f.got.out.at(int64_t(i) + 1);
    ASSERT_EQ(o.tokens.size(), 1u);
    EXPECT_EQ(o.tokens[0], g.tokens[p]) << "request " << i << ", token " << p;
    EXPECT_EQ(o.logprobs[0], g.logprobs[p]) << "request " << i << ", token " << p;
  }
  // Follow-up requests (ids 17..32, no drafts) in the forced engine: plain decoding, bitwise.
  for (const auto& p : ps) e->submit(p, greedy(kMaxNew));
  std::map<int64_t, Outcome> again = ::dsv41rt::testing::drain(*e);
  for (size_t i = 0; i < ps.size(); ++i) {
    const Outcome& w = want.out.at(int64_t(i) + 1);
    const Outcome& g = again.at(int64_t(ps.size() + i) + 1);
    EXPECT_EQ(g.tokens, w.tokens) << "follow-up " << i;
    EXPECT_EQ(g.logprobs, w.logprobs) << "follow-up " << i;
  }
  EXPECT_EQ(e->stats().spec_decode.drafts, s.drafts);
  EXPECT_EQ(e->stats().pool.pages_used, 0);
  EXPECT_EQ(e->stats().pool.slots_used, 0);
}

// The count is clamped to [0, drafts]: a >= k accepts every draft (the wrong ones too); a <= 0
// accepts none, even of drafts the target would take, so the outputs are plain decoding's.
TEST_F(EngineSpeculation, ForcedAcceptanceClampsItsCount) {
  const auto ps = prompts();
  const Result& want = baseline();
  {
    SCOPED_TRACE("a = 99 of k = 5, wrong at 2");
    Forced f;
    run_forced(f, 5, 99, 2, ps, want);
    expect_forced_drafts(f, ps, 99);
    const SpecDecodeStats& s = f.got.stats.spec_decode;
    const SpecDecodeStats counts = fixed_k_counts(ps.size(), 5, 99);
    EXPECT_EQ(s.drafts, counts.drafts);
    EXPECT_EQ(s.draft_tokens, counts.draft_tokens);
    EXPECT_EQ(s.accepted_tokens, s.draft_tokens);
    for (const auto& [id, o] : f.got.out) EXPECT_EQ(o.tokens.size(), size_t(kMaxNew)) << id;
  }
  for (int64_t a : {0, -3}) {
    SCOPED_TRACE("a = " + std::to_string(a) + " of k = 5, right drafts");
    Forced f;
    run_forced(f, 5, a, 99, ps, want);
    expect_same(f.got, want);
    const SpecDecodeStats& s = f.got.stats.spec_decode;
    EXPECT_EQ(s.drafts, fixed_k_counts(ps.size(), 5, 0).drafts);
    EXPECT_EQ(s.accepted_tokens, 0);
    for (const auto& [id, n] : f.got.sampling_steps) EXPECT_EQ(n, kMaxNew) << id;
  }
}

// A stop token inside a forced block ends the output there: request i stops at the wrong draft
// of its first verify (drafted after its first token, wrong at 1, a = 4 of 5), so it emits the
// right draft, the wrong one and nothing after; the counters count the 2 drafts emitted. With
// max_new_tokens 3, the drafts are cut to the one that fits (the engine drafts no further).
TEST_F(EngineSpeculation, ForcedAcceptanceStopsInsideTheBlock) {
  const auto ps = prompts();
  const Result& want = baseline();
  std::vector<GenerationParams> params;
  std::vector<std::vector<int32_t>> expected;
  int64_t accepted = 0;
  for (size_t i = 0; i < ps.size(); ++i) {
    const std::vector<int32_t>& w = want.out.at(int64_t(i) + 1).tokens;
    const int32_t stop = (w[2] + 1) % 1000;  // oracle's wrong token at index 1 of the block [1, 6)
    params.push_back(greedy(kMaxNew, {stop}));
    std::vector<int32_t> e{w[0], w[1], stop};
    const size_t end = size_t(std::find(e.begin(), e.end(), stop) - e.begin()) + 1;
    e.resize(end);
    accepted += int64_t(end) - 1;
    expected.push_back(e);
  }
  Forced f;
  std::unique_ptr<Engine> e = forced_engine(5, 4, 1, ps, want, f.seen);
  f.got = run(*e, ps, params);
  for (size_t i = 0; i < ps.size(); ++i) {
    const Outcome& o = f.got.out.at(int64_t(i) + 1);
    EXPECT_EQ(o.tokens, expected[i]) << "request " << i;
    EXPECT_EQ(o.reason, FinishReason::kStop) << "request " << i;
  }
  EXPECT_EQ(f.got.stats.spec_decode.accepted_tokens, accepted);
  Forced g;
  std::unique_ptr<Engine> e3 = forced_engine(5, 4, 99, ps, want, g.seen);
  g.got = run(*e3, ps, all_greedy(ps.size(), 3));
  EXPECT_EQ(g.got.stats.spec_decode.drafts, int64_t(ps.size()));
  EXPECT_EQ(g.got.stats.spec_decode.draft_tokens, int64_t(ps.size()));
  EXPECT_EQ(g.got.stats.spec_decode.accepted_tokens, int64_t(ps.size()));
  for (const auto& [id, o] : g.got.out) {
    const std::vector<int32_t>& w = want.out.at(id).tokens;
    EXPECT_EQ(o.tokens, std::vector<int32_t>(w.begin(), w.begin() + 3)) << id;
    EXPECT_EQ(o.reason, FinishReason::kLength) << id;
  }
}

// accept_forced on made-up rows (no checkpoint): the target's token is 5 in every row, the drafts
// 1..4. The forced drafts carry their rows' raw logprobs and top logprobs; the token after them
// is the sampler's draw (greedy, or sampling with penalties over the forced history); a stop or
// the last allowed token ends the block.
TEST(AcceptForced, ForcedDraftsThenTheSamplersToken) {
  const int64_t V = 8, k = 4;
  Verify v;
  v.fed = {7, 1, 2, 3, 4};
  for (int64_t j = 0; j <= k; ++j) {
    for (int64_t t = 0; t < V; ++t) v.logits.push_back(t == 5 ? 2.0f : 0.1f * float(t + j));
  }
  SchedRequest r;
  r.tokens = {6, 6, 7};  // a prompt of 2, one token generated
  r.prompt_len = 2;
  r.max_new_tokens = 10;
  kernels::SamplingParams greedy_params;
  greedy_params.temperature = 0.0f;
  greedy_params.top_logprobs = 2;
  const auto none = [](int32_t) { return false; };
  const auto tokens = [](const std::vector<kernels::SampledToken>& out) {
    std::vector<int32_t> t;
    for (const auto& s : out) t.push_back(s.token);
    return t;
  };
  EXPECT_EQ(tokens(accept_forced(v, V, greedy_params, r, none, 0)), (std::vector<int32_t>{5}));
  EXPECT_EQ(tokens(accept_forced(v, V, greedy_params, r, none, 4)),
            (std::vector<int32_t>{1, 2, 3, 4, 5}));
  const std::vector<kernels::SampledToken> two = accept_forced(v, V, greedy_params, r, none, 2);
  ASSERT_EQ(tokens(two), (std::vector<int32_t>{1, 2, 5}));
  for (int64_t j = 0; j < 3; ++j) {
    const float* row = v.logits.data() + j * V;
    double sum = 0;
    for (int64_t t = 0; t < V; ++t) sum += std::exp(double(row[t]) - 2.0);
    const double lse = 2.0 + std::log(sum);
    EXPECT_FLOAT_EQ(two[size_t(j)].logprob, float(double(row[two[size_t(j)].token]) - lse));
    EXPECT_EQ(two[size_t(j)].top_ids, (std::vector<int32_t>{5, 7}));
    EXPECT_FLOAT_EQ(two[size_t(j)].top_logprobs[0], float(2.0 - lse));
  }
  // A stop draft, the last allowed token: the block ends there.
  EXPECT_EQ(tokens(accept_forced(
                v, V, greedy_params, r, [](int32_t t) { return t == 2; }, 3)),
            (std::vector<int32_t>{1, 2}));
  SchedRequest last = r;
  last.max_new_tokens = 3;
  EXPECT_EQ(tokens(accept_forced(v, V, greedy_params, last, none, 3)),
            (std::vector<int32_t>{1, 2}));
  // Sampling, penalties: the token after the drafts is the sampler's at step 3 over [7, 1, 2].
  kernels::SamplingParams sp;
  sp.temperature = 1.5f;
  sp.seed = 11;
  sp.frequency_penalty = 1.0f;
  sp.repetition_penalty = 1.2f;
  const std::vector<int32_t> history{7, 1, 2};
  const kernels::SampledToken want = kernels::cpu::sample_token(
      v.logits.data() + 2 * V, V, sp, r.tokens.data(), 2, history.data(), 3, 3);
  const std::vector<kernels::SampledToken> sampled = accept_forced(v, V, sp, r, none, 2);
  ASSERT_EQ(sampled.size(), 3u);
  EXPECT_EQ(sampled[0].token, 1);
  EXPECT_EQ(sampled[1].token, 2);
  EXPECT_EQ(sampled[2].token, want.token);
  EXPECT_EQ(sampled[2].logprob, want.logprob);
  EXPECT_THROW(accept_forced(v, V, greedy_params, r, none, 5), Error);
}

TEST_F(EngineSpeculation, BadConfigsAreNamed) {
  auto message = [](std::shared_ptr<Executor> e, EngineConfig c) -> std::string {
    try {
      Engine engine(std::move(e), std::move(c));
    } catch (const Error& err) {
      return err.what();
    }
    return "";
  };
  EXPECT_NE(message(load(false), config(-1)).find("num_speculative_tokens must be >= 0"),
            std::string::npos);
  EXPECT_NE(message(load(false), config(8)).find("sliding window (8)"), std::string::npos);
  EXPECT_NE(message(load(), config(6)).find("block of 5"), std::string::npos);
  EXPECT_NE(message(load(false), config(3)).find("without it (load_drafter)"), std::string::npos);
  EXPECT_EQ(message(load(false), config(7, oracle(Result{}, {}, 0))), "");
}

}  // namespace
}  // namespace dsv41rt::engine
