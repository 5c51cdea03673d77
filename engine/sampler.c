/*
 * engine/sampler.c - the token sampler chain (repetition penalty,
 * temperature, top-k, top-p, min-p, greedy) and its seeded generator
 * (splitmix64 -> xoshiro256**). Definitions and order: engine/sampler.h.
 *
 * Finding the kept set without sorting the whole vocabulary: every filter
 * keeps a prefix of the order (probability desc, id asc). One pass files the
 * ids into 64 buckets by the binary exponent of their probability (relative
 * to the largest, so bucket b holds [2^-b, 2^-b+1), the last one everything
 * smaller); buckets are then sorted one at a time, most probable first, and
 * appended to a prefix that is therefore exactly sorted, until the prefix
 * decides the answer. Only the buckets up to the boundary are ever sorted.
 * The kept set is then "every id at or before the boundary id in that
 * order", tested in O(1) per id, and the draw walks ids in ascending order.
 * Greedy sampling is one pass over the logits.
 */
#include "engine/sampler.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"

typedef struct cand {
    double p;   /* unnormalized probability exp(x - max) */
    int32_t id;
} cand;

struct lms__sampler {
    uint32_t n_vocab;
    float temperature;
    int32_t top_k;
    float top_p;
    float min_p;
    float penalty;
    uint32_t window;
    uint64_t seed;
    lms__rng rng;

    int32_t *hist;      /* (window) ring of accepted ids */
    uint32_t hist_n;    /* valid entries, <= window */
    uint32_t hist_pos;  /* next write slot */
    uint32_t *stamp;    /* (n_vocab) penalty dedup marks */
    uint32_t stamp_gen;

    double *x;          /* (n_vocab) penalized, tempered logits */
    double *p;          /* (n_vocab) exp(x - max); 0 for -inf */
    cand *c;            /* (n_vocab) sort buffer */

    /* Result of the last sample: kept iff (p, -id) >= (bound_p, -bound_id). */
    double bound_p;
    int32_t bound_id;
    double kept_mass;   /* sum of p over kept ids, ascending id order */
    size_t kept;
    int32_t last;
    int last_greedy;
};

/* ---- generator ------------------------------------------------------------ */

static uint64_t splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

void lms__rng_seed(lms__rng *r, uint64_t seed)
{
    for (int i = 0; i < 4; i++)
        r->s[i] = splitmix64(&seed);
}

static inline uint64_t rotl(uint64_t x, int k)
{
    return (x << k) | (x >> (64 - k));
}

uint64_t lms__rng_next(lms__rng *r)
{
    uint64_t *s = r->s;
    const uint64_t out = rotl(s[1] * 5, 7) * 9;
    const uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return out;
}

double lms__rng_uniform(lms__rng *r)
{
    return (double)(lms__rng_next(r) >> 11) * 0x1.0p-53;
}

/* ---- creation ---------------------------------------------------------------- */

int lms__sampler_create(const lms_gen_params *gp, uint32_t n_vocab, lms__sampler **out)
{
    *out = NULL;
    if (!gp || n_vocab == 0)
        return lms__err(LMS_EINVAL, "sampler: no parameters or empty vocabulary");
    if (gp->top_k < 0)
        return lms__err(LMS_EINVAL, "sampler: top_k %d is negative", (int)gp->top_k);
    if (!(gp->top_p >= 0.0f && gp->top_p <= 1.0f))
        return lms__err(LMS_EINVAL, "sampler: top_p %g is outside [0, 1]", (double)gp->top_p);
    if (!(gp->min_p >= 0.0f && gp->min_p <= 1.0f))
        return lms__err(LMS_EINVAL, "sampler: min_p %g is outside [0, 1]", (double)gp->min_p);
    if (!(gp->repeat_penalty >= 0.0f) || isinf(gp->repeat_penalty))
        return lms__err(LMS_EINVAL, "sampler: repeat_penalty %g is not a finite number >= 0",
                        (double)gp->repeat_penalty);
    if (isnan(gp->temperature) || isinf(gp->temperature))
        return lms__err(LMS_EINVAL, "sampler: temperature %g is not finite", (double)gp->temperature);

    lms__sampler *s = lms__calloc(1, sizeof *s);
    if (!s)
        return LMS_ENOMEM;
    s->n_vocab = n_vocab;
    s->temperature = gp->temperature;
    s->top_k = gp->top_k;
    s->top_p = gp->top_p;
    s->min_p = gp->min_p;
    s->penalty = gp->repeat_penalty;
    s->window = gp->repeat_window ? gp->repeat_window : 64;
    s->seed = gp->seed;
    s->hist = lms__calloc(s->window, sizeof *s->hist);
    s->stamp = lms__calloc(n_vocab, sizeof *s->stamp);
    s->x = lms__calloc(n_vocab, sizeof *s->x);
    s->p = lms__calloc(n_vocab, sizeof *s->p);
    s->c = lms__calloc(n_vocab, sizeof *s->c);
    if (!s->hist || !s->stamp || !s->x || !s->p || !s->c) {
        lms__sampler_free(s);
        return LMS_ENOMEM;
    }
    lms__sampler_reset(s);
    *out = s;
    return 0;
}

void lms__sampler_free(lms__sampler *s)
{
    if (!s)
        return;
    lms__free(s->hist);
    lms__free(s->stamp);
    lms__free(s->x);
    lms__free(s->p);
    lms__free(s->c);
    lms__free(s);
}

void lms__sampler_reset(lms__sampler *s)
{
    s->hist_n = 0;
    s->hist_pos = 0;
    lms__rng_seed(&s->rng, s->seed);
    s->kept = 0;
    s->last = -1;
}

void lms__sampler_accept(lms__sampler *s, int32_t id)
{
    if (id < 0 || (uint32_t)id >= s->n_vocab)
        return;
    s->hist[s->hist_pos] = id;
    s->hist_pos = (s->hist_pos + 1) % s->window;
    if (s->hist_n < s->window)
        s->hist_n++;
}

int lms__sampler_is_greedy(const lms__sampler *s)
{
    return !(s->temperature > 0.0f) || s->top_k == 1;
}

/* ---- the chain ------------------------------------------------------------------- */

static int cand_cmp(const void *a, const void *b)
{
    const cand *x = a, *y = b;
    if (x->p != y->p)
        return x->p > y->p ? -1 : 1;
    return (x->id > y->id) - (x->id < y->id);
}

/* Mark the distinct ids of the penalty window with a fresh stamp; false
 * when the penalty is off. */
static int mark_history(lms__sampler *s)
{
    if (s->penalty == 1.0f || s->penalty == 0.0f || s->hist_n == 0)
        return 0;
    if (++s->stamp_gen == 0) { /* wrapped: clear marks once every 2^32 calls */
        memset(s->stamp, 0, s->n_vocab * sizeof *s->stamp);
        s->stamp_gen = 1;
    }
    for (uint32_t k = 0; k < s->hist_n; k++)
        s->stamp[s->hist[k]] = s->stamp_gen;
    return 1;
}

/* The penalty is applied in float, as HF does on float32 scores. */
static inline float penalized(const lms__sampler *s, float v)
{
    return v < 0.0f ? v * s->penalty : v / s->penalty;
}

/* Step 1: x = logits with the repetition penalty; NaN -> -inf. */
static void penalize(lms__sampler *s, const float *logits)
{
    for (uint32_t i = 0; i < s->n_vocab; i++) {
        float v = logits[i];
        s->x[i] = isnan(v) ? -INFINITY : (double)v;
    }
    if (!mark_history(s))
        return;
    for (uint32_t k = 0; k < s->hist_n; k++) {
        int32_t id = s->hist[k];
        float v = logits[id];
        if (!isnan(v))
            s->x[id] = (double)penalized(s, v);
    }
}

/* Greedy: the arg max of the penalized logits (lowest id on ties; NaN never
 * wins; 0 when nothing is finite), in one pass. */
static int32_t greedy_pick(lms__sampler *s, const float *logits)
{
    const int pen = mark_history(s);
    int32_t best = 0;
    float bv = -INFINITY;
    for (uint32_t i = 0; i < s->n_vocab; i++) {
        float v = logits[i];
        if (pen && s->stamp[i] == s->stamp_gen)
            v = penalized(s, v);
        if (v > bv) { /* false for NaN */
            bv = v;
            best = (int32_t)i;
        }
    }
    return best;
}

static inline int is_kept(const lms__sampler *s, uint32_t i)
{
    double p = s->p[i];
    return p > s->bound_p || (p == s->bound_p && (int32_t)i <= s->bound_id);
}

enum { NBUCKET = 64 };

/* Bucket of a probability in (0, 1]: 1023 - binary exponent, clamped. */
static inline unsigned bucket_of(double p)
{
    uint64_t u;
    memcpy(&u, &p, sizeof u);
    int e = (int)((u >> 52) & 0x7ff);
    int b = 1023 - e;
    return b < 0 ? 0 : (b >= NBUCKET - 1 ? NBUCKET - 1 : (unsigned)b);
}

/*
 * Steps 4-6: find the boundary of the kept prefix. Returns its length L and
 * sets bound_p / bound_id. p[] holds probabilities relative to the largest
 * (which is 1), z their sum.
 */
static size_t find_kept(lms__sampler *s, double z)
{
    const uint32_t V = s->n_vocab;
    const size_t k_eff = (s->top_k > 0 && (uint32_t)s->top_k < V) ? (size_t)s->top_k : V;
    const int k_on = k_eff < V;
    const int p_on = s->top_p > 0.0f && s->top_p < 1.0f;
    const int m_on = s->min_p > 0.0f;
    const double m_thr = m_on ? (double)s->min_p : 0.0;

    /* Counting sort by bucket: c[] in bucket order, ids ascending inside. */
    size_t start[NBUCKET + 1] = {0};
    for (uint32_t i = 0; i < V; i++)
        if (s->p[i] > 0.0)
            start[bucket_of(s->p[i]) + 1]++;
    for (int b = 0; b < NBUCKET; b++)
        start[b + 1] += start[b];
    size_t fill[NBUCKET];
    memcpy(fill, start, sizeof fill);
    for (uint32_t i = 0; i < V; i++)
        if (s->p[i] > 0.0) {
            cand *c = &s->c[fill[bucket_of(s->p[i])]++];
            c->p = s->p[i];
            c->id = (int32_t)i;
        }

    double zk = k_on ? -1.0 : z; /* mass of the top-k set, once known */
    double acc = 0.0;            /* mass of c[0 .. scanned) */
    size_t scanned = 0;          /* prefix already summed for top-p */
    size_t Lp_found = 0;
    for (int b = 0; b < NBUCKET; b++) {
        size_t n = start[b + 1]; /* prefix = buckets 0..b: every id with p >= thr */
        if (start[b + 1] - start[b] > 1)
            qsort(s->c + start[b], start[b + 1] - start[b], sizeof *s->c, cand_cmp);
        const int full = b == NBUCKET - 1;
        const double thr = full ? 0.0 : ldexp(1.0, -b);
        const int m_cover = m_on && thr <= m_thr;

        /* Prefix lengths each filter keeps, as far as this prefix tells:
         * BIG = "more than n" (cannot be the minimum yet), UNK = unknown. */
        const size_t BIG = SIZE_MAX - 1, UNK = SIZE_MAX;
        size_t Lk = k_eff <= n ? k_eff : (full ? n : BIG);
        size_t Lm = BIG;
        if (m_on && (m_cover || full)) {
            Lm = 0;
            while (Lm < n && s->c[Lm].p >= m_thr)
                Lm++;
        }
        size_t Lp = BIG;
        if (p_on) {
            if (zk < 0.0 && Lk != BIG) {
                zk = 0.0;
                for (size_t j = 0; j < Lk; j++)
                    zk += s->c[j].p;
            }
            Lp = UNK;
            if (zk >= 0.0) {
                const double target = (double)s->top_p * zk;
                const size_t lim = Lk != BIG ? Lk : n;
                Lp = Lp_found ? Lp_found : BIG;
                while (!Lp_found && scanned < lim) {
                    acc += s->c[scanned++].p;
                    if (acc >= target)
                        Lp = Lp_found = scanned;
                }
                if (Lp == BIG && (full || Lk != BIG))
                    Lp = lim; /* rounding: the whole set */
            }
        }
        size_t L = Lk < Lm ? Lk : Lm;
        if (Lp < L)
            L = Lp;
        if (Lp != UNK && L <= n && n > 0) {
            if (L == 0)
                L = 1; /* always keep the most probable id */
            s->bound_p = s->c[L - 1].p;
            s->bound_id = s->c[L - 1].id;
            return L;
        }
    }
    /* Not reached: the last bucket is "full" and decides. */
    s->bound_p = s->c[0].p;
    s->bound_id = s->c[0].id;
    return 1;
}

int32_t lms__sampler_sample_u(lms__sampler *s, const float *logits, double u)
{
    const uint32_t V = s->n_vocab;
    if (lms__sampler_is_greedy(s)) {
        s->last = greedy_pick(s, logits);
        s->last_greedy = 1;
        s->kept = 1;
        return s->last;
    }
    s->last_greedy = 0;
    penalize(s, logits);

    const double inv_t = 1.0 / (double)s->temperature;
    double m = -INFINITY;
    int32_t imax = 0;
    for (uint32_t i = 0; i < V; i++) {
        s->x[i] *= inv_t;
        if (s->x[i] > m) {
            m = s->x[i];
            imax = (int32_t)i;
        }
    }
    if (m == -INFINITY) { /* nothing finite: the lowest id */
        memset(s->p, 0, V * sizeof *s->p);
        s->p[0] = 1.0;
        s->bound_p = 1.0;
        s->bound_id = 0;
        s->kept_mass = 1.0;
        s->kept = 1;
        s->last = 0;
        return 0;
    }
    double z = 0.0;
    for (uint32_t i = 0; i < V; i++) {
        s->p[i] = exp(s->x[i] - m);
        z += s->p[i];
    }

    const int filters = (s->top_k > 0 && (uint32_t)s->top_k < V) ||
                        (s->top_p > 0.0f && s->top_p < 1.0f) || s->min_p > 0.0f;
    if (filters) {
        s->kept = find_kept(s, z);
    } else {
        s->bound_p = 0.0; /* every id, also those of probability 0 */
        s->bound_id = (int32_t)V;
        s->kept = V;
    }

    double mass = 0.0;
    if (filters) {
        for (uint32_t i = 0; i < V; i++)
            if (is_kept(s, i))
                mass += s->p[i];
    } else {
        mass = z;
    }
    s->kept_mass = mass;

    const double target = u * mass;
    double acc = 0.0;
    int32_t pick = -1;
    for (uint32_t i = 0; i < V; i++) {
        if (!is_kept(s, i) || s->p[i] <= 0.0)
            continue;
        acc += s->p[i];
        pick = (int32_t)i;
        if (acc > target)
            break;
    }
    s->last = pick < 0 ? imax : pick; /* pick < 0 only through rounding */
    return s->last;
}

int32_t lms__sampler_sample(lms__sampler *s, const float *logits)
{
    if (lms__sampler_is_greedy(s))
        return lms__sampler_sample_u(s, logits, 0.0);
    return lms__sampler_sample_u(s, logits, lms__rng_uniform(&s->rng));
}

double lms__sampler_prob(const lms__sampler *s, int32_t id)
{
    if (id < 0 || (uint32_t)id >= s->n_vocab || s->last < 0)
        return 0.0;
    if (s->last_greedy)
        return id == s->last ? 1.0 : 0.0;
    if (!is_kept(s, (uint32_t)id) || s->kept_mass <= 0.0)
        return 0.0;
    return s->p[id] / s->kept_mass;
}

size_t lms__sampler_kept(const lms__sampler *s)
{
    return s->kept;
}
