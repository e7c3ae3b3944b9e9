/*
 * safetensors.c: the safetensors reader and writer of safetensors.h. The JSON header
 * goes through jansson; data is read with pread at absolute offsets.
 */
#define _GNU_SOURCE
#include "safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h> /* defines: json_loadb, json_object_foreach, ... */
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "internal.h"

#define ST_MAX_HEADER (100u << 20) /* the format caps the header at 100 MB */

struct gdp_st_file {
    int          fd;
    char        *path;
    uint64_t     data_start;
    uint64_t     file_size;
    int32_t      count;
    gdp_st_info *infos;
    json_t      *root;     /* keeps the names alive */
    json_t      *metadata; /* borrowed from root, may be NULL */
    char       **meta_dump;
};

static const struct {
    const char *name;
    gdp_dtype_t dtype;
    size_t      size;
} st_dtypes[] = {
    {"F32", GDP_DTYPE_FP32, 4}, {"BF16", GDP_DTYPE_BF16, 2}, {"F16", GDP_DTYPE_FP16, 2},
    {"I32", GDP_DTYPE_INT32, 4}, {"I64", GDP_DTYPE_NUM, 8},   {"F64", GDP_DTYPE_NUM, 8},
    {"U8", GDP_DTYPE_NUM, 1},    {"I8", GDP_DTYPE_NUM, 1},    {"BOOL", GDP_DTYPE_NUM, 1},
    {"I16", GDP_DTYPE_NUM, 2},   {"U16", GDP_DTYPE_NUM, 2},   {"U32", GDP_DTYPE_NUM, 4},
    {"U64", GDP_DTYPE_NUM, 8},   {"F8_E4M3", GDP_DTYPE_NUM, 1}, {"F8_E5M2", GDP_DTYPE_NUM, 1},
};

static const char *st_dtype_of(gdp_dtype_t d) {
    for (size_t i = 0; i < sizeof st_dtypes / sizeof st_dtypes[0]; i++)
        if (st_dtypes[i].dtype == d)
            return st_dtypes[i].name;
    return NULL;
}

static gdp_status_t read_exact(int fd, void *dst, size_t n, uint64_t off, const char *path) {
    char *p = dst;
    while (n > 0) {
        ssize_t r = pread(fd, p, n, (off_t)off);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            GDP_FAIL(GDP_STATUS_SYSTEM_ERROR, "safetensors: reading %zu bytes at offset %llu of %s failed: %s",
                     n, (unsigned long long)off, path, r < 0 ? strerror(errno) : "unexpected end of file");
        p += r;
        n -= (size_t)r;
        off += (uint64_t)r;
    }
    return GDP_STATUS_SUCCESS;
}

void gdp_st_close(gdp_st_file *f) {
    if (f == NULL)
        return;
    if (f->fd >= 0)
        close(f->fd);
    if (f->meta_dump) {
        for (int32_t i = 0; i < f->count + 64; i++)
            free(f->meta_dump[i]);
        free(f->meta_dump);
    }
    json_decref(f->root);
    free(f->infos);
    free(f->path);
    free(f);
}

static gdp_status_t parse_entry(gdp_st_file *f, const char *name, json_t *v, gdp_st_info *info) {
    json_t *dt = json_object_get(v, "dtype"), *shape = json_object_get(v, "shape");
    json_t *offs = json_object_get(v, "data_offsets");
    if (!json_is_string(dt) || !json_is_array(shape) || !json_is_array(offs) || json_array_size(offs) != 2)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT,
                 "safetensors: %s: tensor '%s' lacks dtype/shape/data_offsets; the file is not safetensors",
                 f->path, name);
    memset(info, 0, sizeof *info);
    info->name = name;
    const char *ds = json_string_value(dt);
    info->dtype = GDP_DTYPE_NUM;
    for (size_t i = 0; i < sizeof st_dtypes / sizeof st_dtypes[0]; i++)
        if (strcmp(ds, st_dtypes[i].name) == 0) {
            info->dtype = st_dtypes[i].dtype;
            info->elem_size = st_dtypes[i].size;
        }
    /* A dtype this reader does not know (a newer format's) keeps elem_size 0: the file still
     * opens, and only reading that tensor fails. */
    snprintf(info->st_dtype, sizeof info->st_dtype, "%s", ds);
    if (json_array_size(shape) > GDP_MAX_DIMS)
        GDP_FAIL(GDP_STATUS_UNSUPPORTED, "safetensors: %s: tensor '%s' has %zu dims, gdp supports at most %d",
                 f->path, name, json_array_size(shape), GDP_MAX_DIMS);
    info->ndim = (int32_t)json_array_size(shape);
    for (int32_t d = 0; d < info->ndim; d++) {
        json_t *e = json_array_get(shape, (size_t)d);
        if (!json_is_integer(e) || json_integer_value(e) < 0)
            GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "safetensors: %s: tensor '%s' has a bad extent in dim %d",
                     f->path, name, d);
        info->shape[d] = json_integer_value(e);
    }
    /* The shape comes from the file: its element and byte counts must not overflow (a shape
     * [2^32, 2^32] would otherwise wrap to 0 bytes and pass the size check below). */
    char shape_text[160];
    size_t bytes = 0;
    if (!gdp_shape_numel(info->ndim, info->shape, &info->numel) ||
        (info->elem_size != 0 && !gdp_bytes_of(info->numel, info->elem_size, &bytes)))
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT,
                 "safetensors: %s: tensor '%s' has shape %s of %s, whose size overflows 64 bits; the file is "
                 "corrupt or hostile",
                 f->path, name, gdp_shape_str(shape_text, sizeof shape_text, info->ndim, info->shape), ds);
    json_t *o0 = json_array_get(offs, 0), *o1 = json_array_get(offs, 1);
    if (!json_is_integer(o0) || !json_is_integer(o1))
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "safetensors: %s: tensor '%s' has non-integer data_offsets",
                 f->path, name);
    long long b = json_integer_value(o0), e = json_integer_value(o1);
    const uint64_t data_bytes = f->file_size - f->data_start;
    if (b < 0 || e < b || (info->elem_size != 0 && (uint64_t)(e - b) != (uint64_t)bytes) ||
        (uint64_t)e > data_bytes)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT,
                 "safetensors: %s: tensor '%s' has data_offsets [%lld, %lld] that do not match its %lld "
                 "elements of %s or run past the end of the file (%llu bytes); the file is truncated or corrupt",
                 f->path, name, b, e, (long long)info->numel, ds, (unsigned long long)f->file_size);
    info->offset = f->data_start + (uint64_t)b;
    info->nbytes = (uint64_t)(e - b);
    return GDP_STATUS_SUCCESS;
}

/* Order of tensors by where their data starts (then ends): the layout check walks it. */
static int by_offset(const void *pa, const void *pb) {
    const gdp_st_info *a = *(const gdp_st_info *const *)pa, *b = *(const gdp_st_info *const *)pb;
    if (a->offset != b->offset)
        return a->offset < b->offset ? -1 : 1;
    if (a->nbytes != b->nbytes)
        return a->nbytes < b->nbytes ? -1 : 1;
    return 0;
}

/* The format's layout rule: the tensors' byte ranges tile the data buffer exactly, with no
 * overlap, no gap and nothing after the last one (the header order is free: the reference
 * implementation sorts by offset too). Overlapping ranges would let two tensors alias, gaps
 * and trailing bytes would hide data no tensor accounts for. */
static gdp_status_t check_layout(gdp_st_file *f) {
    const uint64_t data_bytes = f->file_size - f->data_start;
    if (f->count == 0) {
        if (data_bytes != 0)
            GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT,
                     "safetensors: %s holds no tensor but %llu data bytes after its header; the format forbids "
                     "bytes no tensor accounts for (corrupt or not a safetensors file)",
                     f->path, (unsigned long long)data_bytes);
        return GDP_STATUS_SUCCESS;
    }
    const gdp_st_info **order = gdp_calloc((size_t)f->count, sizeof *order, "the safetensors layout check");
    if (order == NULL)
        return GDP_STATUS_SYSTEM_ERROR;
    for (int32_t i = 0; i < f->count; i++)
        order[i] = &f->infos[i];
    qsort(order, (size_t)f->count, sizeof *order, by_offset);
    gdp_status_t st = GDP_STATUS_SUCCESS;
    uint64_t at = 0; /* where the next tensor must start, relative to the data buffer */
    const gdp_st_info *prev = NULL;
    for (int32_t i = 0; i < f->count && st == GDP_STATUS_SUCCESS; i++) {
        const gdp_st_info *t = order[i];
        const uint64_t b = t->offset - f->data_start, e = b + t->nbytes;
        if (b < at)
            st = GDP_ERROR(GDP_STATUS_INVALID_ARGUMENT,
                           "safetensors: %s: tensor '%s' (data_offsets [%llu, %llu]) overlaps tensor '%s' "
                           "([%llu, %llu]); the format forbids overlapping data (corrupt or hostile file)",
                           f->path, t->name, (unsigned long long)b, (unsigned long long)e, prev->name,
                           (unsigned long long)(prev->offset - f->data_start),
                           (unsigned long long)(prev->offset - f->data_start + prev->nbytes));
        else if (b > at && prev == NULL)
            st = GDP_ERROR(GDP_STATUS_INVALID_ARGUMENT,
                           "safetensors: %s: tensor '%s' comes first in the data buffer but starts at data offset "
                           "%llu, not 0: those %llu bytes belong to no tensor and the format forbids gaps (corrupt "
                           "file)",
                           f->path, t->name, (unsigned long long)b, (unsigned long long)b);
        else if (b > at)
            st = GDP_ERROR(GDP_STATUS_INVALID_ARGUMENT,
                           "safetensors: %s: tensor '%s' starts at data offset %llu, but tensor '%s' before it ends "
                           "at %llu: the %llu bytes in between belong to no tensor and the format forbids gaps "
                           "(corrupt file)",
                           f->path, t->name, (unsigned long long)b, prev->name, (unsigned long long)at,
                           (unsigned long long)(b - at));
        at = e;
        prev = t;
    }
    if (st == GDP_STATUS_SUCCESS && at != data_bytes)
        st = GDP_ERROR(GDP_STATUS_INVALID_ARGUMENT,
                       "safetensors: %s: the last tensor '%s' ends at data offset %llu, but the file holds %llu "
                       "data bytes; the format forbids trailing bytes no tensor accounts for (corrupt file)",
                       f->path, prev->name, (unsigned long long)at, (unsigned long long)data_bytes);
    free(order);
    return st;
}

gdp_status_t gdp_st_open(const char *path, gdp_st_file **out) {
    if (path == NULL || out == NULL)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "gdp_st_open: path or out is NULL");
    *out = NULL;
    gdp_st_file *f = gdp_calloc(1, sizeof *f, "a safetensors handle");
    if (f == NULL)
        return GDP_STATUS_SYSTEM_ERROR;
    f->fd = -1;
    gdp_status_t st = GDP_STATUS_SUCCESS;
    char *header = NULL;
    f->path = strdup(path);
    f->fd = open(path, O_RDONLY | O_CLOEXEC);
    if (f->fd < 0) {
        st = GDP_ERROR(GDP_STATUS_SYSTEM_ERROR, "safetensors: cannot open %s: %s", path, strerror(errno));
        goto fail;
    }
    struct stat sb;
    if (fstat(f->fd, &sb) != 0) {
        st = GDP_ERROR(GDP_STATUS_SYSTEM_ERROR, "safetensors: cannot stat %s: %s", path, strerror(errno));
        goto fail;
    }
    f->file_size = (uint64_t)sb.st_size;
    unsigned char lenbuf[8];
    if (f->file_size < 8) {
        st = GDP_ERROR(GDP_STATUS_INVALID_ARGUMENT, "safetensors: %s is %llu bytes, too short for a header",
                       path, (unsigned long long)f->file_size);
        goto fail;
    }
    GDP_CHECK_GOTO(read_exact(f->fd, lenbuf, 8, 0, path), st, fail);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--)
        hlen = (hlen << 8) | lenbuf[i];
    if (hlen > ST_MAX_HEADER || 8 + hlen > f->file_size) {
        st = GDP_ERROR(GDP_STATUS_INVALID_ARGUMENT,
                       "safetensors: %s declares a %llu-byte header but the file has %llu bytes; not a "
                       "safetensors file or truncated",
                       path, (unsigned long long)hlen, (unsigned long long)f->file_size);
        goto fail;
    }
    header = malloc(hlen + 1);
    if (header == NULL) {
        st = GDP_ERROR(GDP_STATUS_SYSTEM_ERROR, "safetensors: out of memory for a %llu-byte header",
                       (unsigned long long)hlen);
        goto fail;
    }
    GDP_CHECK_GOTO(read_exact(f->fd, header, hlen, 8, path), st, fail);
    f->data_start = 8 + hlen;
    /* The format: the header MUST begin with '{' (a JSON object, may be padded with spaces). */
    if (hlen == 0 || header[0] != '{') {
        st = GDP_ERROR(GDP_STATUS_INVALID_ARGUMENT,
                       "safetensors: %s: the header does not start with '{' (it starts with %s); a safetensors "
                       "header is a JSON object mapping tensor names to {dtype, shape, data_offsets}",
                       path, hlen == 0 ? "nothing: it is empty" : header[0] == '[' ? "'[', a JSON array" : "another byte");
        goto fail;
    }
    json_error_t jerr;
    /* Duplicate names are forbidden by the format; jansson would keep the last one silently. */
    f->root = json_loadb(header, hlen, JSON_REJECT_DUPLICATES, &jerr);
    if (f->root == NULL) {
        if (json_error_code(&jerr) == json_error_duplicate_key)
            st = GDP_ERROR(GDP_STATUS_INVALID_ARGUMENT,
                           "safetensors: %s: the header names a tensor twice (%s, header line %d, column %d); the "
                           "format forbids duplicate tensor names (which copy would be meant?)",
                           path, jerr.text, jerr.line, jerr.column);
        else
            st = GDP_ERROR(GDP_STATUS_INVALID_ARGUMENT,
                           "safetensors: %s: the header is not valid JSON: %s (header line %d, column %d); the file "
                           "is corrupt or not safetensors",
                           path, jerr.text, jerr.line, jerr.column);
        goto fail;
    }
    if (!json_is_object(f->root)) { /* unreachable after the '{' check, kept for safety */
        st = GDP_ERROR(GDP_STATUS_INVALID_ARGUMENT, "safetensors: %s: the header is not a JSON object", path);
        goto fail;
    }
    size_t n = json_object_size(f->root);
    f->infos = gdp_calloc(n, sizeof *f->infos, "safetensors tensor table");
    if (f->infos == NULL) {
        st = GDP_STATUS_SYSTEM_ERROR;
        goto fail;
    }
    const char *key;
    json_t *val;
    json_object_foreach(f->root, key, val) {
        if (strcmp(key, "__metadata__") == 0) {
            f->metadata = val;
            continue;
        }
        GDP_CHECK_GOTO(parse_entry(f, key, val, &f->infos[f->count]), st, fail);
        f->count++;
    }
    GDP_CHECK_GOTO(check_layout(f), st, fail);
    /* json_object_foreach is in insertion (file) order for jansson >= 2.8. */
    f->meta_dump = gdp_calloc((size_t)f->count + 64, sizeof(char *), "safetensors metadata");
    free(header);
    *out = f;
    return GDP_STATUS_SUCCESS;
fail:
    free(header);
    gdp_st_close(f);
    return st;
}

int32_t gdp_st_count(const gdp_st_file *f) { return f ? f->count : 0; }

const gdp_st_info *gdp_st_at(const gdp_st_file *f, int32_t i) {
    return (f && i >= 0 && i < f->count) ? &f->infos[i] : NULL;
}

const gdp_st_info *gdp_st_find(const gdp_st_file *f, const char *name) {
    if (f == NULL || name == NULL)
        return NULL;
    for (int32_t i = 0; i < f->count; i++)
        if (strcmp(f->infos[i].name, name) == 0)
            return &f->infos[i];
    return NULL;
}

const char *gdp_st_metadata(const gdp_st_file *f, const char *key) {
    if (f == NULL || f->metadata == NULL || key == NULL)
        return NULL;
    json_t *v = json_object_get(f->metadata, key);
    if (v == NULL)
        return NULL;
    if (json_is_string(v))
        return json_string_value(v);
    for (int32_t i = 0; f->meta_dump && i < f->count + 64; i++) {
        if (f->meta_dump[i] == NULL) {
            ((gdp_st_file *)f)->meta_dump[i] = json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT);
            return f->meta_dump[i];
        }
    }
    return NULL;
}

static gdp_status_t find_or_fail(gdp_st_file *f, const char *name, const gdp_st_info **info) {
    if (f == NULL || name == NULL)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "safetensors: file or tensor name is NULL");
    *info = gdp_st_find(f, name);
    if (*info == NULL)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "safetensors: %s has no tensor named '%s'", f->path, name);
    if ((*info)->elem_size == 0)
        GDP_FAIL(GDP_STATUS_UNSUPPORTED, "safetensors: %s: tensor '%s' has dtype %s, which gdp cannot read",
                 f->path, name, (*info)->st_dtype);
    return GDP_STATUS_SUCCESS;
}

gdp_status_t gdp_st_read(gdp_st_file *f, const char *name, void *dst, size_t dst_bytes) {
    const gdp_st_info *info;
    GDP_CHECK(find_or_fail(f, name, &info));
    if (dst_bytes != info->nbytes)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "safetensors: %s: tensor '%s' has %llu bytes, buffer has %zu",
                 f->path, name, (unsigned long long)info->nbytes, dst_bytes);
    return read_exact(f->fd, dst, dst_bytes, info->offset, f->path);
}

gdp_status_t gdp_st_read_slice(gdp_st_file *f, const char *name, int32_t dim, int64_t start, int64_t count,
                               void *dst, size_t dst_bytes) {
    const gdp_st_info *info;
    GDP_CHECK(find_or_fail(f, name, &info));
    if (dim < 0 || dim >= info->ndim || start < 0 || count < 0 || start > info->shape[dim] ||
        count > info->shape[dim] - start)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT,
                 "safetensors: %s: slice of %lld from %lld of dim %d is outside tensor '%s' (%d dims, extent %lld)",
                 f->path, (long long)count, (long long)start, dim, name, info->ndim, /* start + count may overflow */
                 dim >= 0 && dim < info->ndim ? (long long)info->shape[dim] : -1LL);
    int64_t outer = 1, inner = (int64_t)info->elem_size;
    for (int32_t d = 0; d < dim; d++)
        outer *= info->shape[d];
    for (int32_t d = dim + 1; d < info->ndim; d++)
        inner *= info->shape[d];
    size_t run = (size_t)(count * inner);
    if ((size_t)outer * run != dst_bytes)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "safetensors: %s: slice of '%s' has %zu bytes, buffer has %zu",
                 f->path, name, (size_t)outer * run, dst_bytes);
    for (int64_t o = 0; o < outer; o++) {
        uint64_t src = info->offset + (uint64_t)((o * info->shape[dim] + start) * inner);
        GDP_CHECK(read_exact(f->fd, (char *)dst + o * (int64_t)run, run, src, f->path));
    }
    return GDP_STATUS_SUCCESS;
}

gdp_status_t gdp_st_load(gdp_st_file *f, const char *name, void **data, const gdp_st_info **pinfo) {
    const gdp_st_info *info;
    GDP_CHECK(find_or_fail(f, name, &info));
    void *buf = gdp_calloc(info->nbytes ? info->nbytes : 1, 1, name);
    if (buf == NULL)
        return GDP_STATUS_SYSTEM_ERROR;
    gdp_status_t st = read_exact(f->fd, buf, info->nbytes, info->offset, f->path);
    if (st != GDP_STATUS_SUCCESS) {
        free(buf);
        return st;
    }
    *data = buf;
    if (pinfo)
        *pinfo = info;
    return GDP_STATUS_SUCCESS;
}

/* ---- the writer -------------------------------------------------------------------
 * Where the bytes go depends on what `path` is (lstat, then stat through a symlink):
 *   - nothing yet, or a regular file: a temporary file beside it (same directory, so the
 *     rename cannot cross filesystems), flushed and fsync'ed, then renamed over `path`:
 *     a reader sees the old file or the whole new one, never a part; an existing file
 *     keeps its mode. A file we may write in a directory we may not is written in place.
 *   - a symlink: the same for the file it points to; the link stays a link.
 *   - a character device (/dev/null, /dev/full): written through; no rename ever
 *     replaces a device node.
 *   - a directory, FIFO, socket or block device: refused before anything is written.
 * Every failing write, flush, fsync, close or rename is reported with its errno text
 * (e.g. ENOSPC), and a temporary file is removed. */
typedef struct st_out {
    FILE *fp;
    char *tmp;      /* the temporary file, renamed over `target` at the end; NULL: in place */
    char *target;   /* the file the rename replaces (the symlink's target for a link)       */
    bool  device;   /* a character device: no fsync (devices refuse it), no rename          */
    int   err;      /* errno of the first failed write                                      */
} st_out;

static const char *st_file_kind(mode_t m) {
    return S_ISDIR(m) ? "directory" : S_ISFIFO(m) ? "FIFO" : S_ISSOCK(m) ? "socket" : S_ISBLK(m) ? "block device"
                                                                                                 : "special file";
}

static gdp_status_t st_out_open(const char *path, st_out *o) {
    memset(o, 0, sizeof *o);
    struct stat sb;
    bool exists = lstat(path, &sb) == 0;
    if (!exists && errno != ENOENT)
        GDP_FAIL(GDP_STATUS_SYSTEM_ERROR, "gdp_st_write: cannot write %s: %s", path, strerror(errno));
    char *target = NULL;
    if (exists && S_ISLNK(sb.st_mode)) {
        target = realpath(path, NULL);
        if (target == NULL && errno != ENOENT)
            GDP_FAIL(GDP_STATUS_SYSTEM_ERROR, "gdp_st_write: cannot write %s: resolving the symlink: %s", path,
                     strerror(errno));
        exists = target != NULL && stat(target, &sb) == 0;
    }
    const char *where = target ? target : path;
    int fd = -1;
    bool in_place = false;
    if (exists && S_ISCHR(sb.st_mode)) {
        o->device = true;
        in_place = true;
    } else if (exists && !S_ISREG(sb.st_mode)) {
        free(target);
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT,
                 "gdp_st_write: cannot write %s: it is a %s; give a regular file (or a character device such as "
                 "/dev/null)", path, st_file_kind(sb.st_mode));
    } else if (exists && access(where, W_OK) != 0) {
        /* a read-only file is not ours to replace, although the directory would allow it */
        const int e = errno;
        free(target);
        GDP_FAIL(GDP_STATUS_SYSTEM_ERROR, "gdp_st_write: cannot write %s: %s", path, strerror(e));
    } else if (!exists && target == NULL && lstat(path, &sb) == 0) {
        in_place = true; /* a dangling symlink: create the file it names, through it */
    }
    if (!in_place) {
        const char *slash = strrchr(where, '/');
        const size_t dir_len = slash ? (size_t)(slash - where) + 1 : 0;
        o->tmp = malloc(strlen(where) + 48);
        if (o->tmp == NULL) {
            free(target);
            GDP_FAIL(GDP_STATUS_SYSTEM_ERROR, "gdp_st_write: out of memory");
        }
        for (unsigned k = 0; fd < 0 && k < 100; k++) {
            snprintf(o->tmp, strlen(where) + 48, "%.*s.%s.tmp-%d-%u", (int)dir_len, where, where + dir_len,
                     (int)getpid(), k);
            fd = open(o->tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
            if (fd < 0 && errno != EEXIST)
                break;
        }
        if (fd < 0 && exists && errno == EACCES) {
            free(o->tmp); /* a writable file in a directory we cannot write: in place */
            o->tmp = NULL;
            in_place = true;
        } else if (fd < 0) {
            const int e = errno;
            char *tmp = o->tmp;
            o->tmp = NULL;
            free(target);
            gdp_status_t st = GDP_ERROR(GDP_STATUS_SYSTEM_ERROR, "gdp_st_write: cannot write %s: creating %s: %s",
                                        path, tmp, strerror(e));
            free(tmp);
            return st;
        } else if (exists) {
            (void)fchmod(fd, sb.st_mode & 07777); /* the new file keeps the old one's mode */
        }
    }
    if (in_place) {
        fd = open(where, O_WRONLY | O_CLOEXEC | (o->device ? 0 : O_CREAT | O_TRUNC), 0666);
        if (fd < 0) {
            const int e = errno;
            free(target);
            GDP_FAIL(GDP_STATUS_SYSTEM_ERROR, "gdp_st_write: cannot write %s: %s", path, strerror(e));
        }
    }
    o->fp = fdopen(fd, "wb");
    if (o->fp == NULL) {
        const int e = errno;
        close(fd);
        if (o->tmp)
            unlink(o->tmp);
        free(o->tmp);
        free(target);
        o->tmp = NULL;
        GDP_FAIL(GDP_STATUS_SYSTEM_ERROR, "gdp_st_write: cannot write %s: %s", path, strerror(e));
    }
    o->target = target ? target : strdup(path);
    return GDP_STATUS_SUCCESS;
}

static bool st_out_put(st_out *o, const void *data, size_t bytes) {
    if (o->err == 0 && bytes > 0 && fwrite(data, 1, bytes, o->fp) != bytes)
        o->err = errno ? errno : EIO;
    return o->err == 0;
}

/* Flushes, syncs, closes and renames; on any failure removes the temporary file. */
static gdp_status_t st_out_close(st_out *o, const char *path) {
    int err = o->err;
    if (err == 0 && fflush(o->fp) != 0)
        err = errno ? errno : EIO;
    if (err == 0 && !o->device && fsync(fileno(o->fp)) != 0)
        err = errno;
    if (fclose(o->fp) != 0 && err == 0)
        err = errno ? errno : EIO;
    o->fp = NULL;
    if (err == 0 && o->tmp != NULL && rename(o->tmp, o->target) != 0)
        err = errno;
    if (err != 0 && o->tmp != NULL)
        unlink(o->tmp);
    if (err == 0 && o->tmp != NULL) {
        /* the rename itself survives a crash only once the directory is synced (best effort) */
        const char *slash = strrchr(o->target, '/');
        char dir[4096] = ".";
        if (slash != NULL)
            snprintf(dir, sizeof dir, "%.*s", slash == o->target ? 1 : (int)(slash - o->target), o->target);
        int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (dfd >= 0) {
            (void)fsync(dfd);
            close(dfd);
        }
    }
    free(o->tmp);
    free(o->target);
    o->tmp = o->target = NULL;
    if (err != 0)
        GDP_FAIL(GDP_STATUS_SYSTEM_ERROR, "gdp_st_write: writing %s failed: %s%s", path, strerror(err),
                 err == ENOSPC ? " (the disk or device is full)" : "");
    return GDP_STATUS_SUCCESS;
}

gdp_status_t gdp_st_write(const char *path, const gdp_st_entry *entries, int32_t count,
                          const char *const *meta_keys, const char *const *meta_values, int32_t meta_count) {
    if (path == NULL || (count > 0 && entries == NULL) || count < 0 || meta_count < 0)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "gdp_st_write: bad arguments (path, entries or counts)");
    json_t *root = json_object();
    gdp_status_t st = GDP_STATUS_SUCCESS;
    char *text = NULL;
    if (meta_count > 0) {
        json_t *meta = json_object();
        for (int32_t i = 0; i < meta_count; i++)
            json_object_set_new(meta, meta_keys[i], json_string(meta_values[i]));
        json_object_set_new(root, "__metadata__", meta);
    }
    uint64_t off = 0;
    for (int32_t i = 0; i < count; i++) {
        const gdp_st_entry *e = &entries[i];
        const char *ds = st_dtype_of(e->dtype);
        if (ds == NULL || e->ndim < 0 || e->ndim > GDP_MAX_DIMS || e->name == NULL) {
            st = GDP_ERROR(GDP_STATUS_INVALID_ARGUMENT, "gdp_st_write: entry %d has a bad name, dtype or ndim", i);
            goto done;
        }
        int64_t n = 0;
        size_t bytes = 0;
        if (!gdp_shape_numel(e->ndim, e->shape, &n) || !gdp_bytes_of(n, gdp_dtype_size(e->dtype), &bytes)) {
            st = GDP_ERROR(GDP_STATUS_INVALID_ARGUMENT,
                           "gdp_st_write: entry %d ('%s') has a negative extent or a size that overflows 64 bits", i,
                           e->name);
            goto done;
        }
        /* The format forbids duplicate names (and a JSON object would keep only the last). */
        if (strcmp(e->name, "__metadata__") == 0 || json_object_get(root, e->name) != NULL) {
            st = GDP_ERROR(GDP_STATUS_INVALID_ARGUMENT, "gdp_st_write: entry %d: the name '%s' is %s", i, e->name,
                           strcmp(e->name, "__metadata__") == 0 ? "reserved for the metadata" : "used twice");
            goto done;
        }
        json_t *shape = json_array();
        for (int32_t d = 0; d < e->ndim; d++)
            json_array_append_new(shape, json_integer(e->shape[d]));
        json_t *obj = json_object();
        json_object_set_new(obj, "dtype", json_string(ds));
        json_object_set_new(obj, "shape", shape);
        json_t *offs = json_array();
        json_array_append_new(offs, json_integer((json_int_t)off));
        json_array_append_new(offs, json_integer((json_int_t)(off + bytes)));
        json_object_set_new(obj, "data_offsets", offs);
        json_object_set_new(root, e->name, obj);
        off += bytes;
    }
    text = json_dumps(root, JSON_COMPACT | JSON_PRESERVE_ORDER);
    if (text == NULL) {
        st = GDP_ERROR(GDP_STATUS_SYSTEM_ERROR, "gdp_st_write: out of memory encoding the header of %s", path);
        goto done;
    }
    size_t hlen = strlen(text), padded = (hlen + 7) & ~(size_t)7; /* 8-byte aligned data */
    st_out out;
    st = st_out_open(path, &out);
    if (st != GDP_STATUS_SUCCESS)
        goto done;
    unsigned char lenbuf[8];
    for (int i = 0; i < 8; i++)
        lenbuf[i] = (unsigned char)(((uint64_t)padded >> (8 * i)) & 0xff);
    static const char spaces[8] = "        ";
    bool ok = st_out_put(&out, lenbuf, 8) && st_out_put(&out, text, hlen) && st_out_put(&out, spaces, padded - hlen);
    for (int32_t i = 0; ok && i < count; i++) {
        size_t bytes = (size_t)gdp_dtype_size(entries[i].dtype);
        for (int32_t d = 0; d < entries[i].ndim; d++)
            bytes *= (size_t)entries[i].shape[d];
        ok = st_out_put(&out, entries[i].data, bytes);
    }
    st = st_out_close(&out, path);
done:
    free(text);
    json_decref(root);
    return st;
}
