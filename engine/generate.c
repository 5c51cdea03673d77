/*
 * engine/generate.c - lms_generate: prompt ids in, tokens streamed out.
 *
 *   1. prefix reuse: keep the longest common prefix of the engine's sequence
 *      and the prompt; if the KV cache's prefix index holds a longer prefix
 *      (whole pages of an earlier sequence), take that instead. At least the
 *      last prompt token is always run, for its logits.
 *   2. prefill the rest of the prompt in blocks;
 *   3. decode: sample (engine/sampler.h), stream the id and its text piece
 *      (streaming detokenizer, stop-string matcher), run the token, repeat
 *      until an EOS id, a stop string, max_tokens, the context end or the
 *      callback says stop.
 * The last sampled token is left pending (see engine.c) rather than run.
 */
#include <string.h>

#include "engine/engine_priv.h"
#include "engine/sampler.h"

lms_gen_params lms_gen_default_params(void)
{
    lms_gen_params g;
    memset(&g, 0, sizeof g);
    g.temperature = 0.0f;
    g.top_p = 1.0f;
    g.repeat_penalty = 1.0f;
    g.repeat_window = 64;
    return g;
}

static bool is_eos(const lms_engine *e, int32_t id)
{
    for (int i = 0; i < e->hp.n_eos; i++)
        if (e->hp.eos_ids[i] == id)
            return true;
    return false;
}

int lms_generate(lms_engine *e, const lms_gen_params *gp_in, const int32_t *prompt, size_t n_prompt,
                 lms_token_cb cb, void *user, lms_gen_metrics *m)
{
    int rc = 0;
    double t0 = lms__now(), t_first = 0, t_prefill = 0, t_prompt_end = 0;
    lms_gen_params gp = gp_in ? *gp_in : lms_gen_default_params();
    lms__sampler *smp = NULL;
    lms_detokenizer *dt = NULL;
    lms_stop_matcher *sm = NULL;
    int32_t *own = NULL;
    lms_gen_metrics mm;
    memset(&mm, 0, sizeof mm);
    if (!e)
        return lms__err(LMS_EINVAL, "lms_generate: engine is NULL");
    if (n_prompt == 0) { /* continue the sequence as it is */
        size_t n;
        const int32_t *cur = lms_engine_tokens(e, &n);
        if (n == 0)
            return lms__err(LMS_EINVAL, "lms_generate: empty prompt and empty sequence");
        if (!(own = lms__malloc(n * sizeof *own)))
            return LMS_ENOMEM;
        memcpy(own, cur, n * sizeof *own);
        prompt = own;
        n_prompt = n;
    } else if (!prompt) {
        return lms__err(LMS_EINVAL, "lms_generate: prompt is NULL");
    }
    for (size_t i = 0; i < n_prompt; i++)
        if (prompt[i] < 0 || (uint32_t)prompt[i] >= e->hp.n_vocab) {
            rc = lms__err(LMS_EINVAL, "%s: prompt token id %d (at %zu) is outside the vocabulary of %u", e->name,
                          (int)prompt[i], i, e->hp.n_vocab);
            goto out;
        }
    if (n_prompt >= e->p.n_ctx) {
        rc = lms__err(LMS_ENOSPACE, "%s: the prompt (%zu tokens) does not fit the context of %u tokens", e->name,
                      n_prompt, e->p.n_ctx);
        goto out;
    }
    if (gp.n_stop && !e->tok) {
        rc = lms__err(LMS_EINVAL, "%s: stop strings need the model's tokenizer", e->name);
        goto out;
    }
    if ((rc = lms__sampler_create(&gp, e->hp.n_vocab, &smp)))
        goto out;
    if (e->tok) {
        if ((rc = lms_detokenizer_create(e->tok, true, &dt)) ||
            (rc = lms_stop_matcher_create(gp.stop, gp.n_stop, &sm)))
            goto out;
    }

    /* 1. prefix reuse */
    size_t ncur;
    const int32_t *cur = lms_engine_tokens(e, &ncur);
    size_t c = 0;
    if (!gp.no_prefix_reuse)
        while (c < ncur && c < n_prompt && cur[c] == prompt[c]) c++;
    if (c >= n_prompt)
        c = n_prompt - 1;
    c = lms__engine_keepable(e, c); /* sliding-window K/V given back: recompute from there */
    if ((rc = lms_engine_truncate(e, c)))
        goto out;
    if (!gp.no_prefix_reuse && c + 1 < n_prompt)
        c = lms__engine_lookup(e, prompt, (uint32_t)(n_prompt - 1), (uint32_t)c);
    mm.reused_tokens = (uint32_t)c;
    mm.prompt_tokens = (uint32_t)n_prompt;

    /* 2. prefill */
    t_prefill = lms__now();
    if ((rc = lms_engine_eval(e, prompt + c, n_prompt - c, e->logits, LMS_EVAL_LAST)))
        goto out;
    t_prompt_end = lms__now();
    uint32_t win = gp.repeat_window ? gp.repeat_window : 64;
    for (size_t i = n_prompt > win ? n_prompt - win : 0; i < n_prompt; i++) lms__sampler_accept(smp, prompt[i]);

    /* 3. decode. Plain greedy decoding takes the arg max on the device when the
     * backend has one: 4 bytes come back per token instead of the logits. */
    bool dev_greedy = (!(gp.temperature > 0) || gp.top_k == 1) &&
                      (gp.repeat_penalty == 1.0f || gp.repeat_penalty == 0.0f) && lms__engine_has_argmax(e);
    int32_t next = -1; /* the id the device picked, or -1: sample from e->logits */
    for (;;) {
        int32_t id = next >= 0 ? next : lms__sampler_sample(smp, e->logits);
        next = -1;
        lms__sampler_accept(smp, id);
        if (!t_first)
            t_first = lms__now();
        bool room = lms__engine_len(e) < e->p.n_ctx;
        if (!gp.ignore_eos && is_eos(e, id)) {
            if (room)
                e->pending = id; /* the end-of-turn token belongs to the conversation */
            mm.stop_reason = LMS_STOP_EOS;
            break;
        }
        if (!room) {
            mm.stop_reason = LMS_STOP_CTX;
            break;
        }
        e->pending = id;
        mm.gen_tokens++;
        const char *txt = NULL, *out = NULL;
        size_t tl = 0, ol = 0;
        bool stopped = false;
        if (dt) {
            if ((rc = lms_detokenizer_push(dt, id, &txt, &tl)) ||
                (rc = lms_stop_matcher_push(sm, txt, tl, &out, &ol, &stopped, NULL)))
                goto out;
        }
        if (cb && cb(user, id, out, ol)) {
            mm.stop_reason = LMS_STOP_CALLBACK;
            break;
        }
        if (stopped) {
            mm.stop_reason = LMS_STOP_STRING;
            break;
        }
        if (gp.max_tokens && mm.gen_tokens >= gp.max_tokens) {
            mm.stop_reason = LMS_STOP_MAX_TOKENS;
            break;
        }
        if (lms__engine_len(e) >= e->p.n_ctx) {
            mm.stop_reason = LMS_STOP_CTX;
            break;
        }
        if ((rc = dev_greedy ? lms__engine_step_argmax(e, &next) : lms__engine_step(e, e->logits)))
            goto out;
    }
    /* text held back at the end (incomplete UTF-8, a partial stop string) */
    if (dt && mm.stop_reason != LMS_STOP_STRING && mm.stop_reason != LMS_STOP_CALLBACK) {
        const char *txt = NULL, *out = NULL;
        size_t tl = 0, ol = 0, fl = 0;
        bool stopped = false;
        const char *fo = NULL;
        if ((rc = lms_detokenizer_flush(dt, &txt, &tl)) ||
            (rc = lms_stop_matcher_push(sm, txt, tl, &out, &ol, &stopped, NULL)))
            goto out;
        if (ol && cb)
            cb(user, -1, out, ol);
        if (!stopped && !(rc = lms_stop_matcher_flush(sm, &fo, &fl)) && fl && cb)
            cb(user, -1, fo, fl);
        if (rc)
            goto out;
    }
out:
    if (m) {
        double t_end = lms__now();
        mm.load_ms = e->load_ms;
        if (t_first)
            mm.ttft_ms = (t_first - t0) * 1e3;
        if (t_prompt_end) {
            mm.prompt_ms = (t_prompt_end - t_prefill) * 1e3;
            if (mm.prompt_ms > 0)
                mm.prompt_tps = (mm.prompt_tokens - mm.reused_tokens) / (mm.prompt_ms / 1e3);
        }
        if (t_first) {
            mm.gen_ms = (t_end - t_first) * 1e3;
            if (mm.gen_tokens > 1 && mm.gen_ms > 0)
                mm.gen_tps = (mm.gen_tokens - 1) / (mm.gen_ms / 1e3);
        }
        mm.peak_rss = lms__peak_rss_bytes();
        mm.device = e->device_name;
        lms_kv_stats ks;
        lms_kv_geometry kg;
        lms_kv_get_stats(e->kv, &ks);
        lms_kv_get_geometry(e->kv, &kg);
        mm.kv_bytes = (uint64_t)kg.n_pages * kg.page_bytes + (uint64_t)kg.window_n_pages * kg.window_page_bytes;
        mm.kv_touched_bytes =
            (uint64_t)ks.touched_pages * kg.page_bytes + (uint64_t)ks.window_touched_pages * kg.window_page_bytes;
        *m = mm;
    }
    lms_stop_matcher_free(sm);
    lms_detokenizer_free(dt);
    lms__sampler_free(smp);
    lms__free(own);
    return rc;
}
