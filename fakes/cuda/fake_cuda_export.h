/* The driver's private export tables (cuGetExportTable) and what the fake's files share about them. */
#ifndef FAKE_CUDA_EXPORT_H
#define FAKE_CUDA_EXPORT_H

#include "fake_cuda_api.h"

#pragma GCC visibility push(hidden)

#define FAKE_ATTR_PCI_BUS_ID 33
#define FAKE_ATTR_PCI_DEVICE_ID 34
#define FAKE_ATTR_PCI_DOMAIN_ID 50

const void *fake_export_cudart_table(void);
const void *fake_export_integrity_table(void);
/* The context table, 21318c60 (fake_cuda_export_context.c). */
extern void *fake_export_context_table[];
/* The integrity check (slot 1 of the integrity table). */
CUresult fake_integrity_check(unsigned version, unsigned long long seconds, unsigned long long out[2]);
void fake_md2(const void *data, size_t len, unsigned char out[16]);
/* The device memory an image's globals take: 0 for a real image (cubin ELF, PTX text, fatbin or fatbin wrapper),
 * N for a test image "fake-module N"; CUDA_ERROR_INVALID_IMAGE for anything else. */
CUresult fake_image_bytes(const void *image, unsigned long long *bytes);
/* Load a module from an image (cubin ELF, PTX text, fatbin, or a fatbin wrapper's data). */
CUresult fake_module_from_image(CUmodule *mod, const void *image);
/* The device's primary context, retained, as the runtime's private table hands it out: through the exported
 * cuDevicePrimaryCtxRetain (which a shim sees) or inside the driver (FAKE_CUDA_PRIVATE_PRIMARY_CTX=1). */
CUresult fake_primary_ctx_private(CUcontext *pctx, CUdevice dev);

#pragma GCC visibility pop

#endif /* FAKE_CUDA_EXPORT_H */
