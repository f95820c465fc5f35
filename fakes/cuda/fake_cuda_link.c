/* Fake driver: the JIT linker (cuLinkCreate, cuLinkAddData, cuLinkAddFile, cuLinkComplete, cuLinkDestroy) and
 * cuModuleLoadFatBinary. cuBLASLt looks all of them up by name (dlsym) at its first handle and fails without them.
 *
 * A link state collects inputs and checks each is what its CUjitInputType says: a cubin or a host object is an ELF
 * image, PTX is text with .version and .target, a fatbinary starts with the fatbin magic, a library is an `ar`
 * archive. cuLinkComplete hands out an image the state owns until cuLinkDestroy: an ELF header for the CUDA machine
 * (EM_CUDA), which cuModuleLoadData and cuLibraryLoadData accept like any cubin, since kernels are not run. Nothing
 * is compiled, so the info and error logs a client passes in the options are left empty (terminated, their used
 * size 0) and the wall time is 0. */
#define _GNU_SOURCE /* memmem */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fake_cuda_export.h"

#define CUDA_ERROR_INVALID_IMAGE 200
#define CUDA_ERROR_FILE_NOT_FOUND 301
#define FAKE_LINK_MAGIC 0x4b4e494cu /* "LINK" */

enum { JIT_WALL_TIME = 2, JIT_INFO_LOG = 3, JIT_INFO_LOG_SIZE = 4, JIT_ERROR_LOG = 5, JIT_ERROR_LOG_SIZE = 6 };
enum { INPUT_CUBIN, INPUT_PTX, INPUT_FATBINARY, INPUT_OBJECT, INPUT_LIBRARY, INPUT_COUNT };

struct fake_link {
    unsigned magic;
    unsigned inputs;
    unsigned char image[64]; /* what cuLinkComplete hands out: an ELF64 header, e_machine EM_CUDA */
};

/* The logs are empty: a terminated buffer, 0 bytes used (written back into the size option's value). */
static void empty_logs(unsigned n, const int *options, void **values)
{
    if (!options || !values)
        return;
    for (unsigned i = 0; i < n; i++) {
        if (options[i] == JIT_INFO_LOG_SIZE || options[i] == JIT_ERROR_LOG_SIZE) {
            int log = options[i] == JIT_INFO_LOG_SIZE ? JIT_INFO_LOG : JIT_ERROR_LOG;
            for (unsigned j = 0; j < n; j++)
                if (options[j] == log && values[j] && (uintptr_t)values[i] > 0)
                    *(char *)values[j] = '\0';
            values[i] = (void *)(uintptr_t)0;
        } else if (options[i] == JIT_WALL_TIME) {
            float zero = 0.0f;
            memcpy(&values[i], &zero, sizeof zero);
        }
    }
}

static void elf_header(unsigned char *h)
{
    memset(h, 0, 64);
    memcpy(h, "\177ELF", 4);
    h[4] = 2;    /* ELFCLASS64 */
    h[5] = 1;    /* little endian */
    h[6] = 1;    /* EV_CURRENT */
    h[7] = 0x33; /* ELFOSABI_CUDA */
    h[16] = 2;   /* ET_EXEC */
    h[18] = 190; /* EM_CUDA */
    h[20] = 1;   /* e_version */
    h[52] = 64;  /* e_ehsize */
}

static struct fake_link *link_of(void *state)
{
    struct fake_link *l = state;
    return l && l->magic == FAKE_LINK_MAGIC ? l : NULL;
}

CUresult impl_cuLinkCreate_v2(unsigned n, int *options, void **values, void **state)
{
    if (!fake_initialised)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!state || (n && (!options || !values)))
        return CUDA_ERROR_INVALID_VALUE;
    if (!fake_current)
        return CUDA_ERROR_INVALID_CONTEXT;
    struct fake_link *l = calloc(1, sizeof *l);
    if (!l)
        return CUDA_ERROR_OUT_OF_MEMORY;
    l->magic = FAKE_LINK_MAGIC;
    elf_header(l->image);
    empty_logs(n, options, values);
    *state = l;
    return CUDA_SUCCESS;
}
FAKE_EXPORT(cuLinkCreate_v2)

/* 1 when the bytes are an input of that type. */
static int input_is(int type, const unsigned char *data, size_t size)
{
    uint32_t magic = 0;
    if (size >= 4)
        memcpy(&magic, data, sizeof magic);
    switch (type) {
    case INPUT_CUBIN:
    case INPUT_OBJECT:
        return size >= 4 && !memcmp(data, "\177ELF", 4);
    case INPUT_PTX:
        /* text; size 0 means NUL-terminated */
        size = size ? size : strlen((const char *)data);
        return memmem(data, size, ".version", 8) && memmem(data, size, ".target", 7);
    case INPUT_FATBINARY:
        return size >= 4 && magic == 0xBA55ED50u;
    case INPUT_LIBRARY:
        return size >= 8 && !memcmp(data, "!<arch>\n", 8);
    default:
        return 0;
    }
}

CUresult impl_cuLinkAddData_v2(void *state, int type, void *data, size_t size, const char *name, unsigned n,
                               int *options, void **values)
{
    (void)name;
    struct fake_link *l = link_of(state);
    if (!l)
        return CUDA_ERROR_INVALID_HANDLE;
    if (!data || type < 0 || type >= INPUT_COUNT || (n && (!options || !values)))
        return CUDA_ERROR_INVALID_VALUE;
    if (!input_is(type, data, size))
        return CUDA_ERROR_INVALID_IMAGE;
    empty_logs(n, options, values);
    l->inputs++;
    return CUDA_SUCCESS;
}
FAKE_EXPORT(cuLinkAddData_v2)

CUresult impl_cuLinkAddFile_v2(void *state, int type, const char *path, unsigned n, int *options, void **values)
{
    struct fake_link *l = link_of(state);
    if (!l)
        return CUDA_ERROR_INVALID_HANDLE;
    if (!path)
        return CUDA_ERROR_INVALID_VALUE;
    FILE *f = fopen(path, "rb");
    if (!f)
        return CUDA_ERROR_FILE_NOT_FOUND;
    unsigned char head[4097] = {0};
    size_t got = fread(head, 1, sizeof head - 1, f);
    fclose(f);
    return impl_cuLinkAddData_v2(state, type, head, got, path, n, options, values);
}
FAKE_EXPORT(cuLinkAddFile_v2)

CUresult impl_cuLinkComplete(void *state, void **image, size_t *size)
{
    struct fake_link *l = link_of(state);
    if (!l)
        return CUDA_ERROR_INVALID_HANDLE;
    if (!image || !size)
        return CUDA_ERROR_INVALID_VALUE;
    if (!l->inputs)
        return CUDA_ERROR_INVALID_VALUE; /* nothing to link */
    *image = l->image;
    *size = sizeof l->image;
    return CUDA_SUCCESS;
}
FAKE_EXPORT(cuLinkComplete)

CUresult impl_cuLinkDestroy(void *state)
{
    struct fake_link *l = link_of(state);
    if (!l)
        return CUDA_ERROR_INVALID_HANDLE;
    l->magic = 0;
    free(l);
    return CUDA_SUCCESS;
}
FAKE_EXPORT(cuLinkDestroy)

/* A fatbinary (or the runtime's wrapper of one) loaded as a module. */
CUresult impl_cuModuleLoadFatBinary(CUmodule *mod, const void *fatbin)
{
    if (!fake_initialised)
        return CUDA_ERROR_NOT_INITIALIZED;
    return fake_module_from_image(mod, fatbin);
}
FAKE_EXPORT(cuModuleLoadFatBinary)
