// Embeds dsv41rt without Python: loads a checkpoint, submits prompts from two threads at once
// (one streams through a callback, the other waits for tokens), prints what each generates.
//
//   cpp_host CHECKPOINT_DIR PROMPTS_FILE [DEVICE]
//
// PROMPTS_FILE: one prompt per line, space-separated token ids. Prompt i is sampled with
// temperature 0.8, top-p 0.9 and seed i, 12 new tokens (ignoring end-of-sequence), so a
// Python `Runtime` given the same settings produces the same tokens
// (tests/python/test_cpp_host.py). Output: `stream <i>: +<n>` lines while tokens arrive, then one
// `result <i>: <ids>` per prompt.
#include <chrono>
#include <cstdio>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "dsv41rt/dsv41rt.hpp"

namespace {

std::mutex g_print;
std::map<size_t, std::vector<int32_t>> g_results;

dsv41rt_request_params params_for(size_t index) {
  dsv41rt_request_params p = dsv41rt::cpp::Runtime::request_params();
  p.max_new_tokens = 12;
  p.ignore_eos = 1;
  p.sampling.temperature = 0.8f;
  p.sampling.top_p = 0.9f;
  p.sampling.seed = index;
  return p;
}

struct Streamed {
  size_t index;
  std::vector<int32_t> tokens;
  std::mutex mu;
  bool done = false;
};

// Runs on the engine thread: keep it short.
void on_tokens(int64_t, const int32_t* tokens, size_t n, int finished, void* user_data) {
  auto* s = static_cast<Streamed*>(user_data);
  std::lock_guard<std::mutex> g(s->mu);
  s->tokens.insert(s->tokens.end(), tokens, tokens + n);
  s->done = finished != 0;
  std::lock_guard<std::mutex> p(g_print);
  std::printf("stream %zu: +%zu%s\n", s->index, n, finished ? " (finished)" : "");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s CHECKPOINT_DIR PROMPTS_FILE [DEVICE]\n", argv[0]);
    return 2;
  }
  std::vector<std::vector<int32_t>> prompts;
  std::ifstream in(argv[2]);
  for (std::string line; std::getline(in, line);) {
    std::istringstream ids(line);
    std::vector<int32_t> p;
    for (int32_t t; ids >> t;) p.push_back(t);
    if (!p.empty()) prompts.push_back(p);
  }
  try {
    dsv41rt::cpp::Runtime rt(argv[1], argc > 3 ? argv[3] : "cpu");
    std::vector<std::unique_ptr<Streamed>> streamed;
    // Thread A: even prompts, streamed through callbacks. Thread B: odd prompts, collected by wait.
    std::thread a([&] {
      for (size_t i = 0; i < prompts.size(); i += 2) {
        auto s = std::make_unique<Streamed>();
        s->index = i;
        dsv41rt_request_params p = params_for(i);
        p.callback = on_tokens;
        p.user_data = s.get();
        rt.submit(prompts[i], p);
        streamed.push_back(std::move(s));
      }
    });
    std::thread b([&] {
      std::vector<std::pair<size_t, int64_t>> ids;
      for (size_t i = 1; i < prompts.size(); i += 2)
        ids.emplace_back(i, rt.submit(prompts[i], params_for(i)));
      for (auto [i, id] : ids) {
        std::vector<int32_t> out;
        while (!rt.wait(id, out)) {
        }
        std::lock_guard<std::mutex> g(g_print);
        g_results[i] = out;
      }
    });
    a.join();
    b.join();
    for (auto& s : streamed) {  // the callbacks end with finished = 1
      while (true) {
        {
          std::lock_guard<std::mutex> g(s->mu);
          if (s->done) break;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      g_results[s->index] = s->tokens;
    }
    for (auto& [i, tokens] : g_results) {
      std::printf("result %zu:", i);
      for (int32_t t : tokens) std::printf(" %d", t);
      std::printf("\n");
    }
    const dsv41rt_stats st = rt.stats();
    std::printf("stats: %lld finished, %lld tokens generated, %lld steps\n",
                static_cast<long long>(st.requests_finished),
                static_cast<long long>(st.tokens_generated), static_cast<long long>(st.steps));
  } catch (const dsv41rt::cpp::Error& e) {
    std::fprintf(stderr, "cpp_host: %s\n", e.what());
    return 1;
  }
  return 0;
}
