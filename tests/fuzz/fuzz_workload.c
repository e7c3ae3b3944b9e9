/*
 * fuzz_workload.c: libFuzzer target for the JSONL workload reader
 * (gdp_workload_load_jsonl, src/workload.c): any input either fails with a status or
 * yields requests whose tokens lie in the vocabulary; neither may crash, leak or touch
 * memory it does not own (ASan + UBSan). Seeds: tests/fuzz/corpus/workload.
 */
#include "fuzz_common.h"

#include "gdp/workload.h"

enum { VOCAB = 512 };

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *path = fuzz_input_file(data, size);
    if (path == NULL)
        return 0;
    gdp_workload wl;
    if (gdp_workload_load_jsonl(&wl, path, VOCAB, 1) != GDP_STATUS_SUCCESS)
        return 0;
    for (int32_t i = 0; i < wl.n_requests; i++) {
        const gdp_request_spec *q = &wl.requests[i];
        if (q->prompt_len < 1 || q->max_new_tokens < 1)
            abort(); /* the reader promises a prompt and a positive max_new_tokens */
        for (int32_t k = 0; k < q->prompt_len; k++)
            if (q->prompt[k] < 0 || q->prompt[k] >= VOCAB)
                abort(); /* a token outside the vocabulary was accepted */
    }
    gdp_workload_free(&wl);
    return 0;
}
