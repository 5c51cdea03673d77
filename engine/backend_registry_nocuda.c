/* engine/backend_registry_nocuda.c - compiled when LMS_CUDA is off: no CUDA backend. */
#include "engine/backend.h"

const lms__fwd_ops *const lms__fwd_cuda = 0;
