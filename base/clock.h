/* clock.h — the monotonic clock every timing in cllm reads. */
#ifndef CLLM_CLOCK_H
#define CLLM_CLOCK_H

double now_seconds(void); /* seconds since an arbitrary start, monotonic */

#endif
