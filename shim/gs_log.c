/* stderr logging: one write(2) per message so lines from threads and processes do not interleave. */
#include "gs_log.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gpushare_contract.h"

int gs_log_level = GS_LOG_WARN;

static const char *const level_names[] = {"error", "error", "warning", "info", "debug"};

void gs_log_init(void)
{
    const char *v = getenv(GS_ENV_LOG_LEVEL);
    if (!v || !*v)
        return;
    if (v[0] >= '0' && v[0] <= '4' && v[1] == '\0') {
        gs_log_level = v[0] - '0';
        return;
    }
    gs_log(GS_LOG_WARN, "%s=%s is not a log level 0..4; using %d", GS_ENV_LOG_LEVEL, v, gs_log_level);
}

void gs_log(int level, const char *fmt, ...)
{
    if (level > gs_log_level && level != GS_LOG_ERROR)
        return;
    char buf[1024];
    int n = snprintf(buf, sizeof buf, "[gpushare] %s (pid %d): ", level_names[level], (int)getpid());
    va_list ap;
    va_start(ap, fmt);
    int m = vsnprintf(buf + n, sizeof buf - (size_t)n - 1, fmt, ap);
    va_end(ap);
    size_t len = (size_t)n + (m < 0 ? 0 : (size_t)m);
    if (len > sizeof buf - 2)
        len = sizeof buf - 2;
    buf[len++] = '\n';
    ssize_t rc = write(STDERR_FILENO, buf, len);
    (void)rc;
}
