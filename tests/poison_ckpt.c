/*
 * poison_ckpt.c: a test tool: copies a safetensors checkpoint, setting element FLAT of
 * tensor NAME to VALUE (e.g. nan, inf), metadata kept. Used by gdp_run_options.sh to check
 * that gdp-run refuses a poisoned model and loads it with --no-finite-check.
 *   poison_ckpt IN OUT NAME FLAT VALUE
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h" /* defines: gdp_store_elem */
#include "safetensors.h"

/* Every metadata key gdp's checkpoints write (safetensors.h has no key listing). */
static const char *const k_keys[] = {"format",     "format_version", "hidden_size", "num_heads",  "num_groups",
                                     "head_dim",   "state_dim",      "num_householder", "conv_width", "num_layers",
                                     "vocab_size", "norm_eps",       "out_norm_eps", "dtype",     "seed",
                                     "init",       "config"};

int main(int argc, char **argv) {
    if (argc != 6) {
        fprintf(stderr, "usage: poison_ckpt IN OUT NAME FLAT VALUE\n");
        return 2;
    }
    gdp_st_file *f = NULL;
    if (gdp_st_open(argv[1], &f) != GDP_STATUS_SUCCESS) {
        fprintf(stderr, "poison_ckpt: %s\n", gdp_last_error());
        return 1;
    }
    const int32_t n = gdp_st_count(f);
    gdp_st_entry *e = calloc((size_t)n, sizeof *e);
    int found = 0;
    for (int32_t i = 0; i < n; i++) {
        const gdp_st_info *info = gdp_st_at(f, i);
        void *data = NULL;
        if (gdp_st_load(f, info->name, &data, NULL) != GDP_STATUS_SUCCESS) {
            fprintf(stderr, "poison_ckpt: %s\n", gdp_last_error());
            return 1;
        }
        e[i] = (gdp_st_entry){.name = info->name, .dtype = info->dtype, .ndim = info->ndim, .data = data};
        memcpy(e[i].shape, info->shape, sizeof e[i].shape);
        if (strcmp(info->name, argv[3]) == 0) {
            const long long flat = atoll(argv[4]);
            if (flat < 0 || flat >= info->numel) {
                fprintf(stderr, "poison_ckpt: %s has %lld elements, not %lld\n", argv[3], (long long)info->numel, flat);
                return 2;
            }
            gdp_store_elem(data, info->dtype, flat, strtod(argv[5], NULL));
            found = 1;
        }
    }
    if (!found) {
        fprintf(stderr, "poison_ckpt: %s has no tensor %s\n", argv[1], argv[3]);
        return 2;
    }
    const char *ks[sizeof k_keys / sizeof k_keys[0]], *vs[sizeof k_keys / sizeof k_keys[0]];
    int32_t nk = 0;
    for (size_t i = 0; i < sizeof k_keys / sizeof k_keys[0]; i++)
        if (gdp_st_metadata(f, k_keys[i]) != NULL)
            ks[nk] = k_keys[i], vs[nk++] = gdp_st_metadata(f, k_keys[i]);
    const int rc = gdp_st_write(argv[2], e, n, ks, vs, nk) == GDP_STATUS_SUCCESS ? 0 : 1;
    if (rc != 0)
        fprintf(stderr, "poison_ckpt: %s\n", gdp_last_error());
    for (int32_t i = 0; i < n; i++) /* freed, so the sanitizer build's leak check passes */
        free((void *)e[i].data);
    free(e);
    gdp_st_close(f);
    return rc;
}
