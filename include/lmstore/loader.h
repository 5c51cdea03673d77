/*
 * lmstore/loader.h - open a model from the store as tensor views, on the CPU
 * (zero copies: views are the mapped segment bytes) or on a CUDA device
 * (the mapping registered in place, or DMA'd into one device arena layer by
 * layer so compute can start before the load ends).
 *
 *   lms_store *st;  lms_model *m;
 *   lms_store_open(path, LMS_STORE_RDONLY, NULL, &st);
 *   lms_model_params p = lms_model_default_params();
 *   lms_model_open(st, "qwen3-0.6b", &p, &m);
 *   const lms_tensor *t = lms_model_tensor(m, "model.embed_tokens.weight");
 *   ... t->host (read-only mapped bytes), t->device (device address or NULL)
 *   lms_model_wait_layer(m, 0);      resident placement: layer 0 is on the device
 *   lms_model_close(m);  lms_store_close(st);
 *
 * Mapping: each segment file is mapped once per store handle (PROT_READ,
 * MAP_SHARED) and shared by all models opened from that handle, so every
 * process shares one copy of the weights in the page cache. A shared flock
 * is held on every mapped segment (gc unlinks only segments nobody holds).
 * Opening costs O(number of tensors); no data page is read unless a prefetch
 * policy, verification or a device placement asks for it.
 *
 * Lifetimes: a model borrows its store; lms_store_close returns LMS_EBUSY
 * while models of it are open. Tensor views, their names, `host` and `device`
 * pointers are owned by the model and valid until lms_model_close.
 *
 * Stability: everything declared here is stable API, the structs
 * lms_model_params, lms_device_info, lms_tensor and lms_model_stats
 * included (fields are only added, at the end). The tuning knobs of the
 * resident copies (copy source, streams, chunk size, ring shape, order) are
 * not: they live in lmstore/loader_experimental.h, [EXPERIMENTAL], reached
 * through lms_model_params.tuning, and may change in any release.
 *
 * Thread safety: lms_model_open and lms_model_close may be called from any
 * thread, also concurrently on one store. The lookups (lms_model_tensor,
 * _tensor_at, _count, _id, _name, _n_layers, _device, _stats) only read state
 * fixed at open and may be called from any number of threads at once.
 * lms_model_wait_layer may be called from several threads at once. No call
 * may race with lms_model_close on the same model.
 */
#ifndef LMSTORE_LOADER_H
#define LMSTORE_LOADER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "lmstore/error.h"
#include "lmstore/types.h"

typedef struct lms_tokenizer lms_tokenizer; /* lmstore/tokenizer.h */

#ifdef __cplusplus
extern "C" {
#endif

/* lms_device (a compute device, CPU or CUDA; the loader only borrows it) and
 * lms_model are opaque handles declared in lmstore/types.h. */

/* ---- devices (stable) ----------------------------------------------------------- */

typedef enum lms_device_kind {
    LMS_DEVICE_CPU = 0,
    LMS_DEVICE_CUDA = 1,
} lms_device_kind;

/*
 * Open a device by name: "cpu", "cuda" (= "cuda:0") or "cuda:N"; the one
 * function that resolves a device name, so `--device cuda:1` means the same
 * device to every caller. Errors: LMS_EINVAL (unknown name),
 * LMS_EUNSUPPORTED (built without that backend), LMS_EDEVICE (no such
 * device; on a machine without a GPU the detail says "no CUDA device").
 * On failure *out is NULL. Close with lms_device_close (NULL ok). A device
 * must outlive every model opened on it.
 */
LMS_API int lms_device_open_name(const char *name, lms_device **out);
/* Open device `ordinal` of `kind`; errors and ownership as above. */
LMS_API int lms_device_open(lms_device_kind kind, int ordinal, lms_device **out);
LMS_API void lms_device_close(lms_device *dev);
/* true when this build has a backend for `kind` (not whether a device exists). */
LMS_API bool lms_device_available(lms_device_kind kind);

/* What a device is, for logs and for callers that size their own buffers. */
typedef struct lms_device_info {
    lms_device_kind kind;
    int ordinal;
    char name[160];         /* printable: "cpu", "cuda:0 (NVIDIA H200)" */
    uint64_t total_mem;     /* bytes of device memory (CPU: physical memory) */
    uint64_t free_mem;      /* bytes free now (CPU: available memory); 0 = unknown */
    bool unified_memory;    /* reads host memory as its own (CPU, integrated GPUs) */
    int compute_major, compute_minor; /* CUDA compute capability; 0 on the CPU */
} lms_device_info;

/* Fill *out for `dev`; free_mem is read at the call (on CUDA this makes
 * the device current on the calling thread). Errors: LMS_EINVAL (NULL
 * argument). Thread-safe. */
LMS_API int lms_device_get_info(const lms_device *dev, lms_device_info *out);

/*
 * Pin `bytes` of host memory for staging copies to `dev` now and keep it
 * until lms_device_close (0 = lms_model_staging_bytes(NULL), what a resident
 * load with default params uses: 2 x threads ring slots of 4 MiB, 96 MiB on
 * 16+ cores). A resident load that copies through a staging ring borrows it,
 * if it is free and large enough, instead of pinning slots while it loads
 * (which delays its first layer: docs/LOADER.md), and gives it back once
 * its copies are complete; loads running meanwhile pin their own.
 * Calling again with a size it already covers does nothing. Errors:
 * LMS_EBUSY (a larger size asked while a load holds the memory),
 * LMS_ENOMEM, LMS_EDEVICE. Thread-safe, also against loads running on the
 * device; not against lms_device_close.
 */
LMS_API int lms_device_reserve_staging(lms_device *dev, size_t bytes);

typedef enum lms_placement {
    LMS_PLACE_AUTO = 0,  /* CPU device: HOST; unified-memory GPU: MAPPED; discrete GPU: RESIDENT
                          * when the weights fit in its free memory besides
                          * device_reserve_bytes, else MAPPED (logged; see lms_model_stats) */
    LMS_PLACE_HOST,      /* host views only; device pointers are NULL */
    LMS_PLACE_MAPPED,    /* the mapping registered in place; device reads host memory (zero copies) */
    LMS_PLACE_RESIDENT,  /* all weights copied into one device arena, layer by layer */
} lms_placement;

typedef enum lms_prefetch {
    LMS_PREFETCH_NONE = 0, /* touch nothing: pages are read on first use */
    LMS_PREFETCH_WILLNEED, /* madvise(MADV_WILLNEED): asynchronous readahead, returns at once */
    LMS_PREFETCH_POPULATE, /* every page read before open returns (MADV_POPULATE_READ, or touching) */
} lms_prefetch;

/* Layer indices of lms_tensor.layer and lms_model_wait_layer. */
#define LMS_LAYER_PRE (-1)           /* tensors before the blocks (embedding) */
#define LMS_LAYER_POST INT32_MAX     /* tensors after the blocks (final norm, LM head) */
#define LMS_LAYER_ALL (-2)           /* lms_model_wait_layer: every tensor */

/* [EXPERIMENTAL] tuning of the resident copies: lmstore/loader_experimental.h */
struct lms_model_tuning;

/* Stable. What a caller decides about a load; every field's 0 is the
 * default, and lms_model_default_params() returns all defaults. */
typedef struct lms_model_params {
    lms_device *device;      /* NULL = CPU (host views only). Borrowed; must outlive the model */
    lms_placement placement; /* 0 = AUTO */
    lms_prefetch prefetch;   /* host pages: 0 = NONE */
    bool mlock;              /* mlock the model's mapped ranges (fails open with LMS_EIO if refused) */
    bool verify;             /* hash every tensor (XXH3-128) at open; LMS_ECORRUPT names the tensor */
    bool sync;               /* resident: return from open only when every weight is resident
                              * (default false: open returns once the copies are queued and
                              * lms_model_wait_layer waits for each layer) */
    int threads;             /* register / reader / verify threads, 1..256; 0 = 3/4 of the online
                              * CPUs, 2..12 */
    uint64_t device_reserve_bytes; /* placement AUTO on a discrete GPU: device memory the caller
                              * will allocate besides the weights (KV cache, activations), kept
                              * free when choosing RESIDENT; 0 = 512 MiB. Not used by the
                              * other placements */
    const struct lms_model_tuning *tuning; /* [EXPERIMENTAL] NULL = defaults. Read during
                              * lms_model_open only */
} lms_model_params;

LMS_API lms_model_params lms_model_default_params(void);

/* Bytes of pinned staging memory a resident load with params `p` (NULL =
 * defaults) copies through (its ring of slots). The size to give
 * lms_device_reserve_staging so that such loads borrow the device's pool.
 * 0 when p holds a value out of range. */
LMS_API size_t lms_model_staging_bytes(const lms_model_params *p);

/*
 * A tensor of an open model. Owned by the model; valid until lms_model_close.
 * `host` is read-only (PROT_READ mapping: writing it faults). `device` is the
 * tensor's device address for MAPPED and RESIDENT placements, NULL for HOST;
 * in RESIDENT placement its bytes are valid only after
 * lms_model_wait_layer(model, tensor->layer) (or LMS_LAYER_ALL) returned 0.
 */
typedef struct lms_tensor {
    const char *name;
    lms_dtype dtype;
    uint32_t ndim;
    uint64_t shape[LMS_MAX_DIMS];
    uint64_t nbytes;
    int32_t layer;      /* block index; LMS_LAYER_PRE before the blocks, LMS_LAYER_POST after */
    const void *host;   /* mapped bytes (nbytes), aligned to the store alignment */
    void *device;       /* see above */
} lms_tensor;

/*
 * Open model `name` of `store`. params may be NULL (defaults). On success
 * *out holds the model, to be closed with lms_model_close before the store.
 * On failure *out is NULL, nothing needs closing and nothing stays mapped,
 * locked, registered or allocated. Errors: LMS_ENOENT (no such model),
 * LMS_ECORRUPT (a tensor outside its segment, or a hash mismatch with
 * verify; the detail names the tensor), LMS_EIO (open/mmap/mlock failed,
 * naming the segment), LMS_EDEVICE (device refused and no fallback was
 * possible), LMS_ENOMEM (host or device memory; the detail says how much),
 * LMS_EINVAL (bad params).
 *
 * For RESIDENT placement without params.sync, open returns once the copies
 * are under way; a copy error is then reported by lms_model_wait_layer.
 */
LMS_API int lms_model_open(lms_store *store, const char *name, const lms_model_params *params, lms_model **out);

/*
 * Close the model: waits for copies still in flight, unregisters its host
 * ranges (before any unmap), frees its device arena, and drops its
 * references on the store's mappings (the last model of a store handle
 * unmaps them and releases the segment locks). NULL ok.
 */
LMS_API void lms_model_close(lms_model *model);

/* The tensor called `name`, or NULL with LMS_ENOENT naming model and tensor. */
LMS_API const lms_tensor *lms_model_tensor(const lms_model *model, const char *name);
/* Tensors in storage (forward-pass) order: i in [0, count). NULL past the end. */
LMS_API size_t lms_model_tensor_count(const lms_model *model);
LMS_API const lms_tensor *lms_model_tensor_at(const lms_model *model, size_t i);

/*
 * A stored side file of the model ("config.json", "tokenizer.json", ...),
 * decompressed and NUL-terminated; *data is the caller's, freed with
 * lms_free. LMS_ENOENT naming the model and file when absent.
 */
LMS_API int lms_model_file(const lms_model *model, const char *file, void **data, size_t *len);
/* The model's tokenizer, as lms_store_tokenizer gives it (the compiled image
 * opened in place, else tokenizer.json parsed). Free with lms_tokenizer_free;
 * it may outlive the model. Errors as lms_store_tokenizer. */
LMS_API int lms_model_tokenizer(const lms_model *model, lms_tokenizer **out);

/* The model's content id (LMS_MODEL_ID_LEN bytes, valid until close). */
LMS_API const uint8_t *lms_model_id(const lms_model *model);
/* The name it was opened by (valid until close). */
LMS_API const char *lms_model_name(const lms_model *model);
/* Number of transformer blocks: 1 + the largest block index (0 if none). */
LMS_API int lms_model_n_layers(const lms_model *model);
/* The device it was opened on (NULL for the CPU default). */
LMS_API lms_device *lms_model_device(const lms_model *model);
/* The placement in effect (never AUTO). */
LMS_API lms_placement lms_model_placement(const lms_model *model);

/*
 * Wait until every tensor of block `layer` (or LMS_LAYER_PRE / _POST, or
 * LMS_LAYER_ALL for all of them) is on the device. Returns at once for HOST
 * and MAPPED placements and for layers that are already resident. Errors:
 * LMS_EINVAL (no such layer), LMS_EDEVICE / LMS_EIO (the copy failed; the
 * detail says where; every later wait fails the same way).
 */
LMS_API int lms_model_wait_layer(lms_model *model, int32_t layer);
/* true when lms_model_wait_layer(model, layer) would return 0 at once. */
LMS_API bool lms_model_layer_ready(lms_model *model, int32_t layer);

/* How a load went (for benchmarks and logs). Times are seconds since the
 * start of lms_model_open; a field is 0 until the event happened. */
typedef struct lms_model_stats {
    lms_placement placement;
    uint64_t tensor_bytes;     /* sum of the tensors' sizes */
    uint64_t device_bytes;     /* size of the device arena (RESIDENT) */
    uint64_t copied_bytes;     /* bytes moved to the device so far */
    uint64_t registered_bytes; /* MAPPED: host bytes registered with the device; RESIDENT: bytes
                                * copied straight out of registered (pinned in place) mappings */
    double setup_s;            /* RESIDENT: arena, streams and events made; copies may start */
    double first_copy_s;       /* RESIDENT: first copy issued */
    double open_s;             /* lms_model_open returned */
    double first_layer_s;      /* first layer in copy order on the device */
    double all_s;              /* every weight on the device */
    int streams, threads;
    bool staging;              /* copies went through the pinned staging ring */
    bool ring_reserved;        /* ...which was the device's reserved staging memory */
    bool readers;              /* ...filled by parallel readers (pread / O_DIRECT) */
    bool direct_io;            /* the readers used O_DIRECT */
    /* placement AUTO on a discrete GPU: the device memory free at open, and
     * what RESIDENT needed of it (arena + device_reserve_bytes + a margin);
     * when need > free AUTO chose MAPPED. 0 when AUTO did not weigh them. */
    uint64_t device_free_bytes;
    uint64_t device_need_bytes;
} lms_model_stats;

LMS_API int lms_model_stats_get(lms_model *model, lms_model_stats *out);

#ifdef __cplusplus
}
#endif
#endif
