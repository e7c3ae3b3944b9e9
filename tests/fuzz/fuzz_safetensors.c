/*
 * fuzz_safetensors.c: libFuzzer target for the safetensors reader (src/safetensors.c) and
 * the checkpoint header parse above it (src/checkpoint.c): any input either fails with a
 * status or yields tensors that read back within the file; neither may crash, leak or
 * touch memory it does not own (ASan + UBSan). Seeds: tests/fuzz/corpus/safetensors.
 */
#include "fuzz_common.h"

#include <string.h>

#include "gdp/checkpoint.h"
#include "safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *path = fuzz_input_file(data, size);
    if (path == NULL)
        return 0;
    gdp_st_file *f = NULL;
    if (gdp_st_open(path, &f) == GDP_STATUS_SUCCESS) {
        for (int32_t i = 0; i < gdp_st_count(f); i++) {
            const gdp_st_info *t = gdp_st_at(f, i);
            if (t == NULL || gdp_st_find(f, t->name) == NULL)
                abort(); /* every listed tensor must be found by its name */
            void *buf = NULL;
            const gdp_st_info *info = NULL;
            if (gdp_st_load(f, t->name, &buf, &info) == GDP_STATUS_SUCCESS && info->nbytes > size)
                abort(); /* a tensor larger than the file was "read" */
            free(buf);
            if (t->ndim > 0 && t->shape[0] > 1 && t->elem_size > 0 && t->nbytes <= (1u << 20)) {
                char *slice = malloc(t->nbytes ? t->nbytes : 1);
                if (slice != NULL)
                    (void)gdp_st_read_slice(f, t->name, 0, 1, t->shape[0] - 1, slice, t->nbytes);
                free(slice);
            }
        }
        (void)gdp_st_metadata(f, "format");
        (void)gdp_st_metadata(f, "config");
        gdp_st_close(f);
    }
    gdp_checkpoint_t ck = NULL;
    if (gdp_checkpoint_open(&ck, path) == GDP_STATUS_SUCCESS) {
        gdp_layer_config cfg;
        (void)gdp_checkpoint_get_config(ck, &cfg);
        gdp_checkpoint_free(ck);
    }
    return 0;
}
