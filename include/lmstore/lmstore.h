/*
 * lmstore/lmstore.h - the whole public API of liblmstore in one include:
 * the store (import, read, verify, gc, export), the loader (models as
 * tensors on a device), the paged KV cache with sessions, the tokenizer and
 * chat formats, and the engine. Each header documents its own lifetimes and
 * error codes; all follow error.h.
 */
#ifndef LMSTORE_LMSTORE_H
#define LMSTORE_LMSTORE_H

#include "lmstore/error.h"
#include "lmstore/types.h"
#include "lmstore/store.h"
#include "lmstore/loader.h"
#include "lmstore/kvcache.h"
#include "lmstore/tokenizer.h"
#include "lmstore/engine.h"

#endif
