/* Which versioned entry point the driver's cuGetProcAddress answers for a base name, a CUDA version and the
 * stream flags, for every name the shim hooks, as cuda.h defines them up to GS_NEWEST_KNOWN_CUDA. Used when the
 * driver hands out an address the shim cannot match to an exported symbol: the hook is then chosen by name. */
#ifndef GS_VARIANTS_H
#define GS_VARIANTS_H

#include "gs_cuda_types.h"

/* The newest CUDA version whose entry points the table describes. A request for a newer version may mean an
 * entry point with another signature: only an exact address match is trusted there. */
#define GS_NEWEST_KNOWN_CUDA 13000

/* The exported name of the variant of `base` for `version` and `flags`, or NULL when the table has none (a
 * name the shim does not hook, a version before the first, or newer than GS_NEWEST_KNOWN_CUDA). */
const char *gs_variant(const char *base, int version, cuuint64_t flags);

#endif /* GS_VARIANTS_H */
