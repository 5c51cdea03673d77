/*
 * tokenizer/chat.c - built-in chat formats (ChatML as Qwen3 writes
 * it, Llama 3, Gemma 3), chosen by recognising the markers of a model's Jinja
 * chat template. lmstore does not run Jinja: each format is written out in C
 * to produce, byte for byte, what the model's own template renders for
 * system/user/assistant conversations (checked against transformers'
 * apply_chat_template in tests/tokenizer/).
 */
#include <string.h>
#include <strings.h>

#include "tokenizer/tok_internal.h"

static const char *const stops_chatml[] = {"<|im_end|>", "<|endoftext|>", NULL};
static const char *const stops_llama3[] = {"<|eot_id|>", "<|end_of_text|>", "<|eom_id|>", NULL};
static const char *const stops_gemma[] = {"<end_of_turn>", "<eos>", NULL};
static const char *const stops_none[] = {NULL};

const char *lms_chat_format_name(lms_chat_format fmt)
{
    switch (fmt) {
    case LMS_CHAT_CHATML: return "chatml";
    case LMS_CHAT_LLAMA3: return "llama3";
    case LMS_CHAT_GEMMA: return "gemma";
    default: return NULL;
    }
}

int lms_chat_format_from_name(const char *name, lms_chat_format *out)
{
    static const struct {
        const char *name;
        lms_chat_format fmt;
    } names[] = {{"chatml", LMS_CHAT_CHATML}, {"qwen", LMS_CHAT_CHATML},  {"qwen2", LMS_CHAT_CHATML},
                 {"qwen3", LMS_CHAT_CHATML},  {"llama3", LMS_CHAT_LLAMA3}, {"llama", LMS_CHAT_LLAMA3},
                 {"llama-3", LMS_CHAT_LLAMA3}, {"gemma", LMS_CHAT_GEMMA},  {"gemma3", LMS_CHAT_GEMMA}};
    if (!out)
        return lms__err(LMS_EINVAL, "lms_chat_format_from_name: NULL argument");
    *out = LMS_CHAT_UNKNOWN;
    for (size_t i = 0; name && i < LMS_ARRAY_LEN(names); i++)
        if (!strcasecmp(name, names[i].name)) {
            *out = names[i].fmt;
            return 0;
        }
    return lms__err(LMS_EINVAL, "unknown chat format '%s' (known: chatml, llama3, gemma)", name ? name : "");
}

int lms_chat_format_detect(const char *tmpl, lms_chat_format *out)
{
    if (!out)
        return lms__err(LMS_EINVAL, "lms_chat_format_detect: NULL argument");
    *out = LMS_CHAT_UNKNOWN;
    if (!tmpl)
        return lms__err(LMS_ENOENT, "the model has no chat template; pass --chat-format chatml|llama3|gemma");
    if (strstr(tmpl, "<|im_start|>"))
        *out = LMS_CHAT_CHATML;
    else if (strstr(tmpl, "<|start_header_id|>"))
        *out = LMS_CHAT_LLAMA3;
    else if (strstr(tmpl, "<start_of_turn>"))
        *out = LMS_CHAT_GEMMA;
    else
        return lms__err(LMS_EUNSUPPORTED, "the model's chat template is none of the built-in formats (ChatML, "
                                          "Llama 3, Gemma); pass --chat-format chatml|llama3|gemma");
    return 0;
}

int lms_tokenizer_chat_format(const lms_tokenizer *t, lms_chat_format *out)
{
    if (!t)
        return lms__err(LMS_EINVAL, "lms_tokenizer_chat_format: NULL argument");
    return lms_chat_format_detect(t->chat_template, out);
}

const char *const *lms_chat_stop_strings(lms_chat_format fmt)
{
    switch (fmt) {
    case LMS_CHAT_CHATML: return stops_chatml;
    case LMS_CHAT_LLAMA3: return stops_llama3;
    case LMS_CHAT_GEMMA: return stops_gemma;
    default: return stops_none;
    }
}

int lms_chat_stop_ids(const lms_tokenizer *t, lms_chat_format fmt, int32_t *ids, size_t max)
{
    if (!t)
        return lms__err(LMS_EINVAL, "lms_chat_stop_ids: NULL argument");
    int found = 0;
    for (const char *const *s = lms_chat_stop_strings(fmt); *s; s++) {
        int32_t id = lms_tokenizer_token_to_id(t, *s);
        if (id < 0)
            continue;
        if (ids && (size_t)found < max)
            ids[found] = id;
        found++;
    }
    return found;
}

/* ---- string helpers with Python semantics (what the Jinja templates call) ---- */

/* str.isspace() for one code point */
static bool py_space(uint32_t c)
{
    return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
           c == 0x3000;
}

/* Jinja `| trim` = Python str.strip(): [*s, *s + *n) narrowed in place. */
static void py_strip(const char **s, size_t *n)
{
    const uint8_t *p = (const uint8_t *)*s;
    size_t a = 0, b = *n;
    uint32_t cp;
    size_t k;
    while (a < b && (k = lms__utf8_next(p + a, b - a, &cp)) && py_space(cp))
        a += k;
    while (b > a) {
        size_t j = b - 1;
        while (j > a && (p[j] & 0xC0) == 0x80)
            j--;
        if (!lms__utf8_next(p + j, b - j, &cp) || !py_space(cp))
            break;
        b = j;
    }
    *s += a;
    *n = b - a;
}

static void strip_nl(const char **s, size_t *n, bool left, bool right)
{
    while (left && *n && **s == '\n') {
        (*s)++;
        (*n)--;
    }
    while (right && *n && (*s)[*n - 1] == '\n')
        (*n)--;
}

/* Last occurrence of needle in [s, s+n), or NULL. */
static const char *mem_rfind(const char *s, size_t n, const char *needle)
{
    size_t k = strlen(needle);
    if (k > n)
        return NULL;
    for (size_t i = n - k + 1; i-- > 0;)
        if (!memcmp(s + i, needle, k))
            return s + i;
    return NULL;
}

#define ADD(str) lms__tb_add(&b, (str), strlen(str))
#define ADDN(p, n) lms__tb_add(&b, (p), (n))

static bool is_role(const lms_chat_message *m, const char *role) { return m->role && !strcmp(m->role, role); }

static int apply_chatml(const lms_chat_message *m, size_t n, unsigned flags, tok_buf *out)
{
    tok_buf b = *out;
    int rc = 0;
    if (n && is_role(&m[0], "system"))
        rc = ADD("<|im_start|>system\n") || ADD(m[0].content) || ADD("<|im_end|>\n") ? LMS_ENOMEM : 0;
    /* the last user turn that is not a tool response */
    size_t last_query = n ? n - 1 : 0;
    for (size_t k = n; k-- > 0;) {
        const char *c = m[k].content;
        size_t cl = strlen(c);
        bool tool_resp = cl >= 15 + 16 && !strncmp(c, "<tool_response>", 15) && !strcmp(c + cl - 16, "</tool_response>");
        if (is_role(&m[k], "user") && !tool_resp) {
            last_query = k;
            break;
        }
    }
    for (size_t i = 0; i < n && !rc; i++) {
        const char *c = m[i].content;
        size_t cl = strlen(c);
        if (is_role(&m[i], "user") || (is_role(&m[i], "system") && i > 0)) {
            rc = ADD("<|im_start|>") || ADD(m[i].role) || ADD("\n") || ADD(c) || ADD("<|im_end|>\n");
        } else if (is_role(&m[i], "assistant")) {
            const char *content = c, *reason = "";
            size_t content_n = cl, reason_n = 0;
            const char *end_think = strstr(c, "</think>");
            if (end_think) {
                const char *last = mem_rfind(c, cl, "</think>");
                content = last + 8;
                content_n = cl - (size_t)(content - c);
                strip_nl(&content, &content_n, true, false);
                reason = c;
                reason_n = (size_t)(end_think - c);
                strip_nl(&reason, &reason_n, false, true);
                const char *open = mem_rfind(reason, reason_n, "<think>");
                if (open) {
                    reason_n -= (size_t)(open + 7 - reason);
                    reason = open + 7;
                }
                strip_nl(&reason, &reason_n, true, false);
            }
            rc = ADD("<|im_start|>assistant\n");
            if (!rc && i > last_query && (i == n - 1 || reason_n)) {
                strip_nl(&reason, &reason_n, true, true);
                strip_nl(&content, &content_n, true, false);
                rc = ADD("<think>\n") || ADDN(reason, reason_n) || ADD("\n</think>\n\n");
            }
            rc = rc || ADDN(content, content_n) || ADD("<|im_end|>\n");
        } else if (is_role(&m[i], "tool")) {
            if (i == 0 || !is_role(&m[i - 1], "tool"))
                rc = ADD("<|im_start|>user");
            rc = rc || ADD("\n<tool_response>\n") || ADD(c) || ADD("\n</tool_response>");
            if (!rc && (i == n - 1 || !is_role(&m[i + 1], "tool")))
                rc = ADD("<|im_end|>\n");
        } else if (!is_role(&m[i], "system")) {
            rc = lms__err(LMS_EINVAL, "chat format chatml: unknown role '%s'", m[i].role);
            *out = b;
            return rc;
        }
    }
    if (!rc && (flags & LMS_CHAT_ADD_GENERATION_PROMPT)) {
        rc = ADD("<|im_start|>assistant\n");
        if (!rc && (flags & LMS_CHAT_NO_THINKING))
            rc = ADD("<think>\n\n</think>\n\n");
    }
    *out = b;
    return rc ? LMS_ENOMEM : 0;
}

static int apply_llama3(const lms_chat_message *m, size_t n, unsigned flags, tok_buf *out)
{
    tok_buf b = *out;
    int rc = 0;
    for (size_t i = 0; i < n && !rc; i++) {
        const char *c = m[i].content;
        size_t cl = strlen(c);
        py_strip(&c, &cl);
        if (i == 0)
            rc = ADD("<|begin_of_text|>");
        rc = rc || ADD("<|start_header_id|>") || ADD(m[i].role) || ADD("<|end_header_id|>\n\n") || ADDN(c, cl) ||
             ADD("<|eot_id|>");
    }
    if (!rc && (flags & LMS_CHAT_ADD_GENERATION_PROMPT))
        rc = ADD("<|start_header_id|>assistant<|end_header_id|>\n\n");
    *out = b;
    return rc ? LMS_ENOMEM : 0;
}

static int apply_gemma(const lms_chat_message *m, size_t n, unsigned flags, tok_buf *out)
{
    tok_buf b = *out;
    int rc = ADD("<bos>") ? LMS_ENOMEM : 0;
    const char *prefix = "";
    size_t first = 0;
    if (n && is_role(&m[0], "system")) {
        prefix = m[0].content;
        first = 1;
    }
    for (size_t i = first; i < n && !rc; i++) {
        bool user = is_role(&m[i], "user");
        if (user != ((i - first) % 2 == 0) || (!user && !is_role(&m[i], "assistant"))) {
            *out = b;
            return lms__err(LMS_EINVAL, "chat format gemma: roles must alternate user/assistant/user/... "
                                        "(message %zu is '%s')", i, m[i].role);
        }
        const char *c = m[i].content;
        size_t cl = strlen(c);
        py_strip(&c, &cl);
        rc = ADD("<start_of_turn>") || ADD(user ? "user" : "model") || ADD("\n");
        if (!rc && i == first && first == 1)
            rc = ADD(prefix) || ADD("\n\n");
        rc = rc || ADDN(c, cl) || ADD("<end_of_turn>\n");
    }
    if (!rc && (flags & LMS_CHAT_ADD_GENERATION_PROMPT))
        rc = ADD("<start_of_turn>model\n");
    *out = b;
    return rc ? LMS_ENOMEM : 0;
}

int lms_chat_apply(lms_chat_format fmt, const lms_chat_message *msgs, size_t n, unsigned flags, char **out)
{
    tok_buf b = {0};
    int rc;
    if (!out || (n && !msgs))
        return lms__err(LMS_EINVAL, "lms_chat_apply: NULL argument");
    *out = NULL;
    for (size_t i = 0; i < n; i++)
        if (!msgs[i].role || !msgs[i].content)
            return lms__err(LMS_EINVAL, "lms_chat_apply: message %zu has no role or content", i);
    if ((rc = lms__tb_add(&b, "", 0)))
        return rc;
    switch (fmt) {
    case LMS_CHAT_CHATML: rc = apply_chatml(msgs, n, flags, &b); break;
    case LMS_CHAT_LLAMA3: rc = apply_llama3(msgs, n, flags, &b); break;
    case LMS_CHAT_GEMMA: rc = apply_gemma(msgs, n, flags, &b); break;
    default: rc = lms__err(LMS_EINVAL, "lms_chat_apply: unknown chat format %d", (int)fmt); break;
    }
    if (rc) {
        lms__tb_free(&b);
        return rc;
    }
    *out = b.p;
    return 0;
}
