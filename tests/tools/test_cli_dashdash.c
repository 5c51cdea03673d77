/*
 * tests/tools/test_cli_dashdash.c - names that begin with '-': refused where
 * they would be created (import --name, cp, mv, --save-session), and
 * reachable with "--" (the end of the options) by every command that names
 * a model or a session, for stores an older lmstore let such names into.
 *
 * The '-' names are written into the index here, with the store's own
 * record code (a copy of model 'tiny' as '-tiny', of session 's' as '-s'),
 * since no command may create them any more.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "lmstore/store.h"
#include "store/store_internal.h"
#include "testutil.h"

static char *g_dir, *g_store;

/* Run a shell command made from fmt (BIN, STORE and TMP stand for the CLI,
 * the store and the scratch folder); fail the test with its output unless
 * it exits 0. */
static void ok(const char *what, const char *fmt)
{
    char cmd[2048], *out = NULL;
    size_t o = 0;
    for (const char *p = fmt; *p && o < sizeof cmd - 600; p++) {
        if (!strncmp(p, "BIN", 3)) {
            o += (size_t)snprintf(cmd + o, sizeof cmd - o, "'%s'", lms_test_bin());
            p += 2;
        } else if (!strncmp(p, "STORE", 5)) {
            o += (size_t)snprintf(cmd + o, sizeof cmd - o, "'%s'", g_store);
            p += 4;
        } else if (!strncmp(p, "TMP", 3)) {
            o += (size_t)snprintf(cmd + o, sizeof cmd - o, "'%s'", g_dir);
            p += 2;
        } else {
            cmd[o++] = *p;
        }
    }
    cmd[o] = '\0';
    int st = lms_test_sh(&out, "%s", cmd);
    if (st != 0)
        fail_msg("%s: `%s` exited %d:\n%s", what, cmd, st, out ? out : "");
    free(out);
}

/* Copy model `from`'s records under `to` (as cp does) and session sfrom as sto. */
static int dash_txn(lms_store *s, MDB_txn *txn, void *vctx)
{
    (void)vctx;
    MDB_val v;
    int rc = lms__db_get(s, txn, LMS__DB_MODELS, "tiny", 4, &v);
    if (rc)
        return rc;
    void *rec = malloc(v.mv_size);
    memcpy(rec, v.mv_data, v.mv_size);
    size_t rl = v.mv_size;
    rc = lms__db_put(s, txn, LMS__DB_MODELS, "-tiny", 5, rec, rl, 0);
    free(rec);
    if (rc)
        return rc;
    for (int db = LMS__DB_TENSORS; db <= LMS__DB_FILES; db++) {
        if (db == LMS__DB_BLOBS)
            continue;
        /* gather "tiny NUL item" records, then write "-tiny NUL item" */
        MDB_cursor *cur;
        MDB_val k, d;
        int check;
        char *keys[512];
        void *vals[512];
        size_t kl[512], vl[512], n = 0;
        if (mdb_cursor_open(txn, s->dbi[db], &cur))
            return LMS_EDB;
        for (int m = lms__cursor_get(s, cur, db, &k, &d, MDB_FIRST, &check); m == 0 && n < 512;
             m = lms__cursor_get(s, cur, db, &k, &d, MDB_NEXT, &check)) {
            if (k.mv_size < 5 || memcmp(k.mv_data, "tiny", 5))
                continue;
            kl[n] = k.mv_size + 1;
            keys[n] = malloc(kl[n]);
            keys[n][0] = '-';
            memcpy(keys[n] + 1, k.mv_data, k.mv_size);
            vl[n] = d.mv_size;
            vals[n] = malloc(d.mv_size);
            memcpy(vals[n], d.mv_data, d.mv_size);
            n++;
        }
        mdb_cursor_close(cur);
        for (size_t i = 0; i < n; i++) {
            if (!rc)
                rc = lms__db_put(s, txn, db, keys[i], kl[i], vals[i], vl[i], 0);
            if (!rc && db == LMS__DB_TENSORS) {
                lms__tensor_rec tr;
                rc = lms__tensor_rec_decode(vals[i], vl[i], &tr);
                if (!rc)
                    rc = lms__blob_ref(s, txn, tr.hash, +1, NULL);
            }
            free(keys[i]);
            free(vals[i]);
        }
        if (rc)
            return rc;
    }
    if ((rc = lms__db_get(s, txn, LMS__DB_SESSIONS, "s", 1, &v)))
        return rc;
    rec = malloc(v.mv_size);
    memcpy(rec, v.mv_data, v.mv_size);
    rl = v.mv_size;
    rc = lms__db_put(s, txn, LMS__DB_SESSIONS, "-s", 2, rec, rl, 0);
    free(rec);
    return rc;
}

static int setup(void **state)
{
    (void)state;
    g_dir = lms_test_tmpdir("dashdash");
    if (asprintf(&g_store, "%s/store", g_dir) < 0)
        return -1;
    if (lms_test_sh(NULL, "python3 '%s/tests/gen_model.py' '%s/src' --force --arch qwen3 --hidden 64 --layers 2 "
                    "--vocab 16384 --tokenizer '%s/tests/fixtures/tokenizers/qwen3' --chat-template",
                    lms_test_src(), g_dir, lms_test_src()) ||
        lms_test_sh(NULL, "'%s' import '%s/src' --store '%s' --name tiny -q", lms_test_bin(), g_dir, g_store) ||
        lms_test_sh(NULL, "'%s' run tiny hello --store '%s' -n 2 --save-session s", lms_test_bin(), g_store))
        return -1;
    lms_store *s;
    if (lms_store_open(g_store, 0, NULL, &s))
        return -1;
    lms__lock lock;
    int rc = lms__lock_take(s, &lock);
    if (!rc)
        rc = lms__txn_write(s, dash_txn, NULL);
    lms__lock_release(s, &lock);
    lms_store_close(s);
    return rc ? -1 : 0;
}

static int teardown(void **state)
{
    (void)state;
    lms_test_rmrf(g_dir);
    free(g_dir);
    free(g_store);
    return 0;
}

static void every_command_reaches_a_dash_name_after_dashdash(void **state)
{
    (void)state;
    ok("ls", "BIN ls --store STORE | grep -q -- '^-tiny '");
    ok("info", "BIN info --store STORE -- -tiny | grep -q 'model.layers.0'");
    ok("info --json", "BIN info --json --store STORE -- -tiny | grep -q -- '\"-tiny\"'");
    ok("cat", "BIN cat --store STORE -- -tiny config.json | grep -q architectures");
    ok("verify", "BIN verify --store STORE -- -tiny");
    ok("tokenize", "echo hello | BIN tokenize --store STORE -- -tiny | grep -q '^[0-9]'");
    ok("detokenize", "BIN detokenize --ids 14990 --store STORE -- -tiny | grep -q hello");
    ok("run", "BIN run -n 2 --store STORE -- -tiny hello world");
    ok("run: words after -- are prompt", "BIN run tiny -n 1 --store STORE --json -- -p | grep -q '\"prompt_ids\"'");
    ok("logits", "BIN logits --prompt-ids 1,2 --out TMP/logits.bin --store STORE -- -tiny && test -s TMP/logits.bin");
    ok("kv info", "BIN kv info --store STORE -- -s | grep -q -- -s");
    ok("resume a '-' session", "BIN run tiny --resume -s -n 1 --store STORE --prompt-ids 5");
    ok("export", "BIN export --store STORE -- -tiny TMP/export && test -s TMP/export/model.safetensors");
    ok("cp", "BIN cp --store STORE -- -tiny plain");
    ok("mv", "BIN mv --store STORE -- -tiny tiny-2");
    ok("rm", "BIN rm --store STORE -- plain tiny-2");
    ok("kv rm", "BIN kv rm --store STORE -- -s");
    ok("gc", "BIN gc --store STORE --grace 0.1");
    ok("verify after", "BIN verify --store STORE");
    ok("-- before the command", "BIN --store STORE -- ls | grep -q '^tiny '");
}

static void dash_names_are_refused_where_they_would_be_made(void **state)
{
    (void)state;
    ok("import --name", "BIN import \"$LMS_SRC_DIR/tests/fixtures/engine/llama\" --name -x --store STORE 2>&1 | "
                        "grep -q \"begins with '-'\"");
    ok("cp", "BIN cp --store STORE -- tiny -y 2>&1 | grep -q \"begins with '-'\"");
    ok("mv", "BIN mv --store STORE -- tiny -y 2>&1 | grep -q \"begins with '-'\"");
    ok("--save-session", "BIN run tiny hi --store STORE --save-session -z 2>&1 | grep -q \"begins with '-'\"");
    ok("nothing was made", "! BIN ls --store STORE | grep -q '^-'");
    ok("nothing was saved", "! BIN kv ls --store STORE | grep -q '^-'");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(every_command_reaches_a_dash_name_after_dashdash),
        cmocka_unit_test(dash_names_are_refused_where_they_would_be_made),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
