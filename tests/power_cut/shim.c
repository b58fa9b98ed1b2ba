/* LD_PRELOAD shim of the power-cut suite (tests/power_cut): records, in order, every operation that
 * changes a file or directory under PCUT_ROOT, with the bytes written, into the trace file
 * PCUT_TRACE, so the suite can rebuild the directory as a power cut at any point would leave it.
 *
 * What is recorded (see trace.rs for the format): file creation (open with O_CREAT on a missing
 * file), O_TRUNC, write/pwrite/writev/pwritev, ftruncate, fsync/fdatasync (a BEGIN when the call
 * starts and an END with its result when it returns: a sync makes durable only what was written
 * before it began, and only once it has returned), rename, unlink, mkdir, rmdir; and every write
 * to the file PCUT_MARKS, which is how the workload marks "acknowledged X" at its exact place in
 * the trace. sync_file_range is no durability promise (no cache flush, no metadata) and is only
 * delayed. Files are named by an id the shim gives each new inode (inode numbers are reused).
 *
 * Every recorded operation runs under one lock, so the trace order is the order the operations
 * took effect. A sync's wait does not hold the lock (other threads go on meanwhile, as on a real
 * disk): it sleeps PCUT_FSYNC_US plus PCUT_FSYNC_US_PER_KB for each KiB written to the file since
 * its last sync, the way a disk takes longer to flush more, which widens race windows.
 * PCUT_FAIL_FSYNC=SUBSTRING:N makes the Nth sync of a path containing SUBSTRING fail with EIO
 * (without syncing), then every later sync of it too, as a failing disk does. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

enum { OP_CREATE = 1, OP_WRITE, OP_TRUNC, OP_SYNC_BEGIN, OP_SYNC_END, OP_RENAME, OP_UNLINK, OP_MKDIR, OP_RMDIR, OP_MARK };

#define MAX_FD 65536
#define BUF (3 * PATH_MAX + 8) /* a joined path */
#define MAX_FILES 65536

struct fd_entry {
    uint32_t fid; /* 0: not traced */
    int is_dir;
    int is_marks;
    int append;
    char *path; /* relative to the root */
};

static struct fd_entry fds[MAX_FD];
static _Atomic int traced_fd[MAX_FD];
/* Bytes written per file id since its last sync began (for the sync delay). */
static uint64_t unsynced[MAX_FILES];
/* Inode number -> file id of its current generation. */
static struct { dev_t dev; ino_t ino; uint32_t fid; } inodes[MAX_FILES];
static uint32_t next_fid = 1;
static uint32_t next_sync = 1;
static int fail_count = -1, fail_seen = 0, failing = 0;
static char fail_substring[256];

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static int active = 0;
static int trace_fd = -1;
static char root[PATH_MAX];
static size_t root_len;
static char marks[PATH_MAX];
static long fsync_us = 0, fsync_us_per_kb = 0;

#define REAL(name) static __typeof__(&name) real_##name; if (!real_##name) real_##name = (__typeof__(&name))dlsym(RTLD_NEXT, #name)

static ssize_t raw_write(int fd, const void *buf, size_t len) {
    REAL(write);
    const char *p = buf;
    while (len > 0) {
        ssize_t n = real_write(fd, p, len);
        if (n < 0) {
            if (errno == EINTR) continue;
            abort();
        }
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

/* A record: op(1) payload_len(4) payload. Called with the lock held. */
static void emit(uint8_t op, const void *a, size_t alen, const void *b, size_t blen) {
    uint8_t head[5];
    uint32_t len = (uint32_t)(alen + blen);
    head[0] = op;
    memcpy(head + 1, &len, 4);
    raw_write(trace_fd, head, 5);
    if (alen) raw_write(trace_fd, a, alen);
    if (blen) raw_write(trace_fd, b, blen);
}

static size_t put_u32(uint8_t *p, uint32_t v) { memcpy(p, &v, 4); return 4; }
static size_t put_u64(uint8_t *p, uint64_t v) { memcpy(p, &v, 8); return 8; }
static size_t put_str(uint8_t *p, const char *s) {
    uint32_t n = (uint32_t)strlen(s);
    memcpy(p, &n, 4);
    memcpy(p + 4, s, n);
    return 4 + n;
}

__attribute__((constructor)) static void init(void) {
    const char *r = getenv("PCUT_ROOT"), *t = getenv("PCUT_TRACE"), *m = getenv("PCUT_MARKS");
    if (!r || !t || !m) return;
    snprintf(root, sizeof root, "%s", r);
    root_len = strlen(root);
    while (root_len > 1 && root[root_len - 1] == '/') root[--root_len] = 0;
    snprintf(marks, sizeof marks, "%s", m);
    const char *us = getenv("PCUT_FSYNC_US"), *per = getenv("PCUT_FSYNC_US_PER_KB"), *fail = getenv("PCUT_FAIL_FSYNC");
    fsync_us = us ? atol(us) : 0;
    fsync_us_per_kb = per ? atol(per) : 0;
    if (fail) {
        const char *colon = strrchr(fail, ':');
        if (colon && (size_t)(colon - fail) < sizeof fail_substring) {
            memcpy(fail_substring, fail, (size_t)(colon - fail));
            fail_count = atoi(colon + 1);
        }
    }
    REAL(open);
    trace_fd = real_open(t, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (trace_fd < 0) abort();
    active = 1;
}

/* The path relative to the root if `path` (absolute, or relative to the cwd or to `dirfd`) is
 * under it; NULL otherwise. Lexical only: the suite passes plain absolute paths. */
static const char *relative(int dirfd, const char *path, char *buf) {
    if (path[0] == '/') {
        snprintf(buf, BUF, "%s", path);
    } else if (dirfd == AT_FDCWD) {
        char cwd[PATH_MAX];
        if (!getcwd(cwd, sizeof cwd)) return NULL;
        snprintf(buf, BUF, "%s/%s", cwd, path);
    } else if (dirfd >= 0 && dirfd < MAX_FD && fds[dirfd].fid && fds[dirfd].is_dir) {
        snprintf(buf, BUF, "%s/%s/%s", root, fds[dirfd].path, path);
    } else {
        return NULL;
    }
    size_t n = strlen(buf);
    while (n > 1 && buf[n - 1] == '/') buf[--n] = 0;
    /* Drop "/./" and "//" so the same file always has the same name. */
    char *s;
    while ((s = strstr(buf, "/./"))) memmove(s, s + 2, strlen(s + 2) + 1);
    while ((s = strstr(buf, "//"))) memmove(s, s + 1, strlen(s + 1) + 1);
    if (strncmp(buf, root, root_len) != 0) return NULL;
    if (buf[root_len] == 0) return buf + root_len; /* the root itself: "" */
    if (buf[root_len] != '/') return NULL;
    return buf + root_len + 1;
}

static uint32_t fid_of(dev_t dev, ino_t ino, int create) {
    for (uint32_t i = 1; i < next_fid; i++)
        if (inodes[i].ino == ino && inodes[i].dev == dev) {
            if (!create) return inodes[i].fid;
            inodes[i].ino = 0; /* a new file on a reused inode number */
        }
    if (next_fid >= MAX_FILES) abort();
    uint32_t fid = next_fid++;
    inodes[fid].dev = dev;
    inodes[fid].ino = ino;
    inodes[fid].fid = fid;
    return fid;
}

static void track(int fd, const char *rel, int flags, int created) {
    struct stat st;
    if (fd < 0 || fd >= MAX_FD || fstat(fd, &st) != 0) return;
    uint32_t fid = fid_of(st.st_dev, st.st_ino, created);
    free(fds[fd].path);
    fds[fd].fid = fid;
    fds[fd].is_dir = S_ISDIR(st.st_mode);
    fds[fd].is_marks = 0;
    fds[fd].append = (flags & O_APPEND) != 0;
    fds[fd].path = strdup(rel);
    atomic_store(&traced_fd[fd], 1);
    uint8_t buf[BUF + 32];
    size_t n = 0;
    if (created) {
        n += put_u32(buf + n, fid);
        n += put_str(buf + n, rel);
        emit(OP_CREATE, buf, n, NULL, 0);
    } else if ((flags & O_TRUNC) && !fds[fd].is_dir) {
        n += put_u32(buf + n, fid);
        n += put_u64(buf + n, 0);
        emit(OP_TRUNC, buf, n, NULL, 0);
    }
}

static int do_open(int dirfd, const char *path, int flags, mode_t mode, int at) {
    REAL(open);
    REAL(openat);
    char buf[BUF];
    const char *rel = active ? relative(dirfd, path, buf) : NULL;
    int is_marks = active && path[0] == '/' && strcmp(path, marks) == 0;
    if (!rel && !is_marks) return at ? real_openat(dirfd, path, flags, mode) : real_open(path, flags, mode);
    pthread_mutex_lock(&lock);
    struct stat st;
    int existed = fstatat(dirfd, path, &st, AT_SYMLINK_NOFOLLOW) == 0;
    int fd = at ? real_openat(dirfd, path, flags, mode) : real_open(path, flags, mode);
    int saved = errno;
    if (fd >= 0 && fd < MAX_FD) {
        if (is_marks) {
            free(fds[fd].path);
            fds[fd].path = NULL;
            fds[fd].fid = 1; /* nonzero: looked at by write() */
            fds[fd].is_marks = 1;
            fds[fd].is_dir = 0;
            atomic_store(&traced_fd[fd], 1);
        } else {
            track(fd, rel, flags, !existed && (flags & O_CREAT));
        }
    }
    pthread_mutex_unlock(&lock);
    errno = saved;
    return fd;
}

static mode_t mode_arg(int flags, va_list ap) {
    return (flags & (O_CREAT | O_TMPFILE)) ? (mode_t)va_arg(ap, int) : 0;
}

int open(const char *path, int flags, ...) {
    va_list ap; va_start(ap, flags); mode_t m = mode_arg(flags, ap); va_end(ap);
    return do_open(AT_FDCWD, path, flags, m, 0);
}
int open64(const char *path, int flags, ...) {
    va_list ap; va_start(ap, flags); mode_t m = mode_arg(flags, ap); va_end(ap);
    return do_open(AT_FDCWD, path, flags, m, 0);
}
int openat(int dirfd, const char *path, int flags, ...) {
    va_list ap; va_start(ap, flags); mode_t m = mode_arg(flags, ap); va_end(ap);
    return do_open(dirfd, path, flags, m, 1);
}
int openat64(int dirfd, const char *path, int flags, ...) {
    va_list ap; va_start(ap, flags); mode_t m = mode_arg(flags, ap); va_end(ap);
    return do_open(dirfd, path, flags, m, 1);
}
int creat(const char *path, mode_t mode) { return do_open(AT_FDCWD, path, O_CREAT | O_WRONLY | O_TRUNC, mode, 0); }
int creat64(const char *path, mode_t mode) { return do_open(AT_FDCWD, path, O_CREAT | O_WRONLY | O_TRUNC, mode, 0); }

int close(int fd) {
    REAL(close);
    if (fd >= 0 && fd < MAX_FD && atomic_load(&traced_fd[fd])) {
        pthread_mutex_lock(&lock);
        atomic_store(&traced_fd[fd], 0);
        fds[fd].fid = 0;
        free(fds[fd].path);
        fds[fd].path = NULL;
        int r = real_close(fd);
        int saved = errno;
        pthread_mutex_unlock(&lock);
        errno = saved;
        return r;
    }
    return real_close(fd);
}

static int traced(int fd) { return fd >= 0 && fd < MAX_FD && atomic_load(&traced_fd[fd]); }

/* Records `n` bytes of `data` written at `offset` (-1: at the position the write used). */
static void record_write(int fd, int64_t offset, const void *data, size_t n) {
    struct fd_entry *e = &fds[fd];
    if (e->is_marks) {
        emit(OP_MARK, data, n, NULL, 0);
        return;
    }
    uint8_t head[16];
    size_t h = put_u32(head, e->fid);
    h += put_u64(head + h, (uint64_t)offset);
    emit(OP_WRITE, head, h, data, n);
    unsynced[e->fid] += n;
}

/* Where the next write() on `fd` lands. */
static int64_t position(int fd) {
    if (fds[fd].append) {
        struct stat st;
        return fstat(fd, &st) == 0 ? st.st_size : -1;
    }
    return lseek(fd, 0, SEEK_CUR);
}

ssize_t write(int fd, const void *buf, size_t n) {
    REAL(write);
    if (!traced(fd)) return real_write(fd, buf, n);
    pthread_mutex_lock(&lock);
    int64_t at = fds[fd].is_marks ? 0 : position(fd);
    ssize_t r = real_write(fd, buf, n);
    int saved = errno;
    if (r > 0) record_write(fd, at, buf, (size_t)r);
    pthread_mutex_unlock(&lock);
    errno = saved;
    return r;
}

static ssize_t do_pwrite(int fd, const void *buf, size_t n, off_t off) {
    REAL(pwrite64);
    if (!traced(fd)) return real_pwrite64(fd, buf, n, off);
    pthread_mutex_lock(&lock);
    ssize_t r = real_pwrite64(fd, buf, n, off);
    int saved = errno;
    if (r > 0) record_write(fd, off, buf, (size_t)r);
    pthread_mutex_unlock(&lock);
    errno = saved;
    return r;
}
ssize_t pwrite(int fd, const void *buf, size_t n, off_t off) { return do_pwrite(fd, buf, n, off); }
ssize_t pwrite64(int fd, const void *buf, size_t n, off_t off) { return do_pwrite(fd, buf, n, off); }

/* The bytes of an iovec, gathered (the first `n` of them). */
static char *gather(const struct iovec *iov, int cnt, size_t n) {
    char *all = malloc(n ? n : 1), *p = all;
    for (int i = 0; i < cnt && n > 0; i++) {
        size_t take = iov[i].iov_len < n ? iov[i].iov_len : n;
        memcpy(p, iov[i].iov_base, take);
        p += take;
        n -= take;
    }
    return all;
}

ssize_t writev(int fd, const struct iovec *iov, int cnt) {
    REAL(writev);
    if (!traced(fd)) return real_writev(fd, iov, cnt);
    pthread_mutex_lock(&lock);
    int64_t at = fds[fd].is_marks ? 0 : position(fd);
    ssize_t r = real_writev(fd, iov, cnt);
    int saved = errno;
    if (r > 0) {
        char *all = gather(iov, cnt, (size_t)r);
        record_write(fd, at, all, (size_t)r);
        free(all);
    }
    pthread_mutex_unlock(&lock);
    errno = saved;
    return r;
}

static ssize_t do_pwritev(int fd, const struct iovec *iov, int cnt, off_t off) {
    REAL(pwritev64);
    if (!traced(fd)) return real_pwritev64(fd, iov, cnt, off);
    pthread_mutex_lock(&lock);
    ssize_t r = real_pwritev64(fd, iov, cnt, off);
    int saved = errno;
    if (r > 0) {
        char *all = gather(iov, cnt, (size_t)r);
        record_write(fd, off, all, (size_t)r);
        free(all);
    }
    pthread_mutex_unlock(&lock);
    errno = saved;
    return r;
}
ssize_t pwritev(int fd, const struct iovec *iov, int cnt, off_t off) { return do_pwritev(fd, iov, cnt, off); }
ssize_t pwritev64(int fd, const struct iovec *iov, int cnt, off_t off) { return do_pwritev(fd, iov, cnt, off); }

static int do_ftruncate(int fd, off_t len) {
    REAL(ftruncate64);
    if (!traced(fd)) return real_ftruncate64(fd, len);
    pthread_mutex_lock(&lock);
    int r = real_ftruncate64(fd, len);
    int saved = errno;
    if (r == 0) {
        uint8_t buf[12];
        size_t n = put_u32(buf, fds[fd].fid);
        n += put_u64(buf + n, (uint64_t)len);
        emit(OP_TRUNC, buf, n, NULL, 0);
    }
    pthread_mutex_unlock(&lock);
    errno = saved;
    return r;
}
int ftruncate(int fd, off_t len) { return do_ftruncate(fd, len); }
int ftruncate64(int fd, off_t len) { return do_ftruncate(fd, len); }

static void sleep_us(long us) {
    if (us <= 0) return;
    struct timespec ts = {us / 1000000, (us % 1000000) * 1000};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {}
}

/* A sync: BEGIN, the delay and the real call without the lock, then END with the result. */
static int do_sync(int fd, int (*real)(int), uint8_t kind) {
    if (!traced(fd) || fds[fd].is_marks) return real(fd);
    pthread_mutex_lock(&lock);
    uint32_t id = next_sync++, fid = fds[fd].fid;
    int is_dir = fds[fd].is_dir;
    uint64_t pending = unsynced[fid];
    unsynced[fid] = 0;
    int fail = 0;
    if (fail_count >= 0 && fds[fd].path && strstr(fds[fd].path, fail_substring)) {
        fail = failing || ++fail_seen >= fail_count;
        failing = fail;
    }
    uint8_t buf[BUF + 32];
    size_t n = put_u32(buf, id);
    n += put_u32(buf + n, fid);
    buf[n++] = (uint8_t)is_dir;
    buf[n++] = kind;
    n += put_str(buf + n, fds[fd].path ? fds[fd].path : "");
    emit(OP_SYNC_BEGIN, buf, n, NULL, 0);
    pthread_mutex_unlock(&lock);
    sleep_us(fsync_us + (long)(pending / 1024) * fsync_us_per_kb);
    int r;
    if (fail) {
        errno = EIO;
        r = -1;
    } else {
        r = real(fd);
    }
    int saved = errno;
    pthread_mutex_lock(&lock);
    n = put_u32(buf, id);
    n += put_u32(buf + n, (uint32_t)(r == 0 ? 0 : saved));
    emit(OP_SYNC_END, buf, n, NULL, 0);
    pthread_mutex_unlock(&lock);
    errno = saved;
    return r;
}

int fsync(int fd) {
    REAL(fsync);
    return do_sync(fd, real_fsync, 0);
}
int fdatasync(int fd) {
    REAL(fdatasync);
    return do_sync(fd, real_fdatasync, 1);
}

int sync_file_range(int fd, off64_t off, off64_t n, unsigned int flags) {
    REAL(sync_file_range);
    if (traced(fd)) sleep_us(fsync_us);
    return real_sync_file_range(fd, off, n, flags);
}

/* A directory operation on one or two paths, recorded when it succeeded. */
static int path_op(uint8_t op, int dfd1, const char *p1, int dfd2, const char *p2, int (*call)(void *), void *arg) {
    char b1[BUF], b2[BUF];
    const char *r1 = active ? relative(dfd1, p1, b1) : NULL;
    const char *r2 = active && p2 ? relative(dfd2, p2, b2) : NULL;
    if (!r1 && !r2) return call(arg);
    pthread_mutex_lock(&lock);
    int r = call(arg);
    int saved = errno;
    if (r == 0) {
        uint8_t buf[2 * BUF + 16];
        size_t n = put_str(buf, r1 ? r1 : "");
        if (p2) n += put_str(buf + n, r2 ? r2 : "");
        emit(op, buf, n, NULL, 0);
    }
    pthread_mutex_unlock(&lock);
    errno = saved;
    return r;
}

struct two { int d1; const char *a; int d2; const char *b; unsigned flags; mode_t mode; };

static int call_rename(void *p) {
    struct two *t = p;
    REAL(renameat2);
    return real_renameat2(t->d1, t->a, t->d2, t->b, t->flags);
}
static int call_unlink(void *p) {
    struct two *t = p;
    REAL(unlinkat);
    return real_unlinkat(t->d1, t->a, (int)t->flags);
}
static int call_mkdir(void *p) {
    struct two *t = p;
    REAL(mkdirat);
    return real_mkdirat(t->d1, t->a, t->mode);
}

int renameat2(int d1, const char *a, int d2, const char *b, unsigned flags) {
    struct two t = {d1, a, d2, b, flags, 0};
    return path_op(OP_RENAME, d1, a, d2, b, call_rename, &t);
}
int renameat(int d1, const char *a, int d2, const char *b) { return renameat2(d1, a, d2, b, 0); }
int rename(const char *a, const char *b) { return renameat2(AT_FDCWD, a, AT_FDCWD, b, 0); }

int unlinkat(int d, const char *p, int flags) {
    struct two t = {d, p, 0, NULL, (unsigned)flags, 0};
    return path_op((flags & AT_REMOVEDIR) ? OP_RMDIR : OP_UNLINK, d, p, 0, NULL, call_unlink, &t);
}
int unlink(const char *p) { return unlinkat(AT_FDCWD, p, 0); }
int rmdir(const char *p) { return unlinkat(AT_FDCWD, p, AT_REMOVEDIR); }

int mkdirat(int d, const char *p, mode_t mode) {
    struct two t = {d, p, 0, NULL, 0, mode};
    return path_op(OP_MKDIR, d, p, 0, NULL, call_mkdir, &t);
}
int mkdir(const char *p, mode_t mode) { return mkdirat(AT_FDCWD, p, mode); }

/* Duplicated descriptors would write to a traced file unseen: refuse to trace through them. */
int dup(int fd) {
    REAL(dup);
    if (traced(fd)) abort();
    return real_dup(fd);
}
int dup2(int fd, int fd2) {
    REAL(dup2);
    if (traced(fd) || traced(fd2)) abort();
    return real_dup2(fd, fd2);
}
int dup3(int fd, int fd2, int flags) {
    REAL(dup3);
    if (traced(fd) || traced(fd2)) abort();
    return real_dup3(fd, fd2, flags);
}
