/* clock.h — the monotonic clock every timing in cllm reads. */
#ifndef CLLM_CLOCK_H
#define CLLM_CLOCK_H

#ifdef __cplusplus
extern "C" { /* also called from the CUDA backend */
#endif

double now_seconds(void); /* seconds since an arbitrary start, monotonic */

#ifdef __cplusplus
}
#endif

#endif
