/* Holds the accounting file's lock in the middle of an update and waits to be killed, for the test that a
 * killed lock holder blocks nobody:
 *   gs_lock_holder CACHE_FILE GPU_UUID BYTES
 * registers the GPU, takes the lock, writes half a slot (BYTES charged to this process), prints "locked" and
 * sleeps. After SIGKILL the kernel drops the lock and the slot belongs to a dead process. */
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "gs_region.h"

int main(int argc, char **argv)
{
    if (argc != 4) {
        fprintf(stderr, "usage: gs_lock_holder CACHE_FILE GPU_UUID BYTES\n");
        return 2;
    }
    if (gs_region_open(argv[1]))
        return 1;
    int rd = gs_region_device(argv[2], 1, 0);
    if (rd < 0)
        return 1;
    struct gs_region *r = gs_region_map();
    gs_region_lock();
    uint32_t i = r->nslots;
    r->slots[i].used[rd] = strtoull(argv[3], NULL, 10);
    r->slots[i].start_time = 0;
    __atomic_store_n(&r->slots[i].pid, (int32_t)getpid(), __ATOMIC_SEQ_CST);
    __atomic_store_n(&r->nslots, i + 1, __ATOMIC_SEQ_CST);
    printf("locked\n");
    fflush(stdout);
    for (;;)
        pause();
}
