/*
 * safetensors.h: a small reader of the safetensors format over jansson: an 8-byte
 * little-endian header length, a JSON header mapping names to {dtype, shape,
 * data_offsets} (plus "__metadata__" of string values), then the raw data. Only the
 * header is held in memory; tensors (or slices of them along one dim) are read with
 * pread, so a rank can load its shard of a checkpoint without reading the whole file.
 * Used by the golden-vector tests and the checkpoint loader.
 */
#ifndef GDP_SAFETENSORS_H
#define GDP_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "gdp/gdp.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct gdp_st_file gdp_st_file;

typedef struct gdp_st_info {
    const char *name;
    char        st_dtype[8];  /* as in the file: "F32", "BF16", "F16", "I32", "I64", "F64", ... */
    gdp_dtype_t dtype;        /* GDP_DTYPE_NUM when it has no gdp equivalent */
    size_t      elem_size;    /* 0 for a dtype this reader does not know: reading it fails */
    int32_t     ndim;
    int64_t     shape[GDP_MAX_DIMS];
    int64_t     numel;
    uint64_t    offset;       /* absolute byte offset of the data in the file */
    uint64_t    nbytes;
} gdp_st_info;

/* Opens `path` and parses its header. Errors name the file and the problem. */
gdp_status_t gdp_st_open(const char *path, gdp_st_file **out);
void         gdp_st_close(gdp_st_file *f);
/* Number of tensors and the i-th, in file order. */
int32_t      gdp_st_count(const gdp_st_file *f);
const gdp_st_info *gdp_st_at(const gdp_st_file *f, int32_t i);
/* The tensor called `name`, or NULL (no error recorded). */
const gdp_st_info *gdp_st_find(const gdp_st_file *f, const char *name);
/* The string value of metadata key `key` ("" and NULL both possible: NULL = absent).
 * Non-string JSON values are returned serialized. */
const char  *gdp_st_metadata(const gdp_st_file *f, const char *key);
/* Reads the whole tensor `name` into dst (dst_bytes must equal its size). */
gdp_status_t gdp_st_read(gdp_st_file *f, const char *name, void *dst, size_t dst_bytes);
/* Reads the slice [start, start + count) of dim `dim` of `name` (all of the other dims),
 * contiguous into dst. */
gdp_status_t gdp_st_read_slice(gdp_st_file *f, const char *name, int32_t dim, int64_t start, int64_t count,
                               void *dst, size_t dst_bytes);
/* Allocates a buffer (malloc) with the whole tensor; fills info if non-NULL. */
gdp_status_t gdp_st_load(gdp_st_file *f, const char *name, void **data, const gdp_st_info **info);

/* Writes a safetensors file: `count` tensors with names, dtypes, shapes and data, plus
 * string metadata pairs (may be 0). Written to a temporary file then renamed, so a
 * failed write never leaves a partial file under `path`. */
typedef struct gdp_st_entry {
    const char *name;
    gdp_dtype_t dtype;
    int32_t     ndim;
    int64_t     shape[GDP_MAX_DIMS];
    const void *data;
} gdp_st_entry;
gdp_status_t gdp_st_write(const char *path, const gdp_st_entry *entries, int32_t count,
                          const char *const *meta_keys, const char *const *meta_values, int32_t meta_count);

#ifdef __cplusplus
}
#endif

#endif /* GDP_SAFETENSORS_H */
