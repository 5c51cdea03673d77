/* engine/backend_registry_cuda.c - compiled when LMS_CUDA is on: the CUDA backend (engine/cuda/). */
#include "engine/backend.h"

extern const lms__fwd_ops lms__fwd_cuda_ops; /* engine/cuda/fwd_cuda.c */

const lms__fwd_ops *const lms__fwd_cuda = &lms__fwd_cuda_ops;
