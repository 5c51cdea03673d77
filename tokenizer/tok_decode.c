/*
 * tokenizer/tok_decode.c - ids -> text: the HF decoder chain run over
 * the list of token strings (what lms_tokenizer_decode must reproduce
 * exactly, invalid bytes included), the streaming detokenizer that releases
 * text as soon as it is complete UTF-8, and the stop-string matcher.
 *
 * Streaming works per token: every decoder step except the byte grouping of
 * ByteLevel/ByteFallback acts on one token at a time, so a token's raw bytes
 * can be computed alone (lms__tok_piece) and the UTF-8 assembly done on the
 * byte stream. For valid output this equals the whole-list decode.
 */
#include <string.h>

#include "tokenizer/tok_internal.h"

static const char REPL_CHAR[] = "\xEF\xBF\xBD";

/* ---- a list of strings ------------------------------------------------------- */

typedef struct slist {
    tok_buf data;
    size_t *off, *len;
    size_t n, cap;
} slist;

static int sl_add(slist *l, const char *s, size_t n)
{
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 64;
        size_t *o = lms__realloc(l->off, cap * sizeof *o);
        if (!o)
            return LMS_ENOMEM;
        l->off = o;
        size_t *ln = lms__realloc(l->len, cap * sizeof *ln);
        if (!ln)
            return LMS_ENOMEM;
        l->len = ln;
        l->cap = cap;
    }
    l->off[l->n] = l->data.len;
    l->len[l->n] = n;
    l->n++;
    return lms__tb_add(&l->data, s, n);
}

/* Start a new string in l that the caller fills with lms__tb_add(&l->data). */
static int sl_open(slist *l) { return sl_add(l, "", 0); }
static void sl_close(slist *l) { l->len[l->n - 1] = l->data.len - l->off[l->n - 1]; }

static void sl_free(slist *l)
{
    lms__tb_free(&l->data);
    lms__free(l->off);
    lms__free(l->len);
    memset(l, 0, sizeof *l);
}

/* ---- per-token transforms ------------------------------------------------------ */

static int replace_all(tok_buf *out, const char *s, size_t n, const char *from, size_t fl, const char *to, size_t tl)
{
    int rc;
    size_t i = 0, prev = 0;
    while (fl && i + fl <= n) {
        if (!memcmp(s + i, from, fl)) {
            if ((rc = lms__tb_add(out, s + prev, i - prev)) || (rc = lms__tb_add(out, to, tl)))
                return rc;
            i += fl;
            prev = i;
        } else
            i++;
    }
    return lms__tb_add(out, s + prev, n - prev);
}

/* GPT-2 alphabet -> bytes; the token's own bytes when a char is outside it. */
static int bytelevel_bytes(tok_buf *out, const char *s, size_t n)
{
    size_t mark = out->len, i = 0;
    int rc = lms__tb_reserve(out, n + 1);
    if (rc)
        return rc;
    while (i < n) {
        uint32_t cp;
        size_t k = lms__utf8_next((const uint8_t *)s + i, n - i, &cp);
        int b = k ? lms__bl_cp_to_byte(cp) : -1;
        if (b < 0) {
            out->len = mark;
            return lms__tb_add(out, s, n);
        }
        out->p[out->len++] = (char)b;
        i += k;
    }
    out->p[out->len] = '\0';
    return 0;
}

static int hexval(char c)
{
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* "<0xHH>" -> byte, else -1. */
static int fallback_byte(const char *s, size_t n)
{
    if (n != 6 || memcmp(s, "<0x", 3) != 0 || s[5] != '>')
        return -1;
    int h = hexval(s[3]), l = hexval(s[4]);
    return h < 0 || l < 0 ? -1 : h * 16 + l;
}

static int strip_token(tok_buf *out, const tok_dec *d, const char *s, size_t n)
{
    size_t a = 0, b = n;
    for (int k = 0; k < d->start && n - a >= d->content_len && !memcmp(s + a, d->content, d->content_len); k++)
        a += d->content_len;
    for (int k = 0; k < d->stop && b >= a + d->content_len && !memcmp(s + b - d->content_len, d->content, d->content_len); k++)
        b -= d->content_len;
    return lms__tb_add(out, s + a, b > a ? b - a : 0);
}

static int metaspace_token(tok_buf *out, const tok_dec *d, const char *s, size_t n, bool first)
{
    if (first && d->prepend_scheme != PREPEND_NEVER)
        return replace_all(out, s, n, d->repl, d->repl_len, "", 0);
    return replace_all(out, s, n, d->repl, d->repl_len, " ", 1);
}

/* ---- whole-list decode (HF decode_chain semantics) ---------------------------------- */

static int run_chain(const lms_tokenizer *t, slist *in, slist *out)
{
    int rc = 0;
    for (size_t di = 0; di < t->n_decs; di++) {
        const tok_dec *d = &t->decs[di];
        out->n = 0;
        out->data.len = 0;
        switch (d->type) {
        case DEC_BYTELEVEL: {
            tok_buf raw = {0};
            for (size_t i = 0; i < in->n && !rc; i++)
                rc = bytelevel_bytes(&raw, in->data.p + in->off[i], in->len[i]);
            if (!rc && !(rc = sl_open(out))) {
                rc = lms__utf8_lossy(&out->data, (const uint8_t *)(raw.p ? raw.p : ""), raw.len, true, NULL);
                sl_close(out);
            }
            lms__tb_free(&raw);
            break;
        }
        case DEC_BYTEFALLBACK: {
            tok_buf bytes = {0};
            size_t nbytes = 0;
            for (size_t i = 0; i <= in->n && !rc; i++) {
                const char *s = i < in->n ? in->data.p + in->off[i] : NULL;
                size_t n = i < in->n ? in->len[i] : 0;
                int b = s ? fallback_byte(s, n) : -1;
                if (b >= 0) {
                    char c = (char)b;
                    rc = lms__tb_add(&bytes, &c, 1);
                    nbytes++;
                    continue;
                }
                if (nbytes) {
                    if (lms__utf8_valid(bytes.p, bytes.len))
                        rc = sl_add(out, bytes.p, bytes.len);
                    else
                        for (size_t k = 0; k < nbytes && !rc; k++)
                            rc = sl_add(out, REPL_CHAR, 3);
                    bytes.len = 0;
                    nbytes = 0;
                }
                if (s && !rc)
                    rc = sl_add(out, s, n);
            }
            lms__tb_free(&bytes);
            break;
        }
        case DEC_FUSE:
            if (!(rc = sl_open(out))) {
                for (size_t i = 0; i < in->n && !rc; i++)
                    rc = lms__tb_add(&out->data, in->data.p + in->off[i], in->len[i]);
                sl_close(out);
            }
            break;
        default:
            for (size_t i = 0; i < in->n && !rc; i++) {
                const char *s = in->data.p + in->off[i];
                size_t n = in->len[i];
                if ((rc = sl_open(out)))
                    break;
                if (d->type == DEC_REPLACE)
                    rc = replace_all(&out->data, s, n, d->pat, d->pat_len, d->content, d->content_len);
                else if (d->type == DEC_STRIP)
                    rc = strip_token(&out->data, d, s, n);
                else
                    rc = metaspace_token(&out->data, d, s, n, i == 0);
                sl_close(out);
            }
            break;
        }
        if (rc)
            return rc;
        slist tmp = *in;
        *in = *out;
        *out = tmp;
    }
    return 0;
}

int lms_tokenizer_decode(const lms_tokenizer *t, const int32_t *ids, size_t n, bool skip_special, char **text,
                         size_t *len)
{
    slist a = {0}, b = {0};
    tok_buf res = {0};
    int rc = 0;
    if (!t || !text || (!ids && n))
        return lms__err(LMS_EINVAL, "lms_tokenizer_decode: NULL argument");
    *text = NULL;
    if (len)
        *len = 0;
    for (size_t i = 0; i < n && !rc; i++) {
        size_t sl;
        const char *s = lms__tok_str(t, ids[i], &sl);
        if (!s || (skip_special && (t->tok_flags[ids[i]] & TOKF_SPECIAL)))
            continue;
        rc = sl_add(&a, s, sl);
    }
    if (!rc && t->n_decs)
        rc = run_chain(t, &a, &b);
    for (size_t i = 0; i < a.n && !rc; i++) {
        if (!t->n_decs && i > 0)
            rc = lms__tb_add(&res, " ", 1);
        if (!rc)
            rc = lms__tb_add(&res, a.data.p + a.off[i], a.len[i]);
    }
    if (!rc)
        rc = lms__tb_add(&res, "", 0);
    if (!rc && !lms__utf8_valid(res.p, res.len)) {
        /* only token strings from a damaged image get here (tokenizer.json
         * is valid UTF-8): the text stays valid, as the API promises */
        tok_buf lossy = {0};
        size_t used;
        if (!(rc = lms__utf8_lossy(&lossy, (const uint8_t *)res.p, res.len, true, &used)) &&
            !(rc = lms__tb_add(&lossy, "", 0))) {
            lms__tb_free(&res);
            res = lossy;
        } else
            lms__tb_free(&lossy);
    }
    if (!rc) {
        *text = res.p;
        if (len)
            *len = res.len;
        res.p = NULL;
    }
    lms__tb_free(&res);
    sl_free(&a);
    sl_free(&b);
    return rc;
}

/* ---- streaming ------------------------------------------------------------------------------- */

int lms__tok_piece(const lms_tokenizer *t, int32_t id, bool first, tok_buf *out)
{
    size_t n;
    const char *s = lms__tok_str(t, id, &n);
    tok_buf a = {0}, b = {0};
    int rc = 0;
    if (!s)
        return 0;
    if (!t->n_decs) {
        if (!first && (rc = lms__tb_add(out, " ", 1)))
            return rc;
        return lms__tb_add(out, s, n);
    }
    if ((rc = lms__tb_add(&a, s, n)))
        goto out;
    /* After a Fuse the later steps see one string, the whole text: only its
     * start is "first" (Strip's start, Metaspace's prefix) and Metaspace
     * treats all of it as the first token. A Strip stop after a Fuse would
     * need the end of the stream and is not applied while streaming. */
    bool fused = false;
    for (size_t di = 0; di < t->n_decs && !rc; di++) {
        const tok_dec *d = &t->decs[di];
        b.len = 0;
        int byte;
        if (fused && d->type == DEC_STRIP) {
            tok_dec st = *d;
            st.start = first ? d->start : 0;
            st.stop = 0;
            rc = strip_token(&b, &st, a.p, a.len);
            goto next;
        }
        if (fused && d->type == DEC_METASPACE) {
            rc = metaspace_token(&b, d, a.p, a.len, true);
            goto next;
        }
        switch (d->type) {
        case DEC_BYTELEVEL: rc = bytelevel_bytes(&b, a.p, a.len); break;
        case DEC_BYTEFALLBACK:
            byte = fallback_byte(a.p, a.len);
            if (byte >= 0) {
                char c = (char)byte;
                rc = lms__tb_add(&b, &c, 1);
            } else
                rc = lms__tb_add(&b, a.p, a.len);
            break;
        case DEC_FUSE:
            fused = true;
            rc = lms__tb_add(&b, a.p, a.len);
            break;
        case DEC_REPLACE: rc = replace_all(&b, a.p, a.len, d->pat, d->pat_len, d->content, d->content_len); break;
        case DEC_STRIP: rc = strip_token(&b, d, a.p, a.len); break;
        default: rc = metaspace_token(&b, d, a.p, a.len, first); break;
        }
    next:;
        tok_buf tmp = a;
        a = b;
        b = tmp;
    }
    if (!rc)
        rc = lms__tb_add(out, a.p, a.len);
out:
    lms__tb_free(&a);
    lms__tb_free(&b);
    return rc;
}

struct lms_detokenizer {
    const lms_tokenizer *t;
    bool skip_special, started;
    tok_buf pending; /* raw bytes not yet released (an incomplete char) */
    tok_buf out;     /* what the last call returned */
};

int lms_detokenizer_create(const lms_tokenizer *t, bool skip_special, lms_detokenizer **out)
{
    if (!t || !out)
        return lms__err(LMS_EINVAL, "lms_detokenizer_create: NULL argument");
    *out = lms__calloc(1, sizeof **out);
    if (!*out)
        return LMS_ENOMEM;
    (*out)->t = t;
    (*out)->skip_special = skip_special;
    return 0;
}

void lms_detokenizer_free(lms_detokenizer *d)
{
    if (!d)
        return;
    lms__tb_free(&d->pending);
    lms__tb_free(&d->out);
    lms__free(d);
}

void lms_detokenizer_reset(lms_detokenizer *d)
{
    if (!d)
        return;
    d->started = false;
    d->pending.len = 0;
    d->out.len = 0;
}

static int release(lms_detokenizer *d, bool final, const char **text, size_t *len)
{
    size_t used = 0;
    int rc;
    d->out.len = 0;
    if ((rc = lms__tb_add(&d->out, "", 0)))
        return rc;
    if ((rc = lms__utf8_lossy(&d->out, (const uint8_t *)(d->pending.p ? d->pending.p : ""), d->pending.len, final, &used)))
        return rc;
    if (used) {
        memmove(d->pending.p, d->pending.p + used, d->pending.len - used);
        d->pending.len -= used;
    }
    *text = d->out.p;
    *len = d->out.len;
    return 0;
}

int lms_detokenizer_push(lms_detokenizer *d, int32_t id, const char **text, size_t *len)
{
    int rc;
    if (!d || !text || !len)
        return lms__err(LMS_EINVAL, "lms_detokenizer_push: NULL argument");
    *text = "";
    *len = 0;
    size_t n;
    if (!lms__tok_str(d->t, id, &n) || (d->skip_special && (d->t->tok_flags[id] & TOKF_SPECIAL)))
        return release(d, false, text, len); /* skipped, as decode skips it */
    if ((rc = lms__tok_piece(d->t, id, !d->started, &d->pending)))
        return rc;
    d->started = true;
    return release(d, false, text, len);
}

int lms_detokenizer_flush(lms_detokenizer *d, const char **text, size_t *len)
{
    if (!d || !text || !len)
        return lms__err(LMS_EINVAL, "lms_detokenizer_flush: NULL argument");
    return release(d, true, text, len);
}

/* ---- stop strings ------------------------------------------------------------------------------- */

struct lms_stop_matcher {
    char **stops;
    size_t *lens;
    size_t n;
    tok_buf held, out;
    bool stopped;
};

int lms_stop_matcher_create(const char *const *stops, size_t n, lms_stop_matcher **out)
{
    if (!out || (n && !stops))
        return lms__err(LMS_EINVAL, "lms_stop_matcher_create: NULL argument");
    lms_stop_matcher *m = lms__calloc(1, sizeof *m);
    if (!m)
        return LMS_ENOMEM;
    m->stops = lms__calloc(n ? n : 1, sizeof *m->stops);
    m->lens = lms__calloc(n ? n : 1, sizeof *m->lens);
    if (!m->stops || !m->lens)
        goto nomem;
    for (size_t i = 0; i < n; i++) {
        if (!stops[i])
            continue;
        if (!(m->stops[i] = lms__strdup(stops[i])))
            goto nomem;
        m->lens[i] = strlen(stops[i]);
    }
    m->n = n;
    *out = m;
    return 0;
nomem:
    m->n = n;
    lms_stop_matcher_free(m);
    return LMS_ENOMEM;
}

void lms_stop_matcher_free(lms_stop_matcher *m)
{
    if (!m)
        return;
    for (size_t i = 0; m->stops && i < m->n; i++)
        lms__free(m->stops[i]);
    lms__free(m->stops);
    lms__free(m->lens);
    lms__tb_free(&m->held);
    lms__tb_free(&m->out);
    lms__free(m);
}

void lms_stop_matcher_reset(lms_stop_matcher *m)
{
    if (!m)
        return;
    m->held.len = 0;
    m->out.len = 0;
    m->stopped = false;
}

int lms_stop_matcher_push(lms_stop_matcher *m, const char *text, size_t len, const char **out, size_t *out_len,
                          bool *stopped, int *which)
{
    int rc;
    if (!m || !out || !out_len || !stopped || (!text && len))
        return lms__err(LMS_EINVAL, "lms_stop_matcher_push: NULL argument");
    if (which)
        *which = -1;
    m->out.len = 0;
    if ((rc = lms__tb_add(&m->out, "", 0)))
        return rc;
    *out = m->out.p;
    *out_len = 0;
    *stopped = m->stopped;
    if (m->stopped)
        return 0;
    if ((rc = lms__tb_add(&m->held, text, len)))
        return rc;
    const char *h = m->held.p;
    size_t hn = m->held.len;
    /* earliest stop string in the held text (the longest one at a tie) */
    size_t best = SIZE_MAX, best_len = 0;
    int best_i = -1;
    for (size_t i = 0; i < m->n; i++) {
        if (!m->lens[i] || m->lens[i] > hn)
            continue;
        const char *f = memmem(h, hn, m->stops[i], m->lens[i]);
        if (f && ((size_t)(f - h) < best || ((size_t)(f - h) == best && m->lens[i] > best_len))) {
            best = (size_t)(f - h);
            best_len = m->lens[i];
            best_i = (int)i;
        }
    }
    size_t keep_from;
    if (best_i >= 0) {
        m->stopped = true;
        *stopped = true;
        if (which)
            *which = best_i;
        keep_from = best;
    } else {
        /* hold back the longest suffix that is a proper prefix of a stop string */
        keep_from = hn;
        for (size_t i = 0; i < m->n; i++) {
            size_t L = m->lens[i];
            for (size_t k = LMS_MIN(L ? L - 1 : 0, hn); k > 0; k--) {
                if (hn - k < keep_from && !memcmp(h + hn - k, m->stops[i], k)) {
                    keep_from = hn - k;
                    break;
                }
            }
        }
    }
    m->out.len = 0;
    if ((rc = lms__tb_add(&m->out, h, keep_from)))
        return rc;
    if (m->stopped)
        m->held.len = 0;
    else {
        memmove(m->held.p, m->held.p + keep_from, hn - keep_from);
        m->held.len = hn - keep_from;
    }
    *out = m->out.p;
    *out_len = m->out.len;
    return 0;
}

int lms_stop_matcher_flush(lms_stop_matcher *m, const char **out, size_t *out_len)
{
    int rc;
    if (!m || !out || !out_len)
        return lms__err(LMS_EINVAL, "lms_stop_matcher_flush: NULL argument");
    m->out.len = 0;
    if ((rc = lms__tb_add(&m->out, m->stopped ? "" : m->held.p ? m->held.p : "", m->stopped ? 0 : m->held.len)))
        return rc;
    m->held.len = 0;
    *out = m->out.p;
    *out_len = m->out.len;
    return 0;
}

