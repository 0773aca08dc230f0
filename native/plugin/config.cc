// MYCROFT_* knobs the plugin reads (the ones marked "plugin" in mycroft_otel/config.py,
// same names, defaults and ranges). Read once per init; a bad value fails init with a
// message naming the variable, so NCCL logs it and runs without the plugin.
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <strings.h>
#include <unistd.h>

#include "internal.h"

namespace mycroft::plugin {

namespace {

// Copies `s` without leading/trailing blanks into buf.
void Strip(const char* s, char* buf, size_t len) {
  while (*s && isspace(static_cast<unsigned char>(*s))) ++s;
  size_t n = strlen(s);
  while (n > 0 && isspace(static_cast<unsigned char>(s[n - 1]))) --n;
  if (n >= len) n = len - 1;
  memcpy(buf, s, n);
  buf[n] = '\0';
}

bool IntVar(const char* name, long long lo, long long hi, uint32_t* out, char* err, size_t err_len) {
  const char* raw = getenv(name);
  if (raw == nullptr) return true;
  long long v = 0;
  if (!ParseInt(raw, lo, hi, &v)) {
    snprintf(err, err_len, "%s='%s' is not an integer in [%lld, %lld]", name, raw, lo, hi);
    return false;
  }
  *out = static_cast<uint32_t>(v);
  return true;
}

}  // namespace

bool ParseInt(const char* s, long long lo, long long hi, long long* out) {
  if (s == nullptr) return false;
  char buf[64];
  if (strlen(s) >= sizeof(buf)) return false;
  Strip(s, buf, sizeof(buf));
  const char* p = buf;
  if (*p == '+' || *p == '-') ++p;
  if (*p == '\0') return false;
  for (const char* q = p; *q; ++q)
    if (!isdigit(static_cast<unsigned char>(*q))) return false;
  errno = 0;
  char* end = nullptr;
  long long v = strtoll(buf, &end, 10);
  if (errno != 0 || end == buf || *end != '\0') return false;
  if (v < lo || v > hi) return false;
  *out = v;
  return true;
}

bool LoadConfig(Config* cfg, char* err, size_t err_len) {
  *cfg = Config();
  // Per-user default (mycroft_otel/config.py: default_ring_dir): one shared directory
  // would belong to whichever user created it first and refuse every other user.
  snprintf(cfg->ring_dir, sizeof(cfg->ring_dir), "/dev/shm/mycroft-otel-%u", unsigned(geteuid()));
  if (const char* raw = getenv("MYCROFT_ENABLE")) {
    char v[32];
    Strip(raw, v, sizeof(v));
    if (!strcasecmp(v, "1") || !strcasecmp(v, "true") || !strcasecmp(v, "yes") || !strcasecmp(v, "on")) {
      cfg->enable = true;
    } else if (!strcasecmp(v, "0") || !strcasecmp(v, "false") || !strcasecmp(v, "no") ||
               !strcasecmp(v, "off") || v[0] == '\0') {
      cfg->enable = false;
    } else {
      snprintf(err, err_len, "MYCROFT_ENABLE='%s' is not a boolean (1/0/true/false)", raw);
      return false;
    }
  }
  if (!IntVar("MYCROFT_LIVE_SLOTS", 1, 4096, &cfg->live_slots, err, err_len)) return false;
  if (!IntVar("MYCROFT_RING_RECORDS", 16, 65536, &cfg->ring_records, err, err_len)) return false;
  if (const char* raw = getenv("MYCROFT_RING_DIR")) {
    char v[sizeof(cfg->ring_dir)];
    if (strlen(raw) >= sizeof(v)) {
      snprintf(err, err_len, "MYCROFT_RING_DIR is longer than %zu bytes", sizeof(v) - 1);
      return false;
    }
    Strip(raw, v, sizeof(v));
    if (v[0] != '\0') {
      if (v[0] != '/') {
        snprintf(err, err_len, "MYCROFT_RING_DIR='%s' must be an absolute path", raw);
        return false;
      }
      memcpy(cfg->ring_dir, v, sizeof(v));
    }
  }
  // Job id: MYCROFT_JOB_ID, else the first launcher variable that is set (config.job_id()).
  static const char* const kJobVars[] = {"MYCROFT_JOB_ID", "TORCHELASTIC_RUN_ID", "SLURM_JOB_ID", "PBS_JOBID",
                                         "LSB_JOBID",      "JOB_ID",              "FLUX_JOB_ID"};
  for (const char* name : kJobVars) {
    const char* v = getenv(name);
    if (v != nullptr && v[0] != '\0') {
      snprintf(cfg->job_id, sizeof(cfg->job_id), "%s", v);
      break;
    }
  }
  return true;
}

}  // namespace mycroft::plugin
