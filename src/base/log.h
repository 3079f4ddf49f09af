/* log — leveled logging to stderr, one line per message, safe from any thread.
 * It does not rotate files or buffer: a node's log is its stderr. */
#ifndef EXO_BASE_LOG_H
#define EXO_BASE_LOG_H

enum log_level { LOG_LEVEL_DEBUG = 0, LOG_LEVEL_INFO = 1, LOG_LEVEL_WARN = 2, LOG_LEVEL_ERROR = 3 };

void log_set_level(enum log_level level);
enum log_level log_get_level(void);
/* Tag printed after the level, e.g. "node" or "runner 3"; copied. */
void log_set_tag(const char *tag);
void log_message(enum log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define log_debug(...) log_message(LOG_LEVEL_DEBUG, __VA_ARGS__)
#define log_info(...) log_message(LOG_LEVEL_INFO, __VA_ARGS__)
#define log_warn(...) log_message(LOG_LEVEL_WARN, __VA_ARGS__)
#define log_error(...) log_message(LOG_LEVEL_ERROR, __VA_ARGS__)

#endif
