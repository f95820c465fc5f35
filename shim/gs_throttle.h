/* Compute share: one token bucket per container and GPU in front of kernel launches, held in the container's
 * usage file (struct gs_region_compute) so that every process of the container draws from it, and fed by the
 * container's own measured use of the GPU.
 *
 * A launch costs its grid size in blocks (a graph launch: GS_GRAPH_COST). Threads take tokens from the pool in
 * batches of about a millisecond of budget and spend them from thread-local memory, so a launch below the
 * share is a compare and a subtraction. Every GS_CONTROL_PERIOD_MS one process of the container (whichever
 * claims the step first) measures the container's utilisation c: the whole GPU's utilisation times the
 * container's part of NVML's per-process samples (of the container's processes, by their NVML pids:
 * gs_pidmap.h), each summed with exponential forgetting in the usage file. Drivers differ in what a sample is
 * (gs_usage.h): where each names only the one process resident on the GPU, a container's part shows only over
 * many samples, so what a token buys is learnt over GS_SLOW_TAU_S seconds, from GS_WARM_S after the start
 * (GS_FAST_TAU_S while the container's processes are the only ones NVML lists on the GPU), and the policy reacts
 * to the last GS_FAST_TAU_S. It sets the refill rate to what would
 * have produced the target a over the same seconds:
 *     target = (tokens spent per second) * a / c,   rate <- sqrt(rate * target)   (at most 4x per step)
 * so the bucket learns what a block costs on this GPU for this workload. The target a:
 *   force    the share s.
 *   default  the share s, plus idle compute: while the GPU has room (u < 100 - GS_HEADROOM), a grows by half the
 *            room above what the container uses; when the GPU is saturated (u >= GS_SATURATED) while another
 *            container uses at least GS_NEIGHBOUR_MIN, a drops to s at once (the rate is cut in the same step,
 *            without smoothing) and stays there for GS_HOLD_MS. Giving back is bounded: one control period
 *            plus the age of NVML's newest sample.
 *   disable  no gate.
 * A container that reserved no compute on the GPU (the limits file's sm_unreserved: gpu-mem without
 * gpu-core.percentage on a core_mem node) takes only what its neighbours leave, whatever the policy but disable:
 * its share s is a cap (what nobody had reserved when it was placed), not a floor. While the GPU is below
 * GS_UNRESERVED_FILL its aim grows by half the room, at most GS_UNRESERVED_STEP a step, up to s (a paid neighbour
 * bursting under default aims lower, so its burst recedes and the compute nobody reserved goes to those that
 * reserved none); when the GPU is saturated while another container uses at least GS_NEIGHBOUR_MIN, its aim is
 * divided by GS_UNRESERVED_CUT at once (down to 1 %), without smoothing, and it does not grow again for
 * GS_HOLD_MS. So any number of such containers leave a paid share its compute. It starts from a trickle
 * (GS_UNRESERVED_START blocks a second), not free, and its growth is not smoothed (it is a few points a step).
 * Otherwise, until the first measurement launches run free. */
#ifndef GS_THROTTLE_H
#define GS_THROTTLE_H

#include <stdint.h>

#include "gs_config.h"
#include "gs_pidmap.h"
#include "gs_region.h"
#include "gs_state.h"

#define GS_CONTROL_PERIOD_MS 100
#define GS_GRAPH_COST 64
#define GS_HEADROOM 8        /* default: percent of the GPU left idle for neighbours that start */
#define GS_SATURATED 97      /* default: the GPU counts as saturated from this utilisation */
#define GS_NEIGHBOUR_MIN 5   /* default: another container counts as wanting compute from this use */
#define GS_HOLD_MS 1000      /* default: after giving compute back, no bursting for this long */
#define GS_UNRESERVED_STEP 2 /* no compute reserved: the most its aim grows in one step (percent of the GPU) */
#define GS_UNRESERVED_FILL 94 /* no compute reserved: fills the GPU up to this, above default's 100 - GS_HEADROOM,
                               * so that a paid neighbour's burst above its share recedes to make room for it */
#define GS_UNRESERVED_CUT 4  /* no compute reserved: a saturated GPU divides its aim by this, each step */

/* What the throttle is told about each CUDA device of the process (it reads no device table). */
struct gs_share_limit {
    char uuid[GS_UUID_LEN];
    int share;      /* percent of the GPU, 1..100; 100 = no share to hold (unless unreserved) */
    int blocked;    /* the process may not use the GPU at all */
    int unreserved; /* no compute reserved: share is a cap, and the container gives way to its neighbours */
};

/* One GPU as the gate sees it. */
struct gs_gate_dev {
    int active;
    int share;
    int unreserved;                /* see struct gs_share_limit */
    int rd;                        /* region device */
    struct gs_region_compute *c;   /* the container's bucket in the usage file */
    char uuid[GS_UUID_LEN];
};

extern int gs_throttle_on;
extern struct gs_gate_dev gs_gates[GS_MAX_DEVICES];
extern __thread int64_t gs_tls_tokens[GS_MAX_DEVICES] __attribute__((tls_model("initial-exec")));

/* Set the gates up: n devices in CUDA ordinal order, one policy, the container's usage file. 0, or -1 when a
 * share must be held but the usage file cannot be opened (the caller refuses CUDA). */
int gs_throttle_setup(const struct gs_share_limit *limits, int n, enum gs_policy policy, const char *usage_file);
void gs_gate_slow(int d, int64_t cost);

static inline int gs_throttle_engaged(void)
{
    return __atomic_load_n(&gs_throttle_on, __ATOMIC_RELAXED);
}

/* In front of every launch on CUDA device d. */
static inline void gs_gate(int d, int64_t cost)
{
    if (d < 0 || d >= GS_MAX_DEVICES || !gs_gates[d].active)
        return;
    if (GS_LIKELY(gs_tls_tokens[d] >= cost)) {
        gs_tls_tokens[d] -= cost;
        return;
    }
    gs_gate_slow(d, cost);
}

/* Around the creation of a context on CUDA device d: the process's NVML pid is found then (gs_pidmap.h). */
void gs_throttle_context_begin(struct gs_pidmap_scope *s, int d);
void gs_throttle_context_end(struct gs_pidmap_scope *s, CUresult rc);

/* For tests and diagnostics (exported as gpushare_throttle_stats): this container's bucket on CUDA device d. */
struct gpushare_throttle_stats {
    int64_t rate;
    uint64_t spent, draws, waits;
    int active;
    int sm_limit;
    int allowed;  /* percent the bucket aims at */
    int used_pct; /* the container's utilisation at the last step, -1 = none */
    int gpu_pct;  /* the GPU's, -1 = none */
    int nvml_pid; /* this process's NVML pid; 0 = not mapped, -1 = could not be told */
};

#endif /* GS_THROTTLE_H */
