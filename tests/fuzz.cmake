# libFuzzer targets (GDP_FUZZ=ON, clang): the safetensors reader + checkpoint header parse,
# and the JSONL workload reader (tests/fuzz/). Each ctest (label fuzz) runs its target for
# GDP_FUZZ_SECONDS over a fresh corpus in the build tree, seeded from tests/fuzz/corpus/*,
# and fails on a crash, a leak, a sanitizer report, a 10 s input or 2 GB of memory; the input
# is left as fuzz-artifacts/crash-* (or leak-*, oom-*, timeout-*) in the build tree.
if(GDP_FUZZ)
  # readable stacks in reports (clang's runtime wants an llvm-symbolizer; any version works)
  find_program(GDP_LLVM_SYMBOLIZER NAMES llvm-symbolizer-16 llvm-symbolizer llvm-symbolizer-15 llvm-symbolizer-14)
  set(_gdp_fuzz_env "UBSAN_OPTIONS=print_stacktrace=1")
  if(GDP_LLVM_SYMBOLIZER)
    list(APPEND _gdp_fuzz_env "ASAN_SYMBOLIZER_PATH=${GDP_LLVM_SYMBOLIZER}")
  endif()
  foreach(target safetensors workload)
    add_executable(fuzz_${target} ${CMAKE_CURRENT_SOURCE_DIR}/fuzz/fuzz_${target}.c)
    target_include_directories(fuzz_${target} PRIVATE ${PROJECT_SOURCE_DIR}/src)
    target_link_libraries(fuzz_${target} PRIVATE gdp_static gdp_options)
    target_link_options(fuzz_${target} PRIVATE -fsanitize=fuzzer)
    set(_corpus ${CMAKE_CURRENT_BINARY_DIR}/fuzz-corpus/${target})
    file(MAKE_DIRECTORY ${_corpus} ${CMAKE_CURRENT_BINARY_DIR}/fuzz-artifacts)
    add_test(NAME fuzz_${target}
             COMMAND fuzz_${target} -max_total_time=${GDP_FUZZ_SECONDS} -timeout=10 -rss_limit_mb=2048
                     -dict=${CMAKE_CURRENT_SOURCE_DIR}/fuzz/${target}.dict -print_final_stats=1
                     -artifact_prefix=${CMAKE_CURRENT_BINARY_DIR}/fuzz-artifacts/${target}-
                     ${_corpus} ${CMAKE_CURRENT_SOURCE_DIR}/fuzz/corpus/${target})
    math(EXPR _limit "${GDP_FUZZ_SECONDS} + 120")
    set_tests_properties(fuzz_${target} PROPERTIES LABELS fuzz TIMEOUT ${_limit} ENVIRONMENT "${_gdp_fuzz_env}")
  endforeach()
endif()
