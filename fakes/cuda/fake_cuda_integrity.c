/* Fake driver: the CUDA runtime's start-up integrity check (export table d4082055, slot 1). The runtime hands the
 * driver a version and the time, computes the expected answer itself from what the driver reports (its version,
 * the tables' addresses, each device's UUID and PCI location) and refuses to run when the two differ. The answer
 * is HMAC-MD2 (RFC 1319 MD2, 16-byte blocks) under a fixed key, except for versions ending in 0 or 1, which take
 * constants. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fake_cuda_export.h"

static const unsigned char md2_s[256] = {
    41,  46,  67,  201, 162, 216, 124, 1,   61,  54,  84,  161, 236, 240, 6,   19,  98,  167, 5,   243, 192, 199,
    115, 140, 152, 147, 43,  217, 188, 76,  130, 202, 30,  155, 87,  60,  253, 212, 224, 22,  103, 66,  111, 24,
    138, 23,  229, 18,  190, 78,  196, 214, 218, 158, 222, 73,  160, 251, 245, 142, 187, 47,  238, 122, 169, 104,
    121, 145, 21,  178, 7,   63,  148, 194, 16,  137, 11,  34,  95,  33,  128, 127, 93,  154, 90,  144, 50,  39,
    53,  62,  204, 231, 191, 247, 151, 3,   255, 25,  48,  179, 72,  165, 181, 209, 215, 94,  146, 42,  172, 86,
    170, 198, 79,  184, 56,  210, 150, 164, 125, 182, 118, 252, 107, 226, 156, 116, 4,   241, 69,  157, 112, 89,
    100, 113, 135, 32,  134, 91,  207, 101, 230, 45,  168, 2,   27,  96,  37,  173, 174, 176, 185, 246, 28,  70,
    97,  105, 52,  64,  126, 15,  85,  71,  163, 35,  221, 81,  175, 58,  195, 92,  249, 206, 186, 197, 234, 38,
    44,  83,  13,  110, 133, 40,  132, 9,   211, 223, 205, 244, 65,  129, 77,  82,  106, 220, 55,  200, 108, 193,
    171, 250, 36,  225, 123, 8,   12,  189, 177, 74,  120, 136, 149, 139, 227, 99,  232, 109, 233, 203, 213, 254,
    59,  0,   29,  57,  242, 239, 183, 14,  102, 88,  208, 228, 166, 119, 114, 248, 235, 117, 75,  10,  49,  68,
    80,  180, 143, 237, 31,  26,  219, 153, 141, 51,  159, 17,  131, 20};

struct md2 {
    unsigned char x[48], checksum[16], buf[16];
    size_t n; /* bytes in buf */
};

static void md2_block(struct md2 *m, const unsigned char *b)
{
    unsigned char l = m->checksum[15];
    for (int i = 0; i < 16; i++) {
        m->x[16 + i] = b[i];
        m->x[32 + i] = (unsigned char)(b[i] ^ m->x[i]);
        l = m->checksum[i] ^= md2_s[b[i] ^ l];
    }
    unsigned t = 0;
    for (int j = 0; j < 18; j++) {
        for (int k = 0; k < 48; k++)
            t = m->x[k] ^= md2_s[t];
        t = (t + (unsigned)j) & 0xff;
    }
}

static void md2_init(struct md2 *m)
{
    memset(m, 0, sizeof *m);
}

static void md2_update(struct md2 *m, const void *data, size_t len)
{
    const unsigned char *p = data;
    while (len) {
        size_t take = 16 - m->n < len ? 16 - m->n : len;
        memcpy(m->buf + m->n, p, take);
        m->n += take, p += take, len -= take;
        if (m->n == 16) {
            md2_block(m, m->buf);
            m->n = 0;
        }
    }
}

static void md2_final(struct md2 *m, unsigned char out[16])
{
    unsigned char pad = (unsigned char)(16 - m->n);
    memset(m->buf + m->n, pad, pad);
    md2_block(m, m->buf);
    unsigned char sum[16];
    memcpy(sum, m->checksum, 16);
    md2_block(m, sum);
    memcpy(out, m->x, 16);
}

void fake_md2(const void *data, size_t len, unsigned char out[16])
{
    struct md2 m;
    md2_init(&m);
    md2_update(&m, data, len);
    md2_final(&m, out);
}

static const unsigned char hmac_key[16] = {0x14, 0x6a, 0xdd, 0xae, 0x53, 0xa9, 0xa7, 0x52,
                                           0xaa, 0x08, 0x41, 0x36, 0x0b, 0xf5, 0x5a, 0x9f};

struct check_header {
    uint32_t driver_version, version, pid, thread;
    const void *cudart_table, *integrity_table, *check_fn;
    uint64_t seconds;
};

struct device_part {
    unsigned char uuid[16];
    int32_t domain, bus, device;
};

CUresult fake_integrity_check(unsigned version, unsigned long long seconds, unsigned long long out[2])
{
    if (!out)
        return CUDA_ERROR_INVALID_VALUE;
    if (getenv("FAKE_CUDA_TRACE"))
        fprintf(stderr, "fake libcuda: integrity check, version %u\n", version);
    if (version % 10 == 0) {
        out[0] = 0x3341181c03cb675cULL, out[1] = 0x8ed383aa1f4cd1e8ULL;
        return CUDA_SUCCESS;
    }
    if (version % 10 == 1) {
        out[0] = 0x1841181c03cb675cULL, out[1] = 0x8ed383aa1f4cd1e8ULL;
        return CUDA_SUCCESS;
    }
    int driver = 0;
    impl_cuDriverGetVersion(&driver);
    struct check_header h;
    memset(&h, 0, sizeof h);
    h.driver_version = (uint32_t)driver;
    h.version = version;
    h.pid = (uint32_t)getpid();
    h.thread = (uint32_t)(uintptr_t)pthread_self();
    h.cudart_table = fake_export_cudart_table();
    h.integrity_table = fake_export_integrity_table();
    h.check_fn = (const void *)&fake_integrity_check;
    h.seconds = seconds;

    unsigned char ipad[16], opad[16], inner[16], result[16];
    for (int i = 0; i < 16; i++)
        ipad[i] = hmac_key[i] ^ 0x36, opad[i] = hmac_key[i] ^ 0x5c;
    struct md2 m;
    md2_init(&m);
    md2_update(&m, ipad, 16);
    md2_update(&m, &h, sizeof h);
    for (int d = 0; d < fake_device_count; d++) {
        struct device_part p;
        CUuuid u;
        impl_cuDeviceGetUuid_v2(&u, d);
        memcpy(p.uuid, u.bytes, 16);
        impl_cuDeviceGetAttribute(&p.domain, FAKE_ATTR_PCI_DOMAIN_ID, d);
        impl_cuDeviceGetAttribute(&p.bus, FAKE_ATTR_PCI_BUS_ID, d);
        impl_cuDeviceGetAttribute(&p.device, FAKE_ATTR_PCI_DEVICE_ID, d);
        md2_update(&m, &p, sizeof p);
    }
    md2_final(&m, inner);
    md2_init(&m);
    md2_update(&m, opad, 16);
    md2_update(&m, inner, 16);
    md2_final(&m, result);
    memcpy(out, result, 16);
    return CUDA_SUCCESS;
}

/* Test API: MD2 of a buffer, so tests can check the hash against RFC 1319's examples. */
__attribute__((visibility("default"))) int fakeCuda_md2(const void *data, size_t len, unsigned char out[16])
{
    fake_md2(data, len, out);
    return 0;
}
