/* Compute share: a token bucket per GPU in front of kernel launches, fed by the GPU's measured utilisation.
 *
 * A launch costs its grid size in blocks (a graph launch: GS_GRAPH_COST). Threads take tokens from the GPU's
 * pool in batches of about a millisecond of budget and spend them without atomics, so a launch below the
 * share is a compare and a subtraction on thread-local memory. A controller thread reads NVML utilisation u
 * every GS_CONTROL_PERIOD_MS and sets the refill rate to what would have produced the share s:
 *     target = (tokens spent per second) * s / u,   rate <- sqrt(rate * target)   (at most 4x per step)
 * The step is scale-free (no SM-count term, so it neither crawls on small GPUs nor oscillates on big ones);
 * at 100 % (or policy `disable`) the gate is off. Until the first measurement launches run free. */
#ifndef GS_THROTTLE_H
#define GS_THROTTLE_H

#include <stdint.h>

#include "gs_shim.h"

#define GS_CONTROL_PERIOD_MS 100
#define GS_GRAPH_COST 64

struct gs_bucket {
    int active;
    int64_t pool;         /* tokens; negative while launches wait for the refill */
    int64_t rate;         /* tokens per second; 0 = not measured yet (launches run free) */
    int64_t capacity;     /* the most the pool holds: 50 ms of budget */
    uint64_t last_refill; /* monotonic ns */
    uint64_t spent;       /* tokens used by launches (threads report when they take a new batch) */
    uint64_t draws;       /* batches taken */
    uint64_t waits;       /* batches that had to wait */
};

extern int gs_throttle_on;
extern struct gs_bucket gs_buckets[GS_MAX_DEVICES];
extern __thread int64_t gs_tls_tokens[GS_MAX_DEVICES] __attribute__((tls_model("initial-exec")));

void gs_throttle_setup(int ndevs);
void gs_throttle_after_fork_child(void);
void gs_gate_slow(int d, int64_t cost);

/* In front of every launch. */
static inline void gs_gate(int64_t cost)
{
    if (GS_LIKELY(!__atomic_load_n(&gs_throttle_on, __ATOMIC_RELAXED)))
        return;
    int d = 0;
    if (gs_ndevs != 1 && gs_current_device(&d) != CUDA_SUCCESS)
        return;
    if (d < 0 || d >= GS_MAX_DEVICES || !gs_buckets[d].active)
        return;
    if (GS_LIKELY(gs_tls_tokens[d] >= cost)) {
        gs_tls_tokens[d] -= cost;
        return;
    }
    gs_gate_slow(d, cost);
}

/* For tests and diagnostics (exported as gpushare_throttle_stats). */
struct gpushare_throttle_stats {
    int64_t rate;
    uint64_t spent, draws, waits;
    int active;
    int sm_limit;
};

#endif /* GS_THROTTLE_H */
