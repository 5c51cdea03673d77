/*
 * tokenizer/tok_load.c - reads a HuggingFace tokenizer.json (and the
 * optional tokenizer_config.json) into an lms_tokenizer.
 *
 * The file is untrusted: every field is type-checked, every id range-checked,
 * every merge must name tokens of the vocabulary, and any component type we
 * do not implement is refused with its name (a tokenizer that silently
 * skipped a step would produce wrong ids without anyone noticing).
 */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <string.h>

#include "tokenizer/tok_internal.h"

int lms__tok_normalize(const lms_tokenizer *t, const char *s, size_t n, tok_buf *out);

#define MAX_TOKENIZER_JSON ((size_t)1 << 30)

/* ---- small JSON helpers ------------------------------------------------------ */

static const cJSON *jget(const cJSON *o, const char *k)
{
    return cJSON_IsObject(o) ? cJSON_GetObjectItemCaseSensitive(o, k) : NULL;
}

static const char *jstr(const cJSON *o, const char *k)
{
    const cJSON *v = jget(o, k);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

static bool jbool(const cJSON *o, const char *k, bool def)
{
    const cJSON *v = jget(o, k);
    return cJSON_IsBool(v) ? cJSON_IsTrue(v) : def;
}

/*
 * NULs. cJSON strings are NUL-terminated, yet vocabularies may hold "\u0000".
 * Before parsing, every \u0000 escape is replaced by the escape of a
 * private-use character that occurs nowhere in the file (the marker); string
 * reads turn the marker back into NUL bytes. State of the load in progress on
 * this thread.
 */
static _Thread_local struct {
    char mark[4];
    size_t len;
    tok_buf ring[4]; /* a few strings may be in use at once (merge a, b) */
    unsigned next;
} nul;

static int unmark(const char *s, const char **out, size_t *n)
{
    size_t len = strlen(s);
    *out = s;
    *n = len;
    if (!nul.len || !memmem(s, len, nul.mark, nul.len))
        return 0;
    tok_buf *b = &nul.ring[nul.next++ & 3];
    int rc;
    b->len = 0;
    for (size_t i = 0; i < len;) {
        if (len - i >= nul.len && !memcmp(s + i, nul.mark, nul.len)) {
            if ((rc = lms__tb_add(b, "", 1)))
                return rc;
            i += nul.len;
        } else if ((rc = lms__tb_add(b, s + i++, 1)))
            return rc;
    }
    *out = b->p;
    *n = b->len;
    return 0;
}

/* JSON text with \u0000 escapes replaced (see above); *out NULL when none. */
static int mark_nuls(const char *json, size_t len, char **out, size_t *out_len)
{
    size_t count = 0;
    *out = NULL;
    for (size_t i = 0; i + 1 < len; i++) {
        if (json[i] != '\\')
            continue;
        if (json[i + 1] == 'u' && len - i >= 6 && !memcmp(json + i + 2, "0000", 4))
            count++;
        i++;
    }
    if (!count)
        return 0;
    char esc[2][16], raw[4];
    uint32_t cp;
    for (cp = 0x10FFFD; cp > 0x10FE00; cp--) {
        uint32_t v = cp - 0x10000, hi = 0xD800 + (v >> 10), lo = 0xDC00 + (v & 0x3FF);
        raw[0] = (char)(0xF0 | cp >> 18);
        raw[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
        raw[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
        raw[3] = (char)(0x80 | (cp & 0x3F));
        snprintf(esc[0], sizeof esc[0], "\\u%04x\\u%04x", hi, lo);
        snprintf(esc[1], sizeof esc[1], "\\u%04X\\u%04X", hi, lo);
        if (!memmem(json, len, raw, 4) && !memmem(json, len, esc[0], 12) && !memmem(json, len, esc[1], 12))
            break;
    }
    if (cp == 0x10FE00)
        return lms__err(LMS_EUNSUPPORTED, "tokenizer.json: NUL characters in strings cannot be represented");
    char *o = lms__malloc(len + count * 6 + 1);
    if (!o)
        return LMS_ENOMEM;
    size_t k = 0;
    for (size_t i = 0; i < len; i++) {
        if (json[i] == '\\' && i + 1 < len) {
            if (json[i + 1] == 'u' && len - i >= 6 && !memcmp(json + i + 2, "0000", 4)) {
                memcpy(o + k, esc[0], 12);
                k += 12;
                i += 5;
            } else {
                o[k++] = json[i++];
                o[k++] = json[i];
            }
        } else
            o[k++] = json[i];
    }
    o[k] = '\0';
    memcpy(nul.mark, raw, 4);
    nul.len = 4;
    *out = o;
    *out_len = k;
    return 0;
}

static void nul_reset(void)
{
    for (int i = 0; i < 4; i++)
        lms__tb_free(&nul.ring[i]);
    nul.len = 0;
    nul.next = 0;
}

/* A JSON string's bytes (NULs restored). */
static int jstring_bytes(const cJSON *v, const char *what, const char **s, size_t *n)
{
    *s = "";
    *n = 0;
    if (!cJSON_IsString(v) || !v->valuestring)
        return lms__err(LMS_EFORMAT, "tokenizer.json: %s is not a string", what);
    return unmark(v->valuestring, s, n);
}


/* ---- patterns -------------------------------------------------------------------- */

/*
 * HF runs these regexes with Oniguruma, whose Unicode \s is the White_Space
 * property and \w is letters, marks, decimal digits and connector
 * punctuation. PCRE2's UCP classes differ at the edges (its \s also matches
 * U+180E MONGOLIAN VOWEL SEPARATOR), so those four escapes are spelled out
 * explicitly; everything else is compiled exactly as written.
 */
#define WS_SET "\\t-\\r\\x{20}\\x{85}\\x{a0}\\x{1680}\\x{2000}-\\x{200a}\\x{2028}\\x{2029}\\x{202f}\\x{205f}\\x{3000}"
#define WORD_SET "\\p{L}\\p{M}\\p{Nd}\\p{Pc}"

static int translate_regex(const char *src, size_t n, tok_buf *out)
{
    bool in_class = false;
    size_t class_start = 0;
    int rc = 0;
    for (size_t i = 0; i < n && !rc; i++) {
        char c = src[i];
        if (c == '\\' && i + 1 < n) {
            char e = src[i + 1];
            const char *rep = NULL;
            if (e == 's') rep = in_class ? WS_SET : "[" WS_SET "]";
            else if (e == 'w') rep = in_class ? WORD_SET : "[" WORD_SET "]";
            else if (e == 'S' && !in_class) rep = "[^" WS_SET "]";
            else if (e == 'W' && !in_class) rep = "[^" WORD_SET "]";
            rc = rep ? lms__tb_add(out, rep, strlen(rep)) : lms__tb_add(out, src + i, 2);
            i++;
            continue;
        }
        if (!in_class && c == '[') {
            in_class = true;
            class_start = i + 1;
            if (i + 1 < n && src[i + 1] == '^') {
                rc = lms__tb_add(out, src + i, 2);
                i++;
                class_start = i + 1;
                continue;
            }
        } else if (in_class && c == '[' && i + 1 < n && src[i + 1] == ':') {
            const char *end = memmem(src + i, n - i, ":]", 2); /* POSIX class [:alpha:] */
            if (end) {
                size_t k = (size_t)(end - (src + i)) + 2;
                rc = lms__tb_add(out, src + i, k);
                i += k - 1;
                continue;
            }
        } else if (in_class && c == ']' && i != class_start)
            in_class = false;
        rc = lms__tb_add(out, &c, 1);
    }
    return rc;
}

static int compile_regex(const char *src, size_t n, const char *where, pcre2_code **out)
{
    int errcode;
    PCRE2_SIZE erroff;
    tok_buf tr = {0};
    int rc = translate_regex(src, n, &tr);
    if (rc) {
        lms__tb_free(&tr);
        return rc;
    }
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)(tr.p ? tr.p : ""), tr.len, PCRE2_UTF | PCRE2_UCP, &errcode, &erroff, NULL);
    lms__tb_free(&tr);
    if (!re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(errcode, msg, sizeof msg);
        return lms__err(LMS_EFORMAT, "tokenizer.json: %s: regex '%.*s' does not compile: %s", where,
                        (int)LMS_MIN(n, 200), src, (const char *)msg);
    }
    pcre2_jit_compile(re, PCRE2_JIT_COMPLETE); /* falls back to the interpreter when JIT is unavailable */
    *out = re;
    return 0;
}

int lms__tok_pattern_regex(tok_pattern *p, const char *src, size_t n, const char *where)
{
    if (!(p->src = lms__tok_memdup0(src, n)))
        return LMS_ENOMEM;
    p->src_len = n;
    return compile_regex(src, n, where, &p->re);
}

void lms__tok_pattern_free(tok_pattern *p)
{
    lms__free(p->lit);
    lms__free(p->src);
    pcre2_code_free(p->re);
}

static int parse_pattern(const cJSON *o, const char *where, tok_pattern *p)
{
    const cJSON *pat = jget(o, "pattern");
    const cJSON *s = jget(pat, "String"), *r = jget(pat, "Regex");
    const char *str;
    size_t n;
    int rc;
    if (s) {
        if ((rc = jstring_bytes(s, where, &str, &n)))
            return rc;
        p->lit = lms__tok_memdup0(str, n);
        p->lit_len = n;
        return p->lit ? 0 : LMS_ENOMEM;
    }
    if (r) {
        if ((rc = jstring_bytes(r, where, &str, &n)))
            return rc;
        return lms__tok_pattern_regex(p, str, n, where);
    }
    return lms__err(LMS_EFORMAT, "tokenizer.json: %s: pattern is neither {\"String\"} nor {\"Regex\"}", where);
}


/* ---- normalizers --------------------------------------------------------------------- */

static int add_norm(lms_tokenizer *t, const cJSON *o, int depth)
{
    const char *type = jstr(o, "type");
    int rc;
    if (!type)
        return lms__err(LMS_EFORMAT, "tokenizer.json: normalizer without a \"type\"");
    if (!strcmp(type, "Sequence")) {
        const cJSON *list = jget(o, "normalizers"), *it;
        if (!cJSON_IsArray(list) || depth > 16)
            return lms__err(LMS_EFORMAT, "tokenizer.json: normalizer Sequence without a \"normalizers\" array");
        cJSON_ArrayForEach(it, list) if ((rc = add_norm(t, it, depth + 1))) return rc;
        return 0;
    }
    tok_norm nm = {0};
    if (!strcmp(type, "NFC")) nm.type = NORM_NFC;
    else if (!strcmp(type, "NFD")) nm.type = NORM_NFD;
    else if (!strcmp(type, "NFKC")) nm.type = NORM_NFKC;
    else if (!strcmp(type, "NFKD")) nm.type = NORM_NFKD;
    else if (!strcmp(type, "Lowercase")) nm.type = NORM_LOWERCASE;
    else if (!strcmp(type, "Strip")) {
        nm.type = NORM_STRIP;
        nm.strip_left = jbool(o, "strip_left", true);
        nm.strip_right = jbool(o, "strip_right", true);
    } else if (!strcmp(type, "Replace") || !strcmp(type, "Prepend")) {
        bool rep = type[0] == 'R';
        const char *c;
        size_t cn;
        nm.type = rep ? NORM_REPLACE : NORM_PREPEND;
        if ((rc = jstring_bytes(jget(o, rep ? "content" : "prepend"), rep ? "Replace.content" : "Prepend.prepend", &c, &cn)))
            return rc;
        if (!(nm.content = lms__tok_memdup0(c, cn)))
            return LMS_ENOMEM;
        nm.content_len = cn;
        if (rep && (rc = parse_pattern(o, "normalizer Replace", &nm.pat))) {
            lms__free(nm.content);
            lms__tok_pattern_free(&nm.pat);
            return rc;
        }
    } else
        return lms__err(LMS_EUNSUPPORTED, "tokenizer.json: normalizer '%s' is not supported", type);
    tok_norm *a = lms__realloc(t->norms, (t->n_norms + 1) * sizeof *a);
    if (!a) {
        lms__free(nm.content);
        lms__tok_pattern_free(&nm.pat);
        return LMS_ENOMEM;
    }
    t->norms = a;
    t->norms[t->n_norms++] = nm;
    return 0;
}

/* ---- pre-tokenizers ------------------------------------------------------------------------ */

/* The ByteLevel pre-tokenizer's own split (GPT-2), used when use_regex. */
static const char gpt2_regex[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

static int metaspace_fields(const cJSON *o, const char *where, char repl[8], size_t *repl_len, int *scheme)
{
    const char *r = jstr(o, "replacement");
    if (!r)
        r = "\xE2\x96\x81";
    uint32_t cp;
    size_t n = strlen(r);
    if (!n || n > 4 || lms__utf8_next((const uint8_t *)r, n, &cp) != n)
        return lms__err(LMS_EFORMAT, "tokenizer.json: %s: replacement must be one character", where);
    memcpy(repl, r, n);
    *repl_len = n;
    const char *ps = jstr(o, "prepend_scheme");
    if (!ps)
        *scheme = jbool(o, "add_prefix_space", true) ? PREPEND_ALWAYS : PREPEND_NEVER;
    else if (!strcmp(ps, "always")) *scheme = PREPEND_ALWAYS;
    else if (!strcmp(ps, "first")) *scheme = PREPEND_FIRST;
    else if (!strcmp(ps, "never")) *scheme = PREPEND_NEVER;
    else
        return lms__err(LMS_EUNSUPPORTED, "tokenizer.json: %s: prepend_scheme '%s' is not supported", where, ps);
    return 0;
}

static int add_pre(lms_tokenizer *t, const cJSON *o, int depth)
{
    const char *type = jstr(o, "type");
    int rc;
    if (!type)
        return lms__err(LMS_EFORMAT, "tokenizer.json: pre_tokenizer without a \"type\"");
    if (!strcmp(type, "Sequence")) {
        const cJSON *list = jget(o, "pretokenizers"), *it;
        if (!cJSON_IsArray(list) || depth > 16)
            return lms__err(LMS_EFORMAT, "tokenizer.json: pre_tokenizer Sequence without a \"pretokenizers\" array");
        cJSON_ArrayForEach(it, list) if ((rc = add_pre(t, it, depth + 1))) return rc;
        return 0;
    }
    tok_pre p = {0};
    if (!strcmp(type, "Split")) {
        const char *b = jstr(o, "behavior");
        p.type = PRE_SPLIT;
        if (!b) return lms__err(LMS_EFORMAT, "tokenizer.json: pre_tokenizer Split without a \"behavior\"");
        if (!strcmp(b, "Removed")) p.behavior = BEH_REMOVED;
        else if (!strcmp(b, "Isolated")) p.behavior = BEH_ISOLATED;
        else if (!strcmp(b, "MergedWithPrevious")) p.behavior = BEH_MERGED_PREV;
        else if (!strcmp(b, "MergedWithNext")) p.behavior = BEH_MERGED_NEXT;
        else if (!strcmp(b, "Contiguous")) p.behavior = BEH_CONTIGUOUS;
        else return lms__err(LMS_EUNSUPPORTED, "tokenizer.json: pre_tokenizer Split behavior '%s' is not supported", b);
        p.invert = jbool(o, "invert", false);
        if ((rc = parse_pattern(o, "pre_tokenizer Split", &p.pat))) {
            lms__tok_pattern_free(&p.pat);
            return rc;
        }
    } else if (!strcmp(type, "ByteLevel")) {
        p.type = PRE_BYTELEVEL;
        p.add_prefix_space = jbool(o, "add_prefix_space", true);
        p.use_regex = jbool(o, "use_regex", true);
        if (p.use_regex && (rc = lms__tok_pattern_regex(&p.pat, gpt2_regex, sizeof gpt2_regex - 1, "ByteLevel"))) {
            lms__tok_pattern_free(&p.pat);
            return rc;
        }
    } else if (!strcmp(type, "Digits")) {
        p.type = PRE_CHARS;
        p.chars = CHARS_NUMERIC;
        p.behavior = jbool(o, "individual_digits", false) ? BEH_ISOLATED : BEH_CONTIGUOUS;
    } else if (!strcmp(type, "WhitespaceSplit")) {
        p.type = PRE_CHARS;
        p.chars = CHARS_SPACE;
        p.behavior = BEH_REMOVED;
    } else if (!strcmp(type, "Punctuation")) {
        const char *b = jstr(o, "behavior");
        p.type = PRE_CHARS;
        p.chars = CHARS_PUNCT;
        p.behavior = BEH_ISOLATED;
        if (!b || !strcmp(b, "Isolated")) p.behavior = BEH_ISOLATED;
        else if (!strcmp(b, "Removed")) p.behavior = BEH_REMOVED;
        else if (!strcmp(b, "MergedWithPrevious")) p.behavior = BEH_MERGED_PREV;
        else if (!strcmp(b, "MergedWithNext")) p.behavior = BEH_MERGED_NEXT;
        else if (!strcmp(b, "Contiguous")) p.behavior = BEH_CONTIGUOUS;
        else return lms__err(LMS_EUNSUPPORTED, "tokenizer.json: pre_tokenizer Punctuation behavior '%s' is not supported", b);
    } else if (!strcmp(type, "Metaspace")) {
        p.type = PRE_METASPACE;
        if ((rc = metaspace_fields(o, "pre_tokenizer Metaspace", p.repl, &p.repl_len, &p.prepend_scheme)))
            return rc;
        p.split = jbool(o, "split", true);
    } else
        return lms__err(LMS_EUNSUPPORTED, "tokenizer.json: pre_tokenizer '%s' is not supported", type);
    tok_pre *a = lms__realloc(t->pres, (t->n_pres + 1) * sizeof *a);
    if (!a) {
        lms__tok_pattern_free(&p.pat);
        return LMS_ENOMEM;
    }
    t->pres = a;
    t->pres[t->n_pres++] = p;
    return 0;
}

/* ---- decoders ---------------------------------------------------------------------------- */

static int add_dec(lms_tokenizer *t, const cJSON *o, int depth)
{
    const char *type = jstr(o, "type");
    int rc;
    if (!type)
        return lms__err(LMS_EFORMAT, "tokenizer.json: decoder without a \"type\"");
    if (!strcmp(type, "Sequence")) {
        const cJSON *list = jget(o, "decoders"), *it;
        if (!cJSON_IsArray(list) || depth > 16)
            return lms__err(LMS_EFORMAT, "tokenizer.json: decoder Sequence without a \"decoders\" array");
        cJSON_ArrayForEach(it, list) if ((rc = add_dec(t, it, depth + 1))) return rc;
        return 0;
    }
    tok_dec d = {0};
    const char *s;
    size_t n;
    if (!strcmp(type, "ByteLevel")) d.type = DEC_BYTELEVEL;
    else if (!strcmp(type, "ByteFallback")) d.type = DEC_BYTEFALLBACK;
    else if (!strcmp(type, "Fuse")) d.type = DEC_FUSE;
    else if (!strcmp(type, "Replace")) {
        d.type = DEC_REPLACE;
        const cJSON *pat = jget(o, "pattern");
        if (jget(pat, "Regex"))
            return lms__err(LMS_EUNSUPPORTED, "tokenizer.json: decoder Replace with a Regex pattern is not supported");
        if ((rc = jstring_bytes(jget(pat, "String"), "decoder Replace.pattern.String", &s, &n)))
            return rc;
        if (!n)
            return lms__err(LMS_EFORMAT, "tokenizer.json: decoder Replace with an empty pattern");
        d.pat = lms__tok_memdup0(s, n);
        d.pat_len = n;
        if ((rc = jstring_bytes(jget(o, "content"), "decoder Replace.content", &s, &n)))
            goto fail;
        d.content = lms__tok_memdup0(s, n);
        d.content_len = n;
        if (!d.pat || !d.content) {
            rc = LMS_ENOMEM;
            goto fail;
        }
    } else if (!strcmp(type, "Strip")) {
        d.type = DEC_STRIP;
        const cJSON *st = jget(o, "start"), *sp = jget(o, "stop");
        if ((rc = jstring_bytes(jget(o, "content"), "decoder Strip.content", &s, &n)))
            return rc;
        uint32_t cp;
        if (!n || lms__utf8_next((const uint8_t *)s, n, &cp) != n)
            return lms__err(LMS_EFORMAT, "tokenizer.json: decoder Strip.content must be one character");
        if (!cJSON_IsNumber(st) || !cJSON_IsNumber(sp) || st->valuedouble < 0 || sp->valuedouble < 0 ||
            st->valuedouble > 1e6 || sp->valuedouble > 1e6)
            return lms__err(LMS_EFORMAT, "tokenizer.json: decoder Strip needs numbers \"start\" and \"stop\"");
        d.start = st->valueint;
        d.stop = sp->valueint;
        if (!(d.content = lms__tok_memdup0(s, n)))
            return LMS_ENOMEM;
        d.content_len = n;
    } else if (!strcmp(type, "Metaspace")) {
        d.type = DEC_METASPACE;
        if ((rc = metaspace_fields(o, "decoder Metaspace", d.repl, &d.repl_len, &d.prepend_scheme)))
            return rc;
    } else
        return lms__err(LMS_EUNSUPPORTED, "tokenizer.json: decoder '%s' is not supported", type);
    tok_dec *a = lms__realloc(t->decs, (t->n_decs + 1) * sizeof *a);
    if (!a) {
        rc = LMS_ENOMEM;
        goto fail;
    }
    t->decs = a;
    t->decs[t->n_decs++] = d;
    return 0;
fail:
    lms__free(d.pat);
    lms__free(d.content);
    return rc;
}

/* ---- post-processors ---------------------------------------------------------------------- */

static int push_ids(int32_t **arr, size_t *n, const cJSON *ids, const char *name, size_t vocab_size)
{
    const cJSON *it;
    cJSON_ArrayForEach(it, ids)
    {
        if (!cJSON_IsNumber(it) || it->valuedouble < 0 || it->valuedouble >= (double)vocab_size)
            return lms__err(LMS_EFORMAT, "tokenizer.json: post_processor special token '%s' has an id outside the vocabulary", name);
        int32_t *a = lms__realloc(*arr, (*n + 1) * sizeof *a);
        if (!a)
            return LMS_ENOMEM;
        *arr = a;
        a[(*n)++] = (int32_t)it->valuedouble;
    }
    return 0;
}

static int add_post(lms_tokenizer *t, const cJSON *o, int depth)
{
    const char *type = jstr(o, "type");
    int rc;
    if (!type)
        return lms__err(LMS_EFORMAT, "tokenizer.json: post_processor without a \"type\"");
    if (!strcmp(type, "ByteLevel"))
        return 0; /* offsets only; ids unchanged */
    if (!strcmp(type, "Sequence")) {
        const cJSON *list = jget(o, "processors"), *it;
        if (!cJSON_IsArray(list) || depth > 16)
            return lms__err(LMS_EFORMAT, "tokenizer.json: post_processor Sequence without a \"processors\" array");
        cJSON_ArrayForEach(it, list) if ((rc = add_post(t, it, depth + 1))) return rc;
        return 0;
    }
    if (strcmp(type, "TemplateProcessing") != 0)
        return lms__err(LMS_EUNSUPPORTED, "tokenizer.json: post_processor '%s' is not supported", type);
    if (t->n_post_prefix || t->n_post_suffix)
        return lms__err(LMS_EUNSUPPORTED, "tokenizer.json: more than one TemplateProcessing post_processor");
    const cJSON *single = jget(o, "single"), *specials = jget(o, "special_tokens"), *it;
    if (!cJSON_IsArray(single))
        return lms__err(LMS_EFORMAT, "tokenizer.json: TemplateProcessing without a \"single\" array");
    bool seen_seq = false;
    cJSON_ArrayForEach(it, single)
    {
        const cJSON *sp = jget(it, "SpecialToken"), *sq = jget(it, "Sequence");
        if (sq) {
            const char *id = jstr(sq, "id");
            if (seen_seq || !id || strcmp(id, "A") != 0)
                return lms__err(LMS_EFORMAT, "tokenizer.json: TemplateProcessing \"single\" must hold the sequence A once");
            seen_seq = true;
        } else if (sp) {
            const char *name = jstr(sp, "id");
            const cJSON *def = name ? jget(specials, name) : NULL;
            if (!def || !cJSON_IsArray(jget(def, "ids")))
                return lms__err(LMS_EFORMAT, "tokenizer.json: TemplateProcessing special token '%s' is not defined",
                                name ? name : "?");
            if ((rc = seen_seq ? push_ids(&t->post_suffix, &t->n_post_suffix, jget(def, "ids"), name, t->vocab_size)
                               : push_ids(&t->post_prefix, &t->n_post_prefix, jget(def, "ids"), name, t->vocab_size)))
                return rc;
        } else
            return lms__err(LMS_EFORMAT, "tokenizer.json: TemplateProcessing item is neither SpecialToken nor Sequence");
    }
    if (!seen_seq)
        return lms__err(LMS_EFORMAT, "tokenizer.json: TemplateProcessing \"single\" lacks the sequence A");
    return 0;
}

/* ---- model ------------------------------------------------------------------------------------ */

static int set_token(lms_tokenizer *t, tok_buf *arena, int32_t id, const char *s, size_t n)
{
    if (arena->len > UINT32_MAX - n - 1)
        return lms__err(LMS_ERANGE, "tokenizer.json: token strings exceed 4 GiB");
    t->tok_off[id] = (uint32_t)arena->len;
    t->tok_len[id] = (uint32_t)n;
    int rc = lms__tb_add(arena, s, n);
    if (!rc)
        arena->len++; /* keep the NUL */
    return rc;
}

/* Byte-level: the raw bytes a vocabulary string stands for; false if it has
 * a character outside the byte alphabet (such a token can never be produced
 * by encoding). */
static bool bl_to_bytes(const char *s, size_t n, char *out, size_t *out_n)
{
    size_t i = 0, o = 0;
    while (i < n) {
        uint32_t cp;
        size_t k = lms__utf8_next((const uint8_t *)s + i, n - i, &cp);
        int b = k ? lms__bl_cp_to_byte(cp) : -1;
        if (b < 0)
            return false;
        out[o++] = (char)b;
        i += k;
    }
    *out_n = o;
    return true;
}

static int load_model(lms_tokenizer *t, const cJSON *model, const cJSON *added, tok_buf *arena)
{
    const char *type = jstr(model, "type");
    const cJSON *vocab = jget(model, "vocab"), *merges = jget(model, "merges"), *it;
    int rc;
    if (type && strcmp(type, "BPE") != 0)
        return lms__err(LMS_EUNSUPPORTED, "tokenizer.json: model '%s' is not supported (only BPE)", type);
    if (!cJSON_IsObject(vocab) || !cJSON_IsArray(merges))
        return lms__err(LMS_EFORMAT, "tokenizer.json: BPE model needs a \"vocab\" object and a \"merges\" array");
    const cJSON *dropout = jget(model, "dropout");
    if (cJSON_IsNumber(dropout) && dropout->valuedouble != 0.0)
        return lms__err(LMS_EUNSUPPORTED, "tokenizer.json: BPE dropout is not supported");
    const char *csp = jstr(model, "continuing_subword_prefix"), *ews = jstr(model, "end_of_word_suffix");
    if ((csp && *csp) || (ews && *ews))
        return lms__err(LMS_EUNSUPPORTED, "tokenizer.json: BPE continuing_subword_prefix/end_of_word_suffix is not supported");
    t->ignore_merges = jbool(model, "ignore_merges", false);
    t->byte_fallback = jbool(model, "byte_fallback", false);
    t->fuse_unk = jbool(model, "fuse_unk", false);

    /* size: max id over vocab and added tokens */
    size_t size = 0;
    cJSON_ArrayForEach(it, vocab)
    {
        if (!cJSON_IsNumber(it) || it->valuedouble < 0 || it->valuedouble > (double)INT32_MAX - 1 ||
            it->valuedouble != (double)(int64_t)it->valuedouble)
            return lms__err(LMS_EFORMAT, "tokenizer.json: vocab entry '%.64s' has no valid id", it->string);
        size = LMS_MAX(size, (size_t)it->valuedouble + 1);
    }
    cJSON_ArrayForEach(it, added)
    {
        const cJSON *id = jget(it, "id");
        if (!cJSON_IsNumber(id) || id->valuedouble < 0 || id->valuedouble > (double)INT32_MAX - 1 ||
            id->valuedouble != (double)(int64_t)id->valuedouble)
            return lms__err(LMS_EFORMAT, "tokenizer.json: added token without a valid \"id\"");
        size = LMS_MAX(size, (size_t)id->valuedouble + 1);
    }
    if (size > (size_t)1 << 24)
        return lms__err(LMS_EFORMAT, "tokenizer.json: vocabulary of %zu ids is implausibly large", size);
    t->vocab_size = size;
    t->tok_off = lms__calloc(size ? size : 1, sizeof *t->tok_off);
    t->tok_len = lms__malloc((size ? size : 1) * sizeof *t->tok_len);
    t->tok_flags = lms__calloc(size ? size : 1, 1);
    if (!t->tok_off || !t->tok_len || !t->tok_flags)
        return LMS_ENOMEM;
    for (size_t i = 0; i < size; i++)
        t->tok_len[i] = UINT32_MAX;

    char *tmp = NULL;
    size_t tmp_cap = 0, nvocab = (size_t)cJSON_GetArraySize(vocab);
    if ((rc = lms__sm_reserve(&t->vocab, nvocab)) || (t->byte_level && (rc = lms__sm_reserve(&t->enc, nvocab))) ||
        (rc = lms__um_reserve(&t->merges, (size_t)cJSON_GetArraySize(merges))))
        return rc;
    cJSON_ArrayForEach(it, vocab)
    {
        int32_t id = (int32_t)it->valuedouble;
        const char *s;
        size_t n;
        if ((rc = unmark(it->string, &s, &n)))
            goto out;
        if (t->tok_len[id] != UINT32_MAX) {
            rc = lms__err(LMS_EFORMAT, "tokenizer.json: vocab id %d is used twice", id);
            goto out;
        }
        if ((rc = set_token(t, arena, id, s, n)) || (rc = lms__sm_put(&t->vocab, s, n, id)))
            goto out;
        if (t->byte_level) {
            if (n > tmp_cap) {
                lms__free(tmp);
                tmp_cap = n * 2;
                if (!(tmp = lms__malloc(tmp_cap))) {
                    rc = LMS_ENOMEM;
                    goto out;
                }
            }
            size_t bn;
            if (bl_to_bytes(s, n, tmp, &bn) && (rc = lms__sm_put(&t->enc, tmp, bn, id)))
                goto out;
        }
    }

    /* merges */
    tok_buf cat = {0};
    uint32_t rank = 0;
    cJSON_ArrayForEach(it, merges)
    {
        const char *a, *b;
        size_t an, bn;
        char *sp = NULL;
        if (cJSON_IsString(it)) {
            size_t wn;
            if ((rc = unmark(it->valuestring, &a, &wn)))
                goto out_cat;
            sp = memchr(a, ' ', wn);
            if (!sp) {
                rc = lms__err(LMS_EFORMAT, "tokenizer.json: merge %u '%.64s' is not \"a b\"", rank, a);
                goto out_cat;
            }
            an = (size_t)(sp - a);
            b = sp + 1;
            bn = wn - an - 1;
        } else if (cJSON_IsArray(it) && cJSON_GetArraySize(it) == 2 && cJSON_IsString(cJSON_GetArrayItem(it, 0)) &&
                   cJSON_IsString(cJSON_GetArrayItem(it, 1))) {
            if ((rc = unmark(cJSON_GetArrayItem(it, 0)->valuestring, &a, &an)) ||
                (rc = unmark(cJSON_GetArrayItem(it, 1)->valuestring, &b, &bn)))
                goto out_cat;
        } else {
            rc = lms__err(LMS_EFORMAT, "tokenizer.json: merge %u is neither \"a b\" nor [\"a\", \"b\"]", rank);
            goto out_cat;
        }
        int32_t ia = lms__sm_get(&t->vocab, a, an), ib = lms__sm_get(&t->vocab, b, bn);
        if (ia < 0 || ib < 0) {
            rc = lms__err(LMS_EFORMAT, "tokenizer.json: merge %u uses '%.*s', which is not in the vocabulary", rank,
                          (int)LMS_MIN(ia < 0 ? an : bn, 64), ia < 0 ? a : b);
            goto out_cat;
        }
        cat.len = 0;
        if ((rc = lms__tb_add(&cat, a, an)) || (rc = lms__tb_add(&cat, b, bn)))
            goto out_cat;
        int32_t in = lms__sm_get(&t->vocab, cat.p, cat.len);
        if (in < 0) {
            rc = lms__err(LMS_EFORMAT, "tokenizer.json: merge %u makes '%.64s', which is not in the vocabulary", rank, cat.p);
            goto out_cat;
        }
        if ((rc = lms__um_put(&t->merges, (uint64_t)ia << 32 | (uint32_t)ib, (uint64_t)rank << 32 | (uint32_t)in)))
            goto out_cat;
        rank++;
    }
    /* unknown token */
    const char *unk = jstr(model, "unk_token");
    t->unk_id = -1;
    if (unk) {
        size_t un;
        if ((rc = unmark(unk, &unk, &un)))
            goto out_cat;
        t->unk_id = lms__sm_get(&t->vocab, unk, un);
        if (t->unk_id < 0) {
            rc = lms__err(LMS_EFORMAT, "tokenizer.json: unk_token '%.64s' is not in the vocabulary", unk);
            goto out_cat;
        }
    }
    for (int b = 0; b < 256; b++) {
        char name[8], one = (char)b;
        snprintf(name, sizeof name, "<0x%02X>", b);
        t->fallback_id[b] = lms__sm_get(&t->vocab, name, 6);
        t->byte_id[b] = t->byte_level ? lms__sm_get(&t->enc, &one, 1) : -1;
    }
    rc = 0;
out_cat:
    lms__tb_free(&cat);
out:
    lms__free(tmp);
    return rc;
}

/* ---- added tokens ----------------------------------------------------------------------------- */

static int trie_node(tok_trie *tr)
{
    if (tr->n_nodes == tr->cap_nodes) {
        size_t cap = tr->cap_nodes ? tr->cap_nodes * 2 : 256;
        int32_t *a = lms__realloc(tr->term, cap * sizeof *a);
        if (!a)
            return LMS_ENOMEM;
        tr->term = a;
        tr->cap_nodes = cap;
    }
    tr->term[tr->n_nodes] = -1;
    return (int)tr->n_nodes++;
}

static int trie_insert(tok_trie *tr, const char *s, size_t n, int32_t idx)
{
    int rc;
    if (!n)
        return 0;
    if (!tr->n_nodes && (rc = trie_node(tr)) < 0)
        return rc;
    uint64_t node = 0, child;
    for (size_t i = 0; i < n; i++) {
        uint64_t key = node << 8 | (uint8_t)s[i];
        if (!lms__um_get(&tr->edges, key, &child)) {
            if ((rc = trie_node(tr)) < 0)
                return rc;
            child = (uint64_t)rc;
            if ((rc = lms__um_put(&tr->edges, key, child)))
                return rc;
        }
        node = child;
    }
    if (tr->term[node] < 0) /* the first token with this content wins */
        tr->term[node] = idx;
    tr->first[(uint8_t)s[0]] = 1;
    tr->empty = false;
    return 0;
}

static void trie_free(tok_trie *tr)
{
    lms__um_free(&tr->edges);
    lms__free(tr->term);
}

static int load_added(lms_tokenizer *t, const cJSON *added, tok_buf *arena)
{
    const cJSON *it;
    int rc;
    size_t n = (size_t)cJSON_GetArraySize(added);
    t->added = lms__calloc(n ? n : 1, sizeof *t->added);
    if (!t->added)
        return LMS_ENOMEM;
    cJSON_ArrayForEach(it, added)
    {
        tok_added *a = &t->added[t->n_added];
        const char *c;
        size_t cn;
        if ((rc = jstring_bytes(jget(it, "content"), "added token content", &c, &cn)))
            return rc;
        a->id = (int32_t)jget(it, "id")->valuedouble; /* range-checked in load_model */
        a->special = jbool(it, "special", false);
        a->lstrip = jbool(it, "lstrip", false);
        a->rstrip = jbool(it, "rstrip", false);
        a->single_word = jbool(it, "single_word", false);
        a->normalized = jbool(it, "normalized", !a->special);
        if (!(a->content = lms__tok_memdup0(c, cn)))
            return LMS_ENOMEM;
        a->len = cn;
        t->n_added++;
        /* the added token's string wins over the model's for id -> token; a
         * normalized token reads back normalized, as in HF */
        if (a->normalized && t->n_norms) {
            tok_buf nb = {0};
            rc = lms__tok_normalize(t, c, cn, &nb);
            if (!rc)
                rc = set_token(t, arena, a->id, nb.p ? nb.p : "", nb.len);
            lms__tb_free(&nb);
        } else
            rc = set_token(t, arena, a->id, c, cn);
        if (rc)
            return rc;
        t->tok_flags[a->id] |= TOKF_ADDED | (a->special ? TOKF_SPECIAL : 0);
    }
    return 0;
}

/* Built after the normalizers: normalized tokens are matched in normalized text. */
static int build_tries(lms_tokenizer *t)
{
    tok_buf nb = {0};
    int rc = 0;
    t->trie_raw.empty = t->trie_norm.empty = true;
    for (size_t i = 0; i < t->n_added && !rc; i++) {
        tok_added *a = &t->added[i];
        if (a->normalized && t->n_norms) {
            nb.len = 0;
            if (!(rc = lms__tok_normalize(t, a->content, a->len, &nb)))
                rc = trie_insert(&t->trie_norm, nb.p, nb.len, (int32_t)i);
        } else if (a->normalized)
            rc = trie_insert(&t->trie_norm, a->content, a->len, (int32_t)i);
        else
            rc = trie_insert(&t->trie_raw, a->content, a->len, (int32_t)i);
    }
    lms__tb_free(&nb);
    return rc;
}

/* ---- tokenizer_config.json ---------------------------------------------------------------------- */

static const char *token_field(const cJSON *cfg, const char *k)
{
    const cJSON *v = jget(cfg, k);
    if (cJSON_IsString(v))
        return v->valuestring;
    return jstr(v, "content"); /* {"content": "<s>", ...} */
}

static int load_config(lms_tokenizer *t, const char *cfg_text)
{
    cJSON *cfg = cJSON_Parse(cfg_text);
    int rc = 0;
    if (!cfg || !cJSON_IsObject(cfg)) {
        rc = lms__err(LMS_EFORMAT, "tokenizer_config.json: not a JSON object");
        goto out;
    }
    const char *bos = token_field(cfg, "bos_token"), *eos = token_field(cfg, "eos_token");
    if (bos)
        t->bos_id = lms_tokenizer_token_to_id(t, bos);
    if (eos)
        t->eos_id = lms_tokenizer_token_to_id(t, eos);
    const cJSON *ct = jget(cfg, "chat_template"), *it;
    const char *tmpl = cJSON_IsString(ct) ? ct->valuestring : NULL;
    if (cJSON_IsArray(ct)) /* [{"name": "default", "template": "..."}, ...] */
        cJSON_ArrayForEach(it, ct)
        {
            const char *name = jstr(it, "name");
            if (!tmpl || (name && !strcmp(name, "default")))
                tmpl = jstr(it, "template");
        }
    if (tmpl && !(t->chat_template = lms__strdup(tmpl)))
        rc = LMS_ENOMEM;
out:
    cJSON_Delete(cfg);
    return rc;
}

/* ---- entry points ------------------------------------------------------------------------------------ */

void lms_tokenizer_free(lms_tokenizer *t)
{
    if (!t)
        return;
    if (!t->image) { /* else borrowed from the image (tok_internal.h, design note 4) */
        lms__sm_free(&t->vocab);
        lms__sm_free(&t->enc);
        lms__um_free(&t->merges);
        lms__free(t->tok_arena);
        lms__free(t->tok_off);
        lms__free(t->tok_len);
        lms__free(t->tok_flags);
        for (size_t i = 0; i < t->n_added; i++)
            lms__free(t->added[i].content);
        trie_free(&t->trie_raw);
        trie_free(&t->trie_norm);
    }
    for (size_t i = 0; i < t->n_norms; i++) {
        lms__tok_pattern_free(&t->norms[i].pat);
        lms__free(t->norms[i].content);
    }
    lms__free(t->norms);
    for (size_t i = 0; i < t->n_pres; i++)
        lms__tok_pattern_free(&t->pres[i].pat);
    lms__free(t->pres);
    for (size_t i = 0; i < t->n_decs; i++) {
        lms__free(t->decs[i].pat);
        lms__free(t->decs[i].content);
    }
    lms__free(t->decs);
    lms__free(t->post_prefix);
    lms__free(t->post_suffix);
    lms__free(t->added);
    lms__free(t->chat_template);
    if (t->release)
        t->release(t->release_arg);
    lms__free(t);
}

void lms_tokenizer_buf_free(void *p) { lms__free(p); }

int lms_tokenizer_load(const char *json, size_t len, const char *config, lms_tokenizer **out)
{
    lms_tokenizer *t = NULL;
    cJSON *root = NULL;
    tok_buf arena = {0};
    char *marked = NULL;
    int rc;
    if (!out || (!json && len))
        return lms__err(LMS_EINVAL, "lms_tokenizer_load: NULL argument");
    *out = NULL;
    if (len > MAX_TOKENIZER_JSON)
        return lms__err(LMS_ERANGE, "tokenizer.json: %zu bytes is larger than the 1 GiB limit", len);
    if (!lms__utf8_valid(json ? json : "", len))
        return lms__err(LMS_EFORMAT, "tokenizer.json: not valid UTF-8 (byte %zu)", lms__utf8_invalid_at(json, len));
    nul_reset();
    if ((rc = mark_nuls(json ? json : "", len, &marked, &len)))
        return rc;
    const char *base = marked ? marked : json ? json : "";
    root = cJSON_ParseWithLength(base, len);
    if (!root || !cJSON_IsObject(root)) {
        const char *at = root ? NULL : cJSON_GetErrorPtr();
        if (at && at >= base && at <= base + len) /* the input need not be NUL-terminated */
            rc = lms__err(LMS_EFORMAT, "tokenizer.json: not valid JSON (byte %zu: '%.*s')", (size_t)(at - base),
                          (int)LMS_MIN((size_t)32, len - (size_t)(at - base)), at);
        else
            rc = lms__err(LMS_EFORMAT, "tokenizer.json: not a JSON object");
        goto fail;
    }
    if (!(t = lms__calloc(1, sizeof *t))) {
        rc = LMS_ENOMEM;
        goto fail;
    }
    t->bos_id = t->eos_id = t->unk_id = -1;
    const cJSON *model = jget(root, "model"), *added = jget(root, "added_tokens"), *o;
    if (!cJSON_IsObject(model)) {
        rc = lms__err(LMS_EFORMAT, "tokenizer.json: no \"model\" object");
        goto fail;
    }
    if (added && !cJSON_IsArray(added) && !cJSON_IsNull(added)) {
        rc = lms__err(LMS_EFORMAT, "tokenizer.json: \"added_tokens\" is not an array");
        goto fail;
    }
    if (!cJSON_IsArray(added))
        added = NULL;
    if ((o = jget(root, "normalizer")) && !cJSON_IsNull(o) && (rc = add_norm(t, o, 0)))
        goto fail;
    if ((o = jget(root, "pre_tokenizer")) && !cJSON_IsNull(o) && (rc = add_pre(t, o, 0)))
        goto fail;
    /* One ByteLevel at the end: encode in raw bytes (design note 2). Else
     * each ByteLevel step writes the GPT-2 alphabet into the text, as HF
     * does, so that the steps after it see what HF's see. */
    size_t n_bl = 0;
    for (size_t i = 0; i < t->n_pres; i++)
        n_bl += t->pres[i].type == PRE_BYTELEVEL;
    if (n_bl == 1 && t->pres[t->n_pres - 1].type == PRE_BYTELEVEL)
        t->byte_level = true;
    else
        for (size_t i = 0; i < t->n_pres; i++)
            t->pres[i].map_bytes = t->pres[i].type == PRE_BYTELEVEL;
    if ((rc = load_model(t, model, added, &arena)))
        goto fail;
    if (added && (rc = load_added(t, added, &arena)))
        goto fail;
    t->tok_arena = arena.p;
    t->tok_arena_len = arena.len;
    arena.p = NULL;
    if ((rc = build_tries(t)))
        goto fail;
    if ((o = jget(root, "post_processor")) && !cJSON_IsNull(o) && (rc = add_post(t, o, 0)))
        goto fail;
    if ((o = jget(root, "decoder")) && !cJSON_IsNull(o) && (rc = add_dec(t, o, 0)))
        goto fail;
    const cJSON *trunc = jget(root, "truncation"), *pad = jget(root, "padding");
    if ((trunc && !cJSON_IsNull(trunc)) || (pad && !cJSON_IsNull(pad))) {
        rc = lms__err(LMS_EUNSUPPORTED, "tokenizer.json: truncation/padding settings are not supported");
        goto fail;
    }
    if (config && (rc = load_config(t, config)))
        goto fail;
    if (t->bos_id < 0 && t->n_post_prefix)
        t->bos_id = t->post_prefix[0];
    cJSON_Delete(root);
    lms__free(marked);
    nul_reset();
    *out = t;
    return 0;
fail:
    lms__tb_free(&arena);
    cJSON_Delete(root);
    lms__free(marked);
    nul_reset();
    lms_tokenizer_free(t);
    return rc;
}

int lms_tokenizer_load_file(const char *path, const char *config_path, lms_tokenizer **out)
{
    char *json = NULL, *cfg = NULL;
    size_t len = 0;
    int rc;
    if (!path || !out)
        return lms__err(LMS_EINVAL, "lms_tokenizer_load_file: NULL argument");
    *out = NULL;
    if ((rc = lms__read_file(path, MAX_TOKENIZER_JSON, &json, &len)))
        return rc;
    if (config_path && (rc = lms__read_file(config_path, 64u << 20, &cfg, NULL)))
        goto out;
    rc = lms_tokenizer_load(json, len, cfg, out);
    if (rc)
        lms__err_prefix(rc, "%s: ", rc == LMS_EFORMAT || rc == LMS_EUNSUPPORTED ? path : "load");
out:
    lms__free(json);
    lms__free(cfg);
    return rc;
}

/* ---- lookups -------------------------------------------------------------------------------------------- */

size_t lms_tokenizer_vocab_size(const lms_tokenizer *t) { return t ? t->vocab_size : 0; }

int32_t lms_tokenizer_token_to_id(const lms_tokenizer *t, const char *token)
{
    if (!t || !token)
        return -1;
    size_t n = strlen(token);
    for (size_t i = 0; i < t->n_added; i++)
        if (t->added[i].len == n && !memcmp(t->added[i].content, token, n))
            return t->added[i].id;
    return lms__sm_get(&t->vocab, token, n);
}

const char *lms_tokenizer_id_to_token(const lms_tokenizer *t, int32_t id)
{
    size_t n;
    return t ? lms__tok_str(t, id, &n) : NULL;
}

bool lms_tokenizer_is_special(const lms_tokenizer *t, int32_t id)
{
    return t && id >= 0 && (size_t)id < t->vocab_size && (t->tok_flags[id] & TOKF_SPECIAL);
}

int32_t lms_tokenizer_bos_id(const lms_tokenizer *t) { return t ? t->bos_id : -1; }
int32_t lms_tokenizer_eos_id(const lms_tokenizer *t) { return t ? t->eos_id : -1; }

const char *lms_tokenizer_chat_template(const lms_tokenizer *t) { return t ? t->chat_template : NULL; }

int lms_tokenizer_set_chat_template(lms_tokenizer *t, const char *tmpl)
{
    if (!t || !tmpl)
        return lms__err(LMS_EINVAL, "lms_tokenizer_set_chat_template: NULL argument");
    char *c = lms__strdup(tmpl);
    if (!c)
        return LMS_ENOMEM;
    lms__free(t->chat_template);
    t->chat_template = c;
    return 0;
}
