# bench_decode_ceiling: the decode op's memory ceiling (kernels/dev/decode_ceiling.cu), a
# GPU-only developer tool, built with -DGDP_BUILD_DECODE_DEV=ON (launch/h200-suite.sh does).
option(GDP_BUILD_DECODE_DEV "Build kernels/dev/decode_ceiling.cu (the decode op's memory ceiling)" OFF)
if(GDP_WITH_CUDA AND GDP_BUILD_DECODE_DEV)
  add_executable(bench_decode_ceiling ${PROJECT_SOURCE_DIR}/kernels/dev/decode_ceiling.cu)
  target_link_libraries(bench_decode_ceiling PRIVATE gdp_options)
endif()
