/*
 * engine/sampler.h - the token sampler: turns one position's logits into the
 * next token id. Used by lms_generate (engine/generate.c); internal to the
 * engine library.
 *
 * The chain, in this order (the order of transformers' generate, so that a
 * seeded run can be reasoned about with HF's definitions):
 *
 *   1. repetition penalty: every distinct id among the last `repeat_window`
 *      ids given to lms__sampler_accept has its logit divided by the
 *      penalty when positive, multiplied when negative (CTRL / HF
 *      RepetitionPenaltyLogitsProcessor);
 *   2. temperature <= 0: greedy, the arg max (lowest id on ties); stop here;
 *   3. temperature: logits / T; probabilities p = softmax (double);
 *   4. top-k: keep the k most probable ids;
 *   5. top-p: keep the shortest run of most probable ids (of those kept)
 *      whose probability mass reaches top_p of the kept mass;
 *   6. min-p: keep ids whose probability is at least min_p times the
 *      largest;
 *   7. draw: u uniform in [0, 1) from the seeded generator; walking the kept
 *      ids in ascending id order, return the first id whose cumulative
 *      probability exceeds u times the kept mass.
 *
 * "Most probable" orders by probability, then by lower id, so every kept set
 * is a prefix of one total order and is exactly defined even with ties (k
 * tied ids keep exactly k; HF's top-k would keep all ties).
 *
 * Random numbers: xoshiro256** 1.0 (Blackman and Vigna), its 256-bit state
 * seeded from the 64-bit seed by four outputs of splitmix64; u is the top 53
 * bits of one output times 2^-53. The same seed gives the same ids on every
 * platform for the same logits.
 *
 * Memory: all buffers are sized from n_vocab at creation; sampling allocates
 * nothing.
 */
#ifndef LMS_ENGINE_SAMPLER_H
#define LMS_ENGINE_SAMPLER_H

#include <stddef.h>
#include <stdint.h>

#include "lmstore/engine.h"

typedef struct lms__rng {
    uint64_t s[4];
} lms__rng;

/* Seed with splitmix64(seed) x 4. */
void lms__rng_seed(lms__rng *r, uint64_t seed);
/* Next xoshiro256** output. */
uint64_t lms__rng_next(lms__rng *r);
/* Uniform double in [0, 1): (next >> 11) * 2^-53. */
double lms__rng_uniform(lms__rng *r);

typedef struct lms__sampler lms__sampler;

/*
 * A sampler for logits of n_vocab entries with the settings of `gp`
 * (temperature, top_k, top_p, min_p, repeat_penalty, repeat_window, seed;
 * the rest is ignored; values copied). Out-of-range settings (negative top_k,
 * top_p outside [0, 1], min_p outside [0, 1], penalty < 0) fail with
 * LMS_EINVAL naming the setting; LMS_ENOMEM. On failure *out is NULL.
 */
int lms__sampler_create(const lms_gen_params *gp, uint32_t n_vocab, lms__sampler **out);
void lms__sampler_free(lms__sampler *s); /* NULL ok */

/* Forget the penalty history and re-seed the generator with the seed given
 * at creation. */
void lms__sampler_reset(lms__sampler *s);

/* Add an id to the repetition-penalty history (prompt ids and generated ids
 * alike; the engine decides which). Ids outside [0, n_vocab) are ignored. */
void lms__sampler_accept(lms__sampler *s, int32_t id);

/* True when the settings make sampling deterministic (greedy). */
int lms__sampler_is_greedy(const lms__sampler *s);

/*
 * Sample the next id from logits[0..n_vocab) (read only). Uses one draw of
 * the generator unless greedy. Does not add the id to the history: call
 * lms__sampler_accept. NaN logits count as -infinity; if every logit is
 * -infinity or NaN, returns the lowest id.
 */
int32_t lms__sampler_sample(lms__sampler *s, const float *logits);

/* The same with the uniform draw u in [0, 1) given (tests). */
int32_t lms__sampler_sample_u(lms__sampler *s, const float *logits, double u);

/*
 * After a sample: the probability that the last draw gave to `id` (0 for
 * ids the chain dropped; for greedy, 1 for the chosen id). For tests and
 * for reporting.
 */
double lms__sampler_prob(const lms__sampler *s, int32_t id);
/* After a sample: how many ids the chain kept (1 for greedy). */
size_t lms__sampler_kept(const lms__sampler *s);

#endif
