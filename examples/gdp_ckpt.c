/*
 * gdp_ckpt.c: the gdp-ckpt tool: writes seeded synthetic GDP checkpoints with Megatron's
 * initial distributions, and describes existing ones (config, dtype, tensors, the TP
 * sizes it can be loaded at, and a validation of every layer).
 *
 *   gdp-ckpt write --out F --layers L --hidden D --heads H [--groups G] [--head-dim P]
 *                  [--state-dim N] [--householder M] [--conv-width W] [--seed S]
 *                  [--dtype fp32|bf16|fp16]
 *   gdp-ckpt info F [--tp T]
 *
 * Exit codes: 0 success, 1 the library refused (message printed), 2 bad command line.
 * Format and layout: docs/checkpoint.md.
 */
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "gdp/checkpoint.h"
#include "safetensors.h" /* defines: gdp_st_open, gdp_st_at (the tensor listing of info) */

static void usage(FILE *out) {
    gdp_layer_config d;
    gdp_layer_config_default(&d);
    fprintf(out,
            "usage:\n"
            "  gdp-ckpt write -o F -d D -H H [options]   write a seeded synthetic checkpoint\n"
            "  gdp-ckpt info F [-T T]                    describe and validate a checkpoint\n"
            "write options (default in brackets):\n"
            "  -o, --out F            output file (required)\n"
            "  -d, --hidden D         hidden size (required)\n"
            "  -H, --heads H          value heads (required)\n"
            "  -g, --groups G         key/query groups [%lld]\n"
            "  -p, --head-dim P       value head dim [%lld]\n"
            "  -n, --state-dim N      key/query head dim [%lld]\n"
            "  -m, --householder M    Householder copies per token [%d]\n"
            "  -w, --conv-width W     conv kernel width [%d]\n"
            "  -l, --layers L         layers [%d]\n"
            "  -s, --seed S           RNG seed [1234]\n"
            "  -t, --dtype T          weight dtype fp32 | bf16 | fp16 [bf16]; A_log is always fp32\n"
            "info options:\n"
            "  -T, --tp T             also validate loading at tensor-parallel size T\n",
            (long long)d.num_groups, (long long)d.head_dim, (long long)d.state_dim, d.num_householder, d.conv_width,
            d.num_layers);
}

static int parse_i64(const char *opt, const char *text, int64_t *out) {
    char *end = NULL;
    long long v = strtoll(text, &end, 10);
    if (end == text || *end != '\0') {
        fprintf(stderr, "gdp-ckpt: %s expects an integer, got '%s'\n", opt, text);
        return 0;
    }
    *out = v;
    return 1;
}

static int cmd_write(int argc, char **argv) {
    static const struct option longopts[] = {
        {"out", required_argument, 0, 'o'},        {"hidden", required_argument, 0, 'd'},
        {"heads", required_argument, 0, 'H'},      {"groups", required_argument, 0, 'g'},
        {"head-dim", required_argument, 0, 'p'},   {"state-dim", required_argument, 0, 'n'},
        {"householder", required_argument, 0, 'm'}, {"conv-width", required_argument, 0, 'w'},
        {"layers", required_argument, 0, 'l'},     {"seed", required_argument, 0, 's'},
        {"dtype", required_argument, 0, 't'},      {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0},
    };
    gdp_layer_config cfg;
    gdp_layer_config_default(&cfg);
    const char *out = NULL;
    gdp_dtype_t dtype = GDP_DTYPE_BF16;
    int64_t v = 0, seed = 1234;
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "o:d:H:g:p:n:m:w:l:s:t:h", longopts, NULL)) != -1) {
        if (c == 'o') {
            out = optarg;
        } else if (c == 't') {
            if (strcmp(optarg, "fp32") == 0)
                dtype = GDP_DTYPE_FP32;
            else if (strcmp(optarg, "bf16") == 0)
                dtype = GDP_DTYPE_BF16;
            else if (strcmp(optarg, "fp16") == 0)
                dtype = GDP_DTYPE_FP16;
            else {
                fprintf(stderr, "gdp-ckpt: --dtype must be fp32, bf16 or fp16, got '%s'\n", optarg);
                return 2;
            }
        } else if (c == 'h') {
            usage(stdout);
            return 0;
        } else if (c == '?') {
            usage(stderr);
            return 2;
        } else {
            if (!parse_i64(argv[optind - 1], optarg, &v))
                return 2;
            switch (c) {
            case 'd': cfg.hidden_size = v; break;
            case 'H': cfg.num_heads = v; break;
            case 'g': cfg.num_groups = v; break;
            case 'p': cfg.head_dim = v; break;
            case 'n': cfg.state_dim = v; break;
            case 'm': cfg.num_householder = (int32_t)v; break;
            case 'w': cfg.conv_width = (int32_t)v; break;
            case 'l': cfg.num_layers = (int32_t)v; break;
            case 's': seed = v; break;
            }
        }
    }
    if (out == NULL || cfg.hidden_size == 0 || cfg.num_heads == 0) {
        fprintf(stderr, "gdp-ckpt write: --out, --hidden and --heads are required\n");
        usage(stderr);
        return 2;
    }
    gdp_status_t st = gdp_checkpoint_write_synthetic(out, &cfg, (uint64_t)seed, dtype);
    if (st != GDP_STATUS_SUCCESS) {
        fprintf(stderr, "gdp-ckpt write: %s\n  %s\n", gdp_status_string(st), gdp_last_error());
        return 1;
    }
    struct stat sb;
    long long bytes = stat(out, &sb) == 0 ? (long long)sb.st_size : -1;
    printf("wrote %s: %d layers, D=%lld H=%lld G=%lld P=%lld N=%lld M=%d W=%d, %s weights, seed %lld, %lld bytes\n",
           out, cfg.num_layers, (long long)cfg.hidden_size, (long long)cfg.num_heads, (long long)cfg.num_groups,
           (long long)cfg.head_dim, (long long)cfg.state_dim, cfg.num_householder, cfg.conv_width,
           gdp_dtype_name(dtype), (long long)seed, bytes);
    return 0;
}

/* The TP sizes a config loads at: the divisors of gcd(H, G) that fit a TP size (int32). G
 * comes from the file, so divisors are found in pairs (t, g / t) up to the square root:
 * G = 2^32 takes 2 x 2^16 steps, not 2^32. */
static void print_tp_sizes(const gdp_layer_config *cfg) {
    int64_t a = cfg->num_heads, b = cfg->num_groups;
    while (b != 0) {
        const int64_t r = a % b;
        a = b, b = r;
    }
    const int64_t g = a; /* gcd(H, G) */
    int64_t root = (int64_t)sqrt((double)g); /* then exact: root = floor(sqrt(g)) */
    while (root > 1 && root > g / root)
        root--;
    while (root + 1 <= g / (root + 1))
        root++;
    printf("# TP sizes it loads at (H %% tp == 0 and G %% tp == 0):");
    for (int64_t t = 1; t <= root; t++) /* the small divisors, ascending */
        if (g % t == 0 && t <= INT32_MAX)
            printf(" %lld", (long long)t);
    for (int64_t t = root; t >= 1; t--) /* their partners g / t, ascending */
        if (g % t == 0 && g / t != t && g / t <= INT32_MAX)
            printf(" %lld", (long long)(g / t));
    printf("\n");
}

static int cmd_info(int argc, char **argv) {
    static const struct option longopts[] = {{"tp", required_argument, 0, 'T'}, {"help", no_argument, 0, 'h'},
                                             {0, 0, 0, 0}};
    int64_t tp = 0;
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "T:h", longopts, NULL)) != -1) {
        if (c == 'T') {
            if (!parse_i64("--tp", optarg, &tp))
                return 2;
        } else if (c == 'h') {
            usage(stdout);
            return 0;
        } else {
            usage(stderr);
            return 2;
        }
    }
    if (optind >= argc) {
        fprintf(stderr, "gdp-ckpt info: which file?\n");
        usage(stderr);
        return 2;
    }
    const char *path = argv[optind];
    gdp_checkpoint_t ck = NULL;
    gdp_status_t st = gdp_checkpoint_open(&ck, path);
    if (st != GDP_STATUS_SUCCESS) {
        fprintf(stderr, "gdp-ckpt info: %s\n  %s\n", gdp_status_string(st), gdp_last_error());
        return 1;
    }
    gdp_layer_config cfg;
    gdp_dtype_t dtype;
    gdp_checkpoint_get_config(ck, &cfg);
    gdp_checkpoint_get_dtype(ck, &dtype);
    printf("# %s\n", path);
    printf("# config: D=%lld H=%lld G=%lld P=%lld N=%lld M=%d W=%d layers=%d vocab=%lld norm_eps=%g out_norm_eps=%g\n",
           (long long)cfg.hidden_size, (long long)cfg.num_heads, (long long)cfg.num_groups, (long long)cfg.head_dim,
           (long long)cfg.state_dim, cfg.num_householder, cfg.conv_width, cfg.num_layers, (long long)cfg.vocab_size,
           cfg.norm_eps, cfg.out_norm_eps);
    printf("# weight dtype: %s (A_log fp32)\n", gdp_dtype_name(dtype));
    print_tp_sizes(&cfg);
    gdp_st_file *f = NULL;
    if (gdp_st_open(path, &f) == GDP_STATUS_SUCCESS) {
        printf("#%39s %6s %s\n", "tensor", "dtype", "shape");
        uint64_t total = 0;
        for (int32_t i = 0; i < gdp_st_count(f); i++) {
            const gdp_st_info *t = gdp_st_at(f, i);
            char shape[96];
            int used = snprintf(shape, sizeof shape, "[");
            for (int32_t d = 0; d < t->ndim && used < (int)sizeof shape; d++)
                used += snprintf(shape + used, sizeof shape - (size_t)used, "%s%lld", d ? ", " : "",
                                 (long long)t->shape[d]);
            if (used < (int)sizeof shape)
                snprintf(shape + used, sizeof shape - (size_t)used, "]");
            printf("%40s %6s %s\n", t->name, t->st_dtype, shape);
            total += t->nbytes;
        }
        printf("# %d tensors, %llu bytes of data\n", gdp_st_count(f), (unsigned long long)total);
        gdp_st_close(f);
    }
    int rc = 0;
    int64_t check_tps[2] = {1, tp};
    for (int k = 0; k < (tp > 0 ? 2 : 1); k++) {
        st = gdp_checkpoint_check(ck, (int32_t)check_tps[k]);
        if (st == GDP_STATUS_SUCCESS) {
            printf("# valid at tp=%lld: every layer has every tensor with the expected shape and dtype\n",
                   (long long)check_tps[k]);
        } else {
            printf("# INVALID at tp=%lld: %s\n", (long long)check_tps[k], gdp_last_error());
            rc = 1;
        }
    }
    gdp_checkpoint_free(ck);
    return rc;
}

int main(int argc, char **argv) {
    if (argc < 2 || strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    if (strcmp(argv[1], "write") == 0)
        return cmd_write(argc - 1, argv + 1);
    if (strcmp(argv[1], "info") == 0)
        return cmd_info(argc - 1, argv + 1);
    fprintf(stderr, "gdp-ckpt: unknown command '%s' (write or info)\n", argv[1]);
    usage(stderr);
    return 2;
}
