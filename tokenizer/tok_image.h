/*
 * tokenizer/tok_image.h - what the store needs beyond the public tokenizer
 * API to hand a mapped compiled image to a tokenizer that outlives the
 * caller's handle on it. Internal.
 */
#ifndef LMS_TOK_IMAGE_H
#define LMS_TOK_IMAGE_H

#include "lmstore/tokenizer.h"

/* Run release(arg) when tok is freed (after its last use of the image it was
 * opened from): the tokenizer then owns the image, e.g. its mapping. */
void lms__tokenizer_set_release(lms_tokenizer *tok, void (*release)(void *), void *arg);

#endif
