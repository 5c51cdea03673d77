/*
 * store/mlx.h - MLX quantized safetensors (the mlx-community layout): the
 * packed weights are recognized and described as MLX_AFFINE tensors, their
 * bytes untouched.
 *
 * mlx-lm saves a quantized linear (or embedding) layer X as three tensors:
 * X.weight, uint32 [out, in * bits / 32] (codes packed little-endian along
 * the row), X.scales and X.biases, [out, in / group] in the model's float
 * dtype; config.json's "quantization" gives {"group_size", "bits"} and, per
 * layer path X, an override object (or false: not quantized). An "mode"
 * other than "affine" is not supported.
 */
#ifndef LMS_STORE_MLX_H
#define LMS_STORE_MLX_H

#include <stddef.h>

#include "store/safetensors.h"

/*
 * Mark the packed weights of src as MLX_AFFINE (dtype, shape in elements,
 * bits, group), checking each against its scales, biases and the config.
 * config: config.json's bytes (may be NULL: then a tensor NAME.scales is an
 * error). `path` names config.json in errors. LMS_EFORMAT naming the tensor
 * or the config key; LMS_EUNSUPPORTED for other quantization modes.
 */
int lms__mlx_bind(const char *config, size_t len, const char *path, lms__st_source *src);

#endif
