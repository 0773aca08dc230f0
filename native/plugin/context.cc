// Plugin contexts: init (knobs, the shared-memory file, pools, registry) and finalize.
// Nothing here is on the hot path; init/finalize may allocate, lock and make syscalls.
//
// Lifetime: NCCL may call back after finalize (late proxy/KernelCh events) with handles
// that name a context. A finalized context is therefore never freed at once: it is
// marked dead (callbacks then count and ignore), kept mapped, and reclaimed by a later
// init only after kQuarantineNs. Registry entries are reused with a new incarnation, so
// a handle from before the reuse no longer decodes to a live context.
#include <cerrno>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <pthread.h>
#include <new>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "context.h"

namespace mycroft::plugin {

std::atomic<uint64_t> g_null_handles{0};
std::atomic<uint64_t> g_foreign_ops{0};
std::atomic<int> g_pid{0};

namespace {

std::atomic<Context*> g_registry[kMaxContexts];
uint8_t g_incarnation[kMaxContexts];  // guarded by g_mutex
pthread_mutex_t g_mutex = PTHREAD_MUTEX_INITIALIZER;
uint32_t g_cursor = 0;                // guarded by g_mutex
Context* g_retired = nullptr;         // guarded by g_mutex

#define MLOG(c_logfn, level, ...)                                                        \
  do {                                                                                   \
    if (c_logfn) (c_logfn)(level, abi::kLogProfile | abi::kLogInit, __FILE__, __LINE__, __VA_ARGS__); \
  } while (0)

// Pools come from aligned_alloc + placement new (no operator new: the plugin links no C++
// runtime symbols it would then have to export or hide).
template <class T>
T* NewArray(size_t n) {
  constexpr size_t kAlign = alignof(T) > 16 ? alignof(T) : 16;
  size_t bytes = (n * sizeof(T) + kAlign - 1) / kAlign * kAlign;
  void* p = aligned_alloc(kAlign, bytes);
  if (p == nullptr) return nullptr;
  memset(p, 0, bytes);
  T* a = static_cast<T*>(p);
  for (size_t i = 0; i < n; ++i) new (a + i) T();
  return a;
}

struct Lock {
  Lock() { pthread_mutex_lock(&g_mutex); }
  ~Lock() { pthread_mutex_unlock(&g_mutex); }
};

// fork() copies g_mutex as it is: taken by a thread in init/finalize, it would stay
// taken forever in the child (which has only the forking thread), and the child's first
// communicator init would hang. So fork waits for the lock (prepare) and both sides
// release it afterwards. No allocation here: the handlers run inside fork().
void ForkPrepare() { pthread_mutex_lock(&g_mutex); }
void ForkRelease() { pthread_mutex_unlock(&g_mutex); }
__attribute__((constructor)) void RegisterForkHandlers() {
  pthread_atfork(ForkPrepare, ForkRelease, ForkRelease);
}

void FreeContext(Context* c) {
  if (c->map != nullptr) munmap(c->map, c->map_size);
  free(c->slots);  // trivially destructible pool entries
  free(c->proxy);
  free(c->api);
  free(c->p2p_counts);
  free(c);
}

// Frees retired contexts whose quarantine is over. Caller holds g_mutex.
void ReclaimLocked(uint64_t now) {
  Context** pp = &g_retired;
  while (*pp != nullptr) {
    Context* c = *pp;
    if (now - c->finalized_at >= kQuarantineNs) {
      *pp = c->next_retired;
      g_registry[c->index].store(nullptr, std::memory_order_release);
      FreeContext(c);
    } else {
      pp = &c->next_retired;
    }
  }
}

bool RegisterLocked(Context* c) {
  for (uint32_t i = 0; i < kMaxContexts; ++i) {
    uint32_t idx = (g_cursor + i) % (kMaxContexts - 1);  // 0xffff is reserved (foreign handles)
    if (g_registry[idx].load(std::memory_order_relaxed) == nullptr) {
      c->index = idx;
      c->inc = ++g_incarnation[idx];
      g_cursor = idx + 1;
      g_registry[idx].store(c, std::memory_order_release);
      return true;
    }
  }
  return false;
}

void CopyName(char* dst, size_t len, const char* src) {
  if (src == nullptr) src = "";
  size_t n = strnlen(src, len - 1);
  memcpy(dst, src, n);
  dst[n] = '\0';
}

int EnvInt(const char* name) {
  long long v;
  const char* s = getenv(name);
  if (s != nullptr && ParseInt(s, 0, 1 << 30, &v)) return int(v);
  return -1;
}

// The CUDA device this rank most likely uses: the only entry of CUDA_VISIBLE_DEVICES,
// or its LOCAL_RANK-th entry, or LOCAL_RANK when the variable is unset.
int CudaDevice(int local_rank) {
  const char* cvd = getenv("CUDA_VISIBLE_DEVICES");
  if (cvd == nullptr) return local_rank;
  char buf[256];
  snprintf(buf, sizeof(buf), "%s", cvd);
  int entries[64];
  int n = 0;
  for (char* save = nullptr, *tok = strtok_r(buf, ",", &save); tok != nullptr && n < 64;
       tok = strtok_r(nullptr, ",", &save)) {
    long long v;
    entries[n++] = ParseInt(tok, 0, 1 << 20, &v) ? int(v) : -1;
  }
  if (n == 1) return entries[0];
  if (local_rank >= 0 && local_rank < n) return entries[local_rank];
  return -1;
}

void SanitizeForFile(const char* in, char* out, size_t len) {
  size_t j = 0;
  for (size_t i = 0; in[i] != '\0' && j + 1 < len; ++i) {
    char ch = in[i];
    bool ok = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') || ch == '.' ||
              ch == '_' || ch == '-';
    out[j++] = ok ? ch : '_';
  }
  out[j] = '\0';
  if (j == 0) snprintf(out, len, "host");
}

// The symbolic name of the errno values init can meet, so a message says "ENOSPC" and
// not only the locale's sentence.
const char* ErrnoName(int e) {
  switch (e) {
    case ENOSPC: return "ENOSPC";
    case EDQUOT: return "EDQUOT";
    case EFBIG: return "EFBIG";
    case ENOMEM: return "ENOMEM";
    case EACCES: return "EACCES";
    case EPERM: return "EPERM";
    case EROFS: return "EROFS";
    case EEXIST: return "EEXIST";
    case ENOENT: return "ENOENT";
    case ENOTDIR: return "ENOTDIR";
    case ELOOP: return "ELOOP";
    case EMFILE: return "EMFILE";
    case ENFILE: return "ENFILE";
    case EIO: return "EIO";
    case ENODEV: return "ENODEV";
    default: return "errno";
  }
}

// mkdir -p; the last component 0700, missing parents 0755.
bool MakeDirs(const char* dir, char* err, size_t err_len) {
  char path[512];
  snprintf(path, sizeof(path), "%s", dir);
  size_t n = strlen(path);
  while (n > 1 && path[n - 1] == '/') path[--n] = '\0';
  for (size_t i = 1; i <= n; ++i) {
    if (path[i] == '/' || path[i] == '\0') {
      char saved = path[i];
      path[i] = '\0';
      bool last = (saved == '\0');
      if (mkdir(path, last ? 0700 : 0755) != 0 && errno != EEXIST) {
        snprintf(err, err_len, "cannot create MYCROFT_RING_DIR component %s: %s (%s)", path, strerror(errno),
                 ErrnoName(errno));
        return false;
      }
      path[i] = saved;
    }
  }
  return true;
}

// Opens the ring directory and checks it is this user's own: a directory itself (lstat:
// a planted symlink would send our files, and the agent's reads, elsewhere), owned by
// the effective uid (another user's directory would let them replace or read our
// files), not writable by group or others. The checks run on the opened descriptor, and
// files are then created relative to it, so a rename of the path after the check does
// not redirect them. Returns the descriptor, or -1 with `err` naming the problem.
int OpenRingDir(const char* dir, char* err, size_t err_len) {
  if (!MakeDirs(dir, err, err_len)) return -1;
  struct stat ls;
  if (lstat(dir, &ls) != 0) {
    snprintf(err, err_len, "MYCROFT_RING_DIR %s: %s (%s)", dir, strerror(errno), ErrnoName(errno));
    return -1;
  }
  if (S_ISLNK(ls.st_mode)) {
    snprintf(err, err_len, "MYCROFT_RING_DIR %s is a symbolic link; refusing it (point MYCROFT_RING_DIR at a "
             "directory you own)", dir);
    return -1;
  }
  int fd = open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) {
    snprintf(err, err_len, "MYCROFT_RING_DIR %s cannot be opened as a directory: %s (%s)", dir, strerror(errno),
             ErrnoName(errno));
    return -1;
  }
  struct stat st;
  const uid_t me = geteuid();
  if (fstat(fd, &st) != 0 || !S_ISDIR(st.st_mode)) {
    snprintf(err, err_len, "MYCROFT_RING_DIR %s is not a directory", dir);
  } else if (st.st_uid != me) {
    snprintf(err, err_len, "MYCROFT_RING_DIR %s is owned by uid %u, not by this process's uid %u; refusing it "
             "(the default is per user: /dev/shm/mycroft-otel-<uid>)", dir, unsigned(st.st_uid), unsigned(me));
  } else if ((st.st_mode & (S_IWGRP | S_IWOTH)) != 0) {
    snprintf(err, err_len, "MYCROFT_RING_DIR %s is writable by group or others (mode %03o); refusing it "
             "(chmod go-w it)", dir, unsigned(st.st_mode & 0777));
  } else {
    return fd;
  }
  close(fd);
  return -1;
}

// Reserves every byte of the file. tmpfs (and most file systems) accept a sparse size
// from ftruncate; a store to a page that cannot be backed later raises SIGBUS inside
// NCCL's threads. posix_fallocate makes the file system say ENOSPC now instead.
// Returns 0 or an errno value.
int ReserveFile(int fd, uint64_t size) {
  int rc;
  do {
    rc = posix_fallocate(fd, 0, off_t(size));
  } while (rc == EINTR);
  if (rc == EOPNOTSUPP || rc == ENOSYS || rc == EINVAL) {
    // No fallocate on this file system: write the zeros (write() reports ENOSPC, a store
    // through the mapping could not).
    static const char kZeros[1 << 16] = {};
    uint64_t off = 0;
    rc = 0;
    while (off < size) {
      size_t n = size - off < sizeof(kZeros) ? size_t(size - off) : sizeof(kZeros);
      ssize_t w = pwrite(fd, kZeros, n, off_t(off));
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) {
        rc = w < 0 ? errno : ENOSPC;
        break;
      }
      off += uint64_t(w);
    }
  }
  if (rc != 0) return rc;
  // A file system that keeps written zeros sparse (compression, dedup) leaves pages a
  // store could still fail to back: refuse rather than map it.
  struct stat st;
  if (fstat(fd, &st) != 0) return errno;
  if (uint64_t(st.st_size) < size || uint64_t(st.st_blocks) * 512u < size) return ENOSPC;
  return 0;
}

// Leftover files of processes that are gone, when no agent removed them (none runs, or
// it is behind): bounded by age, count and bytes. Only this user's regular files named
// *.mycroft whose header names a writer pid that no longer exists are candidates; a
// file younger than kLeftoverMinAgeNs is kept whatever the bounds (its evidence may be
// on its way to an agent). Runs at init, off the hot path; bounded by kLeftoverScan.
constexpr uint64_t kLeftoverMaxAgeNs = 600ull * 1000000000ull;  // the agent ignores dead rings this old too
constexpr uint64_t kLeftoverMinAgeNs = 60ull * 1000000000ull;
constexpr uint32_t kLeftoverMaxFiles = 64;
constexpr uint64_t kLeftoverMaxBytes = 256ull << 20;
constexpr uint32_t kLeftoverScan = 4096;

struct Leftover {
  char name[256];
  uint64_t age_ns;
  uint64_t bytes;
  dev_t dev;
  ino_t ino;
};

bool PidGone(int32_t pid) {
  if (pid <= 0) return false;  // unknown writer: keep
  if (pid == getpid()) return false;
  return kill(pid, 0) != 0 && errno == ESRCH;
}

// The writer pid in our own file name (<host>-<pid>-<hash:016x>-r<rank>[-k].mycroft), or -1.
// Used only to skip files cheaply (a live pid, or our own): a name cannot make a file go.
int32_t PidFromName(const char* name) {
  char buf[256];
  snprintf(buf, sizeof(buf), "%s", name);
  char* end = strstr(buf, ".mycroft");
  if (end == nullptr) return -1;
  *end = '\0';
  char* r = strstr(buf, "-r");  // "-r<rank>": the pid and the hash are before it
  for (char* q = r; q != nullptr; q = strstr(q + 1, "-r")) r = q;
  if (r == nullptr || r - buf < 19) return -1;
  *r = '\0';
  char* hash = strrchr(buf, '-');
  if (hash == nullptr || hash == buf) return -1;
  *hash = '\0';
  char* pid = strrchr(buf, '-');
  long long v;
  if (pid == nullptr || !ParseInt(pid + 1, 1, INT32_MAX, &v)) return -1;
  return int32_t(v);
}

bool EndsWith(const char* s, const char* suffix) {
  size_t n = strlen(s), m = strlen(suffix);
  return n >= m && memcmp(s + n - m, suffix, m) == 0;
}

uint32_t CleanLeftovers(int dirfd) {
  int fd2 = dup(dirfd);
  if (fd2 < 0) return 0;
  DIR* d = fdopendir(fd2);
  if (d == nullptr) {
    close(fd2);
    return 0;
  }
  Leftover* dead = static_cast<Leftover*>(calloc(kLeftoverScan, sizeof(Leftover)));
  if (dead == nullptr) {
    closedir(d);
    return 0;
  }
  const uid_t me = geteuid();
  const uint64_t now = NowNs();
  uint32_t n = 0, removed = 0, scanned = 0;
  while (dirent* e = readdir(d)) {
    if (++scanned > kLeftoverScan || n >= kLeftoverScan) break;
    if (e->d_name[0] == '.' || !EndsWith(e->d_name, ".mycroft") || strlen(e->d_name) >= sizeof(dead[0].name))
      continue;
    int32_t named = PidFromName(e->d_name);  // a job's own live files: one kill(), no open
    if (named > 0 && !PidGone(named)) continue;
    struct stat st;
    if (fstatat(dirfd, e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(st.st_mode) || st.st_uid != me)
      continue;
    int fd = openat(dirfd, e->d_name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) continue;
    shm::ShmHeader h;
    bool ok = pread(fd, &h, sizeof(h), 0) == ssize_t(sizeof(h));
    close(fd);
    if (!ok || h.magic != shm::kMagic || !PidGone(h.pid)) continue;
    uint64_t last = h.start_mono_ns;
    if (h.heartbeat_ns > last) last = h.heartbeat_ns;
    if (h.finalized_ns > last) last = h.finalized_ns;
    Leftover& L = dead[n++];
    snprintf(L.name, sizeof(L.name), "%s", e->d_name);
    L.age_ns = now > last ? now - last : 0;
    L.bytes = uint64_t(st.st_size);
    L.dev = st.st_dev;
    L.ino = st.st_ino;
  }
  closedir(d);
  // Oldest first (insertion sort: n is small and this is init).
  for (uint32_t i = 1; i < n; ++i) {
    Leftover tmp = dead[i];
    uint32_t j = i;
    for (; j > 0 && dead[j - 1].age_ns < tmp.age_ns; --j) dead[j] = dead[j - 1];
    dead[j] = tmp;
  }
  uint64_t bytes = 0;
  for (uint32_t i = 0; i < n; ++i) bytes += dead[i].bytes;
  uint32_t left = n;
  for (uint32_t i = 0; i < n; ++i) {
    const Leftover& L = dead[i];
    bool over = left > kLeftoverMaxFiles || bytes > kLeftoverMaxBytes;
    if (!(L.age_ns >= kLeftoverMaxAgeNs || (over && L.age_ns >= kLeftoverMinAgeNs))) continue;
    struct stat st;  // still the file we judged (not replaced meanwhile)
    if (fstatat(dirfd, L.name, &st, AT_SYMLINK_NOFOLLOW) != 0 || st.st_dev != L.dev || st.st_ino != L.ino) continue;
    if (unlinkat(dirfd, L.name, 0) == 0) {
      ++removed;
      --left;
      bytes -= L.bytes;
    }
  }
  free(dead);
  return removed;
}

bool CreateShm(Context* c, const Config& cfg, const char* host, uint64_t comm_hash, int rank, char* err,
               size_t err_len) {
  int dirfd = OpenRingDir(cfg.ring_dir, err, err_len);
  if (dirfd < 0) return false;
  uint32_t cleaned = CleanLeftovers(dirfd);
  if (cleaned > 0)
    MLOG(c->logfn, abi::LogLevel::Info, "mycroft-otel: removed %u leftover ring file(s) of exited processes from %s",
         cleaned, cfg.ring_dir);
  char fhost[shm::kNameLen];
  SanitizeForFile(host, fhost, sizeof(fhost));
  uint64_t size = shm::FileSize(cfg.live_slots, cfg.ring_records);
  int fd = -1;
  char name[256];
  for (int k = 0; k < 1000 && fd < 0; ++k) {
    if (k == 0) {
      snprintf(name, sizeof(name), "%s-%d-%016llx-r%d.mycroft", fhost, int(getpid()), (unsigned long long)comm_hash,
               rank);
    } else {
      snprintf(name, sizeof(name), "%s-%d-%016llx-r%d-%d.mycroft", fhost, int(getpid()),
               (unsigned long long)comm_hash, rank, k);
    }
    snprintf(c->path, sizeof(c->path), "%s/%s", cfg.ring_dir, name);
    fd = openat(dirfd, name, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0 && errno != EEXIST) {
      snprintf(err, err_len, "cannot create %s: %s (%s)", c->path, strerror(errno), ErrnoName(errno));
      close(dirfd);
      return false;
    }
  }
  if (fd < 0) {
    snprintf(err, err_len, "no free file name for %s", c->path);
    close(dirfd);
    return false;
  }
  if (int rc = ReserveFile(fd, size); rc != 0) {
    snprintf(err, err_len, "cannot reserve %llu bytes for %.400s: %s (%s); the file system of MYCROFT_RING_DIR=%.300s is "
             "full or too small (remove old *.mycroft files, enlarge it, or lower MYCROFT_LIVE_SLOTS / "
             "MYCROFT_RING_RECORDS)", (unsigned long long)size, c->path, strerror(rc), ErrnoName(rc), cfg.ring_dir);
    close(fd);
    unlinkat(dirfd, name, 0);
    close(dirfd);
    return false;
  }
  // MAP_POPULATE: fault every page in now so the hot path never takes a page fault
  // (every page is backed: ReserveFile).
  void* m = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
  int map_errno = errno;
  close(fd);
  if (m == MAP_FAILED) {
    snprintf(err, err_len, "mmap %s: %s (%s)", c->path, strerror(map_errno), ErrnoName(map_errno));
    unlinkat(dirfd, name, 0);
    close(dirfd);
    return false;
  }
  close(dirfd);
  c->map = m;
  c->map_size = size;
  c->hdr = static_cast<shm::ShmHeader*>(m);
  c->live = reinterpret_cast<shm::LiveOp*>(static_cast<char*>(m) + shm::LiveOffset());
  c->ring = reinterpret_cast<shm::RingRecord*>(static_cast<char*>(m) + shm::RingOffset(cfg.live_slots));
  c->live_slots = cfg.live_slots;
  c->ring_cap = cfg.ring_records;
  return true;
}

}  // namespace

Context* LookupContext(uint32_t index, uint32_t inc) {
  if (index >= kMaxContexts) return nullptr;
  Context* c = g_registry[index].load(std::memory_order_acquire);
  if (c == nullptr || (c->inc & 0xff) != inc) return nullptr;
  return c;
}

Result CoreInit(int abi_version, void** context, int* mask, const char* comm_name, uint64_t comm_hash,
                uint64_t comm_id, int n_nodes, int nranks, int rank, abi::DebugLogger logfn) {
  if (context == nullptr) return Result::InvalidArgument;
  *context = nullptr;
  if (nranks <= 0 || nranks > (1 << 24) || rank < 0 || rank >= nranks) {
    MLOG(logfn, abi::LogLevel::Warn, "mycroft-otel: bad init arguments (rank %d of %d); profiler disabled", rank,
         nranks);
    return Result::InvalidArgument;
  }
  Config cfg;
  char err[1024] = "";
  if (!LoadConfig(&cfg, err, sizeof(err))) {
    MLOG(logfn, abi::LogLevel::Warn, "mycroft-otel: %s; profiler disabled for this communicator", err);
    return Result::InvalidUsage;
  }
  if (!cfg.enable) {
    MLOG(logfn, abi::LogLevel::Info, "mycroft-otel: disabled by MYCROFT_ENABLE");
    return Result::InvalidUsage;
  }
  int want = 0;
  const int nccl_version = NcclVersion();
  if (!RequestedMask(abi_version, nccl_version, &want, err, sizeof(err))) {  // mask.cc
    MLOG(logfn, abi::LogLevel::Warn, "mycroft-otel: %s; profiler disabled for this communicator", err);
    return Result::InvalidUsage;
  }

  Context* c = NewArray<Context>(1);
  if (c == nullptr) return Result::SystemError;
  c->abi_version = abi_version;
  c->rank = rank;
  c->nranks = nranks;
  c->pid = getpid();
  g_pid.store(int(c->pid), std::memory_order_relaxed);
  c->logfn = logfn;

  char host[shm::kNameLen];
  const char* hostid = getenv("NCCL_HOSTID");
  if (hostid != nullptr && hostid[0] != '\0') {
    CopyName(host, sizeof(host), hostid);
  } else if (gethostname(host, sizeof(host)) != 0) {
    snprintf(host, sizeof(host), "localhost");
  }
  host[sizeof(host) - 1] = '\0';

  if (!CreateShm(c, cfg, host, comm_hash, rank, err, sizeof(err))) {
    MLOG(logfn, abi::LogLevel::Warn, "mycroft-otel: %s; profiler disabled for this communicator", err);
    FreeContext(c);
    return Result::SystemError;
  }
  c->n_proxy = cfg.live_slots * 16u;  // 16 per slot: StartProxyOp scans from the op's band
  if (c->n_proxy < 256) c->n_proxy = 256;
  if (c->n_proxy > kMaxProxyEntries) c->n_proxy = kMaxProxyEntries;
  c->slots = NewArray<SlotCtl>(c->live_slots);
  c->proxy = NewArray<ProxyEntry>(c->n_proxy);
  c->api = NewArray<ApiEntry>(kApiEntries);
  c->p2p_counts = NewArray<std::atomic<uint64_t>>(size_t(nranks) * 2);
  if (c->slots == nullptr || c->proxy == nullptr || c->api == nullptr || c->p2p_counts == nullptr) {
    MLOG(logfn, abi::LogLevel::Warn, "mycroft-otel: out of memory; profiler disabled");
    unlink(c->path);
    FreeContext(c);
    return Result::SystemError;
  }
  for (size_t i = 0; i < size_t(nranks) * 2; ++i) c->p2p_counts[i].store(0, std::memory_order_relaxed);
  for (uint32_t s = 0; s < c->live_slots; ++s)
    for (int w = 0; w < 4; ++w) {
      c->slots[s].kch_started_bits[w].store(0, std::memory_order_relaxed);
      c->slots[s].kch_stopped_bits[w].store(0, std::memory_order_relaxed);
    }

  if (mask != nullptr) __atomic_store_n(mask, want, __ATOMIC_RELAXED);

  // Header (the file is fresh: all zero). Magic last, with release: a reader that sees
  // the magic sees a complete header.
  shm::ShmHeader* h = c->hdr;
  h->layout_version = shm::kLayoutVersion;
  h->header_size = sizeof(shm::ShmHeader);
  h->live_slots = c->live_slots;
  h->ring_capacity = c->ring_cap;
  h->live_offset = uint32_t(shm::LiveOffset());
  h->ring_offset = uint32_t(shm::RingOffset(c->live_slots));
  h->file_size = c->map_size;
  CopyName(h->job_id, sizeof(h->job_id), cfg.job_id);
  CopyName(h->comm_name, sizeof(h->comm_name), comm_name);
  CopyName(h->host, sizeof(h->host), host);
  CopyName(h->plugin_version, sizeof(h->plugin_version), kPluginVersion);
  h->comm_hash = comm_hash;
  h->comm_id = comm_id;
  h->rank = rank;
  h->nranks = nranks;
  h->nnodes = n_nodes;
  h->global_rank = EnvInt("RANK");
  h->local_rank = EnvInt("LOCAL_RANK");
  h->cuda_device = CudaDevice(h->local_rank);
  h->pid = int32_t(c->pid);
  h->abi_version = uint32_t(abi_version);
  h->activation_mask = want;
  h->nccl_version = uint32_t(nccl_version);
  h->start_realtime_ns = RealtimeNs();
  h->start_mono_ns = NowNs();
  h->heartbeat_ns = h->start_mono_ns;
  for (uint32_t s = 0; s < c->live_slots; ++s) c->live[s].generation = 0;
  StRel(h->magic, shm::kMagic);

  {
    Lock lock;
    ReclaimLocked(MonoNs());
    if (!RegisterLocked(c)) {
      MLOG(logfn, abi::LogLevel::Warn, "mycroft-otel: more than %u live contexts; profiler disabled", kMaxContexts);
      unlink(c->path);
      FreeContext(c);
      return Result::SystemError;
    }
  }
  c->alive.store(1, std::memory_order_release);
  *context = MakeHandle(kHCtx, c->index, c->inc, 0);
  MLOG(logfn, abi::LogLevel::Info, "mycroft-otel: profiler v%d rank %d/%d comm %016llx -> %s (%llu bytes)",
       abi_version, rank, nranks, (unsigned long long)comm_hash, c->path, (unsigned long long)c->map_size);
  return Result::Success;
}

Result CoreFinalize(void* context) {
  Decoded d;
  if (!DecodeHandle(context, &d) || d.kind != kHCtx) return Result::Success;
  Context* c = LookupContext(d.ctx, d.inc);
  if (c == nullptr) return Result::Success;
  Lock lock;
  if (c->alive.exchange(0, std::memory_order_acq_rel) == 0) return Result::Success;  // second finalize
  uint64_t now = NowNs();
  // Operations still in flight: publish them as aborted so their last state survives.
  for (uint32_t s = 0; s < c->live_slots; ++s) {
    shm::LiveOp& L = c->live[s];
    uint32_t g = LdAcq(L.generation);
    if ((g & 3) == 2) {
      PublishOp(c, s, shm::kFlagAborted, 0);
      FreeSlot(c, s);
    }
  }
  StRel(c->hdr->finalized_ns, now);
  c->finalized_at = MonoNs();
  c->next_retired = g_retired;
  g_retired = c;
  ReclaimLocked(c->finalized_at);
  return Result::Success;
}

}  // namespace mycroft::plugin
