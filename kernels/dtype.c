/* dtype.c — placeholder until the dtype/dequantizer work lands. */
#include "kernels/dtype.h"
