/* Reading MIG mode and MIG devices from the fake driver's config (fake_gpu_mig.h describes the lines). Included by
 * fake_gpu_config.h after its helpers; static inline only. */
#ifndef FAKE_GPU_MIG_CONFIG_H
#define FAKE_GPU_MIG_CONFIG_H

/* gpu-line keys mig= and mig_pending=; 1 when the key is not one of them. */
static inline int fake_mig_gpu_key(struct fake_gpu_info *g, const char *key, const char *val, char *err,
                                   size_t errlen, const char *path, int line)
{
    int *field = !strcmp(key, "mig") ? &g->mig_current : !strcmp(key, "mig_pending") ? &g->mig_pending : NULL;
    if (!field)
        return 1;
    if (strcmp(val, "0") && strcmp(val, "1"))
        return fake_cfg_fail(err, errlen, path, line, "%s must be 1 (enabled) or 0 (disabled), got '%s'", key, val);
    *field = val[0] == '1';
    return 0;
}

/* Slices of a profile name: "3g.40gb" -> gi 3, ci 3; "1c.3g.40gb" -> gi 3, ci 1. 0 when unreadable. */
static inline void fake_mig_slices(const char *profile, unsigned *gi, unsigned *ci)
{
    unsigned a = 0, b = 0;
    char unit = 0;
    *gi = *ci = 0;
    if (sscanf(profile, "%uc.%ug", &a, &b) == 2) {
        *ci = a, *gi = b;
    } else if (sscanf(profile, "%u%c", &a, &unit) == 2 && unit == 'g') {
        *gi = *ci = a;
    }
}

/* One `mig ...` line (p: after the word). 0, or -1 with err filled. */
static inline int fake_mig_line(struct fake_gpu_config *cfg, char *p, char *err, size_t errlen, const char *path,
                                int line)
{
    if (cfg->mig_count == FAKE_GPU_MAX_MIGS)
        return fake_cfg_fail(err, errlen, path, line, "more than %s MIG devices%s", "16", "");
    struct fake_mig_info *m = &cfg->migs[cfg->mig_count];
    memset(m, 0, sizeof *m);
    m->line = line;
    char *key, *val;
    int t;
    unsigned long long u;
    while ((t = fake_cfg_token(&p, &key, &val, err, errlen, path, line)) == 1) {
        if (!strcmp(key, "parent")) {
            if (strncmp(val, "GPU-", 4) || strlen(val) >= FAKE_GPU_UUID_LEN)
                return fake_cfg_fail(err, errlen, path, line, "parent must be the uuid of a gpu line, got '%s'%s",
                                     val, "");
            snprintf(m->parent_uuid, sizeof m->parent_uuid, "%s", val);
        } else if (!strcmp(key, "uuid")) {
            if (strncmp(val, "MIG-", 4) || strlen(val) < 5 || strlen(val) >= FAKE_GPU_UUID_LEN)
                return fake_cfg_fail(err, errlen, path, line, "a MIG device's uuid must look like MIG-<hex and "
                                     "dashes>, got '%s'%s", val, "");
            snprintf(m->uuid, sizeof m->uuid, "%s", val);
        } else if (!strcmp(key, "profile")) {
            unsigned gi, ci;
            fake_mig_slices(val, &gi, &ci);
            if (strlen(val) >= FAKE_GPU_PROFILE_LEN || !gi || !ci || gi > 8 || ci > gi)
                return fake_cfg_fail(err, errlen, path, line, "profile must look like 1g.10gb or 1c.3g.40gb, got "
                                     "'%s'%s", val, "");
            snprintf(m->profile, sizeof m->profile, "%s", val);
        } else if (!strcmp(key, "memory_mib")) {
            if (fake_cfg_uint(val, 1ULL << 30, &u) || u == 0)
                return fake_cfg_fail(err, errlen, path, line, "memory_mib must be a positive integer, got '%s'%s",
                                     val, "");
            m->memory_bytes = u << 20;
        } else if (!strcmp(key, "sms")) {
            if (fake_cfg_uint(val, 1024, &u) || u == 0)
                return fake_cfg_fail(err, errlen, path, line, "sms must be 1..1024, got '%s'%s", val, "");
            m->sms = (unsigned)u;
        } else if (!strcmp(key, "gi") || !strcmp(key, "ci")) {
            if (fake_cfg_uint(val, 255, &u))
                return fake_cfg_fail(err, errlen, path, line, "%s must be 0..255, got '%s'", key, val);
            *(key[0] == 'g' ? &m->gi : &m->ci) = (unsigned)u;
        } else if (!strcmp(key, "slot")) {
            if (fake_cfg_uint(val, FAKE_GPU_MAX_GPUS - 1, &u))
                return fake_cfg_fail(err, errlen, path, line, "slot must be 0..15 (the MIG device's entry in the "
                                     "node's state file), got '%s'%s", val, "");
            m->slot = (unsigned)u, m->slot_given = 1;
        } else {
            return fake_cfg_fail(err, errlen, path, line, "unknown mig key '%s' (known: %s)", key, FAKE_GPU_MIG_KEYS);
        }
    }
    if (t < 0)
        return -1;
    const char *missing = !m->parent_uuid[0] ? "parent" : !m->uuid[0] ? "uuid" : !m->profile[0] ? "profile"
                        : !m->memory_bytes ? "memory_mib" : !m->sms ? "sms" : NULL;
    if (missing)
        return fake_cfg_fail(err, errlen, path, line, "mig line without %s (needs parent, uuid, profile, memory_mib, "
                             "sms)%s", missing, "");
    cfg->mig_count++;
    return 0;
}

static inline int fake_mig_slot_used(const struct fake_gpu_config *cfg, unsigned slot, unsigned migs_before)
{
    for (unsigned i = 0; i < cfg->gpu_count; i++)
        if (cfg->gpus[i].slot == slot)
            return 1;
    for (unsigned k = 0; k < migs_before; k++)
        if (cfg->migs[k].slot == slot)
            return 1;
    return 0;
}

/* After the whole file: parents, slots, and what cannot be (a MIG device of a GPU whose MIG mode is not enabled,
 * two with one uuid or one GPU/compute instance pair, more memory than the GPU has). 0 or -1 with err filled. */
static inline int fake_mig_finish(struct fake_gpu_config *cfg, char *err, size_t errlen, const char *path)
{
    for (unsigned k = 0; k < cfg->mig_count; k++) {
        struct fake_mig_info *m = &cfg->migs[k];
        unsigned p = cfg->gpu_count;
        for (unsigned i = 0; i < cfg->gpu_count; i++)
            if (!strcmp(cfg->gpus[i].uuid, m->parent_uuid))
                p = i;
        if (p == cfg->gpu_count)
            return fake_cfg_fail(err, errlen, path, m->line, "parent %s is not a gpu line of this config%s",
                                 m->parent_uuid, "");
        if (cfg->gpus[p].mig_current != 1)
            return fake_cfg_fail(err, errlen, path, m->line, "GPU %s has MIG devices but its current MIG mode is "
                                 "not enabled: add mig=1 to its gpu line%s", m->parent_uuid, "");
        m->parent = p;
        if (!m->slot_given) {
            unsigned s = 0;
            while (s < FAKE_GPU_MAX_GPUS && fake_mig_slot_used(cfg, s, k))
                s++;
            if (s == FAKE_GPU_MAX_GPUS)
                return fake_cfg_fail(err, errlen, path, m->line, "no free state slot for this MIG device (GPUs and "
                                     "MIG devices share %s slots)%s", "16", "");
            m->slot = s;
        } else if (fake_mig_slot_used(cfg, m->slot, k)) {
            char slot[16];
            snprintf(slot, sizeof slot, "%u", m->slot);
            return fake_cfg_fail(err, errlen, path, m->line, "slot %s is taken by a GPU or an earlier MIG device%s",
                                 slot, "");
        }
        uint64_t total = m->memory_bytes;
        for (unsigned j = 0; j < k; j++) {
            const struct fake_mig_info *o = &cfg->migs[j];
            if (!strcmp(o->uuid, m->uuid))
                return fake_cfg_fail(err, errlen, path, m->line, "uuid %s is also the MIG device's on an earlier "
                                     "line%s", m->uuid, "");
            if (o->parent == p && o->gi == m->gi && o->ci == m->ci)
                return fake_cfg_fail(err, errlen, path, m->line, "GPU %s already has a MIG device with these gi and "
                                     "ci%s", m->parent_uuid, "");
            if (o->parent == p)
                total += o->memory_bytes;
        }
        if (total > cfg->gpus[p].memory_bytes)
            return fake_cfg_fail(err, errlen, path, m->line, "the MIG devices of GPU %s hold more memory than it "
                                 "has%s", m->parent_uuid, "");
    }
    return 0;
}

/* MIG device k as a device of its own: its uuid, memory, SMs and state slot; the parent's PCI location, minor,
 * compute capability; NVML's name for it ("<GPU name> MIG <profile>"). */
static inline void fake_mig_as_gpu(const struct fake_gpu_config *cfg, unsigned k, struct fake_gpu_info *out)
{
    const struct fake_mig_info *m = &cfg->migs[k];
    *out = cfg->gpus[m->parent];
    snprintf(out->uuid, sizeof out->uuid, "%s", m->uuid);
    char name[FAKE_GPU_NAME_LEN + FAKE_GPU_PROFILE_LEN + 8];
    snprintf(name, sizeof name, "%s MIG %s", cfg->gpus[m->parent].name, m->profile);
    snprintf(out->name, sizeof out->name, "%.*s", (int)sizeof out->name - 1, name);
    out->memory_bytes = m->memory_bytes;
    out->reserved_bytes = 0;
    out->sms = m->sms;
    out->slot = m->slot;
    out->mig_current = out->mig_pending = -1;
}

#endif /* FAKE_GPU_MIG_CONFIG_H */
