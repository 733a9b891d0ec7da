/* dsv41rt C API: embed the DeepSeek-V4.1 runtime in a C or C++ host without Python.
 *
 * Model: create a runtime from a checkpoint directory, submit token-id prompts with sampling
 * parameters, and collect generated tokens by polling, by waiting, or through a streaming
 * callback; cancel; read stats; destroy. The runtime runs its own engine thread (continuous
 * batching over every submitted request); the calls below only hand work to it and take results.
 *
 * Conventions
 *   - Every function returns a dsv41rt_status (0 = DSV41RT_OK) except the version queries and
 *     dsv41rt_last_error. No function aborts or exits the process, and no C++ exception crosses
 *     this boundary.
 *   - Parameter structs start with `struct_size`: initialise them with the *_default_params()
 *     functions (which set it) and change what you need. A struct_size the library does not know
 *     gives DSV41RT_E_ABI_MISMATCH.
 *   - dsv41rt_runtime_create checks the caller's DSV41RT_ABI_VERSION against the library's.
 *   - Errors: dsv41rt_last_error(rt) is the message of the last failed call on `rt` made by the
 *     calling thread (thread-local); dsv41rt_last_error(NULL) for calls without a valid runtime
 *     (create, or a NULL / destroyed handle). The string stays valid until the thread's next
 *     failing call.
 *
 * Thread safety
 *   - Every function may be called from any thread, concurrently, on the same runtime.
 *     dsv41rt_runtime_destroy ends every request (waiting calls return them finished) and frees
 *     the runtime once every call in progress has left; calls made after it returns are
 *     answered DSV41RT_E_INVALID_HANDLE (unless a new runtime happens to reuse the address).
 *   - A token callback runs on the engine thread; it must return quickly and must not call
 *     dsv41rt_runtime_destroy (DSV41RT_E_INVALID_ARGUMENT if it does; other calls are allowed).
 *   - One request's outputs go to one consumer: its callback if it has one, otherwise
 *     dsv41rt_poll / dsv41rt_wait.
 */
#ifndef DSV41RT_H_
#define DSV41RT_H_

#include <stddef.h>
#include <stdint.h>

#if defined(_WIN32)
#define DSV41RT_C_API __declspec(dllimport)
#else
#define DSV41RT_C_API __attribute__((visibility("default")))
#endif

#ifdef __cplusplus
extern "C" {
#endif

#define DSV41RT_ABI_VERSION 2

typedef enum dsv41rt_status {
  DSV41RT_OK = 0,
  DSV41RT_E_INVALID_ARGUMENT = 1, /* a bad value (message names it) */
  DSV41RT_E_NOT_FOUND = 2,        /* unknown request id, missing file or tensor */
  DSV41RT_E_IO = 3,               /* reading the checkpoint failed */
  DSV41RT_E_OUT_OF_RANGE = 4,     /* no room (pool, context, output buffer) */
  DSV41RT_E_UNSUPPORTED = 5,      /* a model, device or option this build cannot run */
  DSV41RT_E_INTERNAL = 6,         /* a bug: please report the message */
  DSV41RT_E_ABI_MISMATCH = 7,     /* ABI version or struct_size unknown to the library */
  DSV41RT_E_INVALID_HANDLE = 8,   /* NULL, destroyed or never created runtime */
  DSV41RT_E_TIMEOUT = 9,          /* dsv41rt_wait: nothing new before the timeout */
  DSV41RT_E_ENGINE_FAILED = 10    /* the engine thread stopped after an error */
} dsv41rt_status;

typedef struct dsv41rt_runtime dsv41rt_runtime; /* opaque */

typedef enum dsv41rt_precision {
  DSV41RT_PRECISION_FP32 = 0, /* the reference numerics (default) */
  DSV41RT_PRECISION_BF16 = 1, /* CUDA: BF16 tensor-core GEMMs */
  DSV41RT_PRECISION_FP8 = 2   /* CUDA: FP8 activations, the official numerics (spec 5.2) */
} dsv41rt_precision;

typedef enum dsv41rt_kv_cache_dtype {
  DSV41RT_KV_CACHE_AUTO = 0,   /* the release's cache formats (default) */
  DSV41RT_KV_CACHE_FLOAT32 = 1 /* FP32 caches (debugging) */
} dsv41rt_kv_cache_dtype;

/* Option names and defaults are those of docs/options.md (one name per option). */
typedef struct dsv41rt_runtime_params {
  uint32_t struct_size;
  const char* checkpoint_dir;     /* config.json, *.safetensors, engram_tables.st */
  const char* engram_tables;      /* NULL: <checkpoint_dir>/engram_tables.st */
  const char* device;             /* "cpu" (default), "cuda", "cuda:N" */
  int32_t precision;              /* dsv41rt_precision */
  int32_t kv_cache_dtype;         /* dsv41rt_kv_cache_dtype */
  int64_t kv_memory;              /* bytes for the KV pool and workspaces (default 256 MiB) */
  int64_t max_num_seqs;           /* requests running at once (default 64) */
  int64_t max_num_batched_tokens; /* tokens per engine step (default 512) */
  int64_t max_model_len;          /* prompt + output tokens per request; 0 = what the pool holds */
  int64_t page_size;              /* positions per KV page (default 64) */
  int32_t enforce_eager;          /* CUDA: nonzero = no decode graphs */
  /* Prefill tokens an engine step may carry while requests decode (bounds inter-token latency);
   * 0 = no cap (default). Added after 0.1.0: a struct_size ending before this field (a host built
   * against the older header) is accepted and the field takes its default. */
  int64_t max_prefill_tokens_while_decoding;
  /* Nonzero (default): reuse the state of prompt prefixes earlier requests computed
   * (docs/design/prefix-cache.md). Added after max_prefill_tokens_while_decoding: a struct_size
   * ending before this field is accepted and the field takes its default. */
  int32_t enable_prefix_caching;
  /* Bytes of host memory (pinned on CUDA) the prefix cache keeps pages it evicts from the pool in,
   * to bring them back instead of recomputing them; 0 = off (default). Added after
   * enable_prefix_caching: a struct_size ending before this field is accepted and the field takes
   * its default. */
  int64_t host_cache_memory;
  /* Attention heads and the head's vocabulary split over this many ranks, and the routed experts
   * over expert_parallel_size ranks (1 or the same size when both are > 1); CPU, virtual ranks in
   * this process, results bitwise those of one rank (docs/design/parallelism.md). Default 1 and 1.
   * Added after host_cache_memory: a struct_size ending before them is accepted (1 and 1). */
  int64_t tensor_parallel_size;
  int64_t expert_parallel_size;
  /* Speculative decoding in the engine, vLLM's speculative-config JSON:
   * {"method": "dspark", "num_speculative_tokens": 5} (count omitted: self-tuned per request up to
   * the drafter's block; "disable_by_batch_size": N, no drafts in steps of more requests); greedy
   * outputs bitwise those without, sampling by rejection sampling (docs/design/dspark.md). NULL or
   * "" = off (default). Added after expert_parallel_size: a struct_size ending before it is
   * accepted (off). */
  const char* speculative_config;
  /* A step carrying prefill while requests decode may take up to this many times a decode-only
   * step: its prefill tokens are capped from the step times the engine measures (>= 1; 0 = off,
   * the default; both caps apply with max_prefill_tokens_while_decoding). Added after
   * speculative_config: a struct_size ending before it is accepted (off). */
  double max_decode_slowdown;
} dsv41rt_runtime_params;

typedef struct dsv41rt_sampling_params {
  uint32_t struct_size;
  float temperature; /* 0 = greedy (default) */
  int32_t top_k;     /* 0 = off */
  float top_p;       /* 1 = off */
  float min_p;       /* 0 = off */
  float presence_penalty, frequency_penalty, repetition_penalty;
  uint64_t seed; /* same seed, same tokens, whatever else is running */
} dsv41rt_sampling_params;

/* Called on the engine thread with each step's new tokens of one request (n >= 0; finished != 0
 * on the last call, with n possibly 0). */
typedef void (*dsv41rt_token_callback)(int64_t request_id, const int32_t* tokens, size_t n,
                                       int finished, void* user_data);

typedef struct dsv41rt_request_params {
  uint32_t struct_size;
  int64_t max_new_tokens; /* default 16 */
  dsv41rt_sampling_params sampling;
  const int32_t* stop_token_ids; /* copied at submit */
  size_t n_stop_token_ids;
  int32_t ignore_eos;              /* nonzero: do not stop at the model's end-of-sequence token */
  dsv41rt_token_callback callback; /* NULL: collect with dsv41rt_poll / dsv41rt_wait */
  void* user_data;
  /* Grammar-constrained decoding (runtime.hpp GrammarParams; needs dsv41rt_set_grammar_vocab).
   * grammar_kind: NULL (none), "json_object", "json_schema", "structural_tag", "ebnf" or "regex";
   * grammar_text: the schema / structural tag / grammar (root rule "root") / pattern (copied at
   * submit). The output is free until grammar_start_token is drawn (-1, the default: held from the
   * first token), which is forced after grammar_start_within tokens (-1, the default: never). A
   * struct_size ending before grammar_kind (the 0.1.0 layout) is accepted: no grammar. */
  const char* grammar_kind;
  const char* grammar_text;
  int32_t grammar_start_token;
  int64_t grammar_start_within;
} dsv41rt_request_params;

typedef struct dsv41rt_stats {
  uint32_t struct_size;
  int64_t requests_running, requests_waiting, requests_finished, preemptions;
  int64_t pages_total, pages_used, page_size;
  int64_t tokens_generated, steps;
  /* Prefix cache, in prompt tokens (each request counted once): looked up, and found cached.
   * Added after 0.1.0: a struct_size ending before them is accepted and they are not written. */
  int64_t prefix_cache_queries, prefix_cache_hits;
  /* The prefix cache's host tier (host_cache_memory): host bytes in use, and totals of pages copied
   * there on eviction and back for a hit. Added after prefix_cache_hits: a struct_size ending
   * before them is accepted and they are not written. */
  int64_t prefix_cache_host_bytes, prefix_cache_host_offloaded_pages,
      prefix_cache_host_restored_pages;
  /* Speculative decoding (params.speculative_config; vLLM's spec_decode counters): verify steps
   * with at least one draft token, draft tokens verified, of them accepted. Added after
   * prefix_cache_host_restored_pages: a struct_size ending before them is accepted and they are
   * not written. */
  int64_t spec_decode_num_drafts, spec_decode_num_draft_tokens, spec_decode_num_accepted_tokens;
} dsv41rt_stats;

DSV41RT_C_API uint32_t dsv41rt_abi_version(void);
DSV41RT_C_API const char* dsv41rt_version(void);
DSV41RT_C_API const char* dsv41rt_status_name(dsv41rt_status status);
DSV41RT_C_API const char* dsv41rt_last_error(const dsv41rt_runtime* rt);

DSV41RT_C_API void dsv41rt_runtime_default_params(dsv41rt_runtime_params* params);
DSV41RT_C_API void dsv41rt_sampling_default_params(dsv41rt_sampling_params* params);
DSV41RT_C_API void dsv41rt_request_default_params(dsv41rt_request_params* params);
DSV41RT_C_API void dsv41rt_stats_init(dsv41rt_stats* stats);

/* Loads the checkpoint and starts the engine thread. `abi_version`: pass DSV41RT_ABI_VERSION.
 * On failure *out is NULL and dsv41rt_last_error(NULL) says why. */
DSV41RT_C_API dsv41rt_status dsv41rt_runtime_create(uint32_t abi_version,
                                                    const dsv41rt_runtime_params* params,
                                                    dsv41rt_runtime** out);
/* Cancels every request, stops the engine thread, frees everything. NULL is a no-op (OK); a
 * handle already destroyed gives DSV41RT_E_INVALID_HANDLE. */
DSV41RT_C_API dsv41rt_status dsv41rt_runtime_destroy(dsv41rt_runtime* rt);

/* Queues a prompt (token ids, copied). *out_id identifies the request. */
DSV41RT_C_API dsv41rt_status dsv41rt_submit(dsv41rt_runtime* rt, const int32_t* tokens,
                                            size_t n_tokens, const dsv41rt_request_params* params,
                                            int64_t* out_id);
/* Moves up to `capacity` tokens generated since the last call into `tokens` (*n_out of them).
 * *finished is set to 1 once the request has ended and every token was taken; the id is then
 * forgotten (a later call gives DSV41RT_E_NOT_FOUND). Never blocks. A request ended by an engine
 * failure gives its tokens, then DSV41RT_E_ENGINE_FAILED (with *finished = 1) naming the error. */
DSV41RT_C_API dsv41rt_status dsv41rt_poll(dsv41rt_runtime* rt, int64_t request_id, int32_t* tokens,
                                          size_t capacity, size_t* n_out, int* finished);
/* As dsv41rt_poll, but blocks until there is something to return or `timeout_ms` passes
 * (DSV41RT_E_TIMEOUT; timeout_ms < 0 waits forever). */
DSV41RT_C_API dsv41rt_status dsv41rt_wait(dsv41rt_runtime* rt, int64_t request_id,
                                          int32_t timeout_ms, int32_t* tokens, size_t capacity,
                                          size_t* n_out, int* finished);
/* Cancels a waiting or running request and frees its pages; its consumer then sees finished. */
DSV41RT_C_API dsv41rt_status dsv41rt_cancel(dsv41rt_runtime* rt, int64_t request_id);
DSV41RT_C_API dsv41rt_status dsv41rt_get_stats(dsv41rt_runtime* rt, dsv41rt_stats* out);
/* Forgets every cached prompt prefix (their pages go back to the pool; pages running requests
 * share stay with them): later requests recompute their prompts. OK (a no-op) when prefix
 * caching is off. Safe while requests run. */
DSV41RT_C_API dsv41rt_status dsv41rt_reset_prefix_cache(dsv41rt_runtime* rt);

/* The vocabulary grammars compile against: tokens[i] (lengths[i] bytes, embedded zeros allowed)
 * the bytes token i decodes to, an empty one for a control token no grammar may produce (ids past
 * n_tokens up to the model's vocabulary likewise); stop_token_ids end a completed grammar (the
 * end-of-sequence token). Copied. E_INVALID_ARGUMENT when this build has no grammar support or
 * the arguments do not fit the model. */
DSV41RT_C_API dsv41rt_status dsv41rt_set_grammar_vocab(dsv41rt_runtime* rt,
                                                       const char* const* tokens,
                                                       const size_t* lengths, size_t n_tokens,
                                                       const int32_t* stop_token_ids,
                                                       size_t n_stop_token_ids);

#ifdef __cplusplus
}
#endif

#endif /* DSV41RT_H_ */
