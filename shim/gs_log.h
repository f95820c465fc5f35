/* Messages on stderr, prefixed "[gpushare]", filtered by LIBCUDA_LOG_LEVEL with HAMi-core's numbers:
 * errors always, warnings from 2 (the default), info from 3, debug at 4. */
#ifndef GS_LOG_H
#define GS_LOG_H

#define GS_LOG_ERROR 0
#define GS_LOG_WARN 2
#define GS_LOG_INFO 3
#define GS_LOG_DEBUG 4

extern int gs_log_level;

/* Read LIBCUDA_LOG_LEVEL once; a bad value is reported and the default kept. */
void gs_log_init(void);
void gs_log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define GS_ERROR(...) gs_log(GS_LOG_ERROR, __VA_ARGS__)
#define GS_WARN(...) do { if (gs_log_level >= GS_LOG_WARN) gs_log(GS_LOG_WARN, __VA_ARGS__); } while (0)
#define GS_INFO(...) do { if (gs_log_level >= GS_LOG_INFO) gs_log(GS_LOG_INFO, __VA_ARGS__); } while (0)
#define GS_DEBUG(...) do { if (gs_log_level >= GS_LOG_DEBUG) gs_log(GS_LOG_DEBUG, __VA_ARGS__); } while (0)

#endif /* GS_LOG_H */
