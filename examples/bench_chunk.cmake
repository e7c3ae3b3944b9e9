# bench_chunk: timings of the CUDA chunked prefill on the prefill rows of docs/performance.md
# (see examples/bench_chunk.c). With -DGDP_BUILD_CHUNK_DEV=ON also bench_chunk_stages, the
# per-stage timing lab of kernels/dev/chunk_stages.cu (a GPU-only developer tool), and
# wgmma_check, the check of the one-pass kernel's wgmma helpers (kernels/chunk/wgmma.cuh).
add_executable(bench_chunk ${CMAKE_CURRENT_LIST_DIR}/bench_chunk.c)
target_link_libraries(bench_chunk PRIVATE gdp_bench_common gdp_static gdp_options m)
option(GDP_BUILD_CHUNK_DEV "Build kernels/dev/chunk_stages.cu (per-stage timings of the chunk op)" OFF)
if(GDP_WITH_CUDA AND GDP_BUILD_CHUNK_DEV)
  add_executable(bench_chunk_stages ${PROJECT_SOURCE_DIR}/kernels/dev/chunk_stages.cu)
  target_include_directories(bench_chunk_stages PRIVATE ${PROJECT_SOURCE_DIR} ${PROJECT_SOURCE_DIR}/src
                                                        ${PROJECT_SOURCE_DIR}/kernels)
  target_link_libraries(bench_chunk_stages PRIVATE gdp_static gdp_options)
  # it compiles the Hopper kernel's translation unit into itself (--hopper-phases): sm_90a only
  set_target_properties(bench_chunk_stages PROPERTIES CUDA_ARCHITECTURES OFF)
  target_compile_options(bench_chunk_stages PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:-gencode=arch=compute_90a,code=sm_90a>)
  target_compile_definitions(bench_chunk_stages PRIVATE GDP_HAVE_CHUNK_HOPPER=1)
  # bench_hopper_skipN: the same lab with a role's math left out of the Hopper kernel
  # (GDP_HOPPER_DEV_SKIP, hopper.cuh: 1 the aux warpgroup's, 2 the state side's, 3 both), or one block
  # of the aux chain (4 the inverse's level 64, 8 its level 32, 16 A's exponents): run under
  # GDP_CHUNK_PATH=hopper, the 'total' column is the kernel with only the other role's chain and the
  # loads, or without that block (launch/bin_call.sh stage alone); outputs wrong by design
  foreach(skip 1 2 3 4 8 16)
    add_executable(bench_hopper_skip${skip} ${PROJECT_SOURCE_DIR}/kernels/dev/chunk_stages.cu)
    target_include_directories(bench_hopper_skip${skip} PRIVATE ${PROJECT_SOURCE_DIR} ${PROJECT_SOURCE_DIR}/src
                                                                ${PROJECT_SOURCE_DIR}/kernels)
    target_link_libraries(bench_hopper_skip${skip} PRIVATE gdp_static gdp_options)
    set_target_properties(bench_hopper_skip${skip} PROPERTIES CUDA_ARCHITECTURES OFF)
    target_compile_options(bench_hopper_skip${skip}
                           PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:-gencode=arch=compute_90a,code=sm_90a>)
    target_compile_definitions(bench_hopper_skip${skip} PRIVATE GDP_HAVE_CHUNK_HOPPER=1 GDP_HOPPER_DEV_SKIP=${skip})
  endforeach()
  # wgmma_check: kernels/chunk/wgmma.cuh against a double product, for sm_90a alone (wgmma has no
  # plain sm_90 form, so no other architecture is compiled; it skips on other GPUs)
  add_executable(wgmma_check ${PROJECT_SOURCE_DIR}/kernels/dev/wgmma_check.cu)
  set_target_properties(wgmma_check PROPERTIES CUDA_ARCHITECTURES OFF)
  target_compile_options(wgmma_check PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:-gencode=arch=compute_90a,code=sm_90a>)
  target_include_directories(wgmma_check PRIVATE ${PROJECT_SOURCE_DIR}/kernels)
endif()
