# Core tests: descriptors, API basics (status, version, dtypes, tensors, ctx), the
# safetensors reader/writer, and the exported-symbol check of libgdp.so.
gdp_add_test(test_descriptors LABEL cpu)
gdp_add_test(test_api LABEL cpu)
gdp_add_test(test_safetensors LABEL cpu)
add_test(NAME test_exported_symbols
         COMMAND ${CMAKE_COMMAND} -DLIB=$<TARGET_FILE:gdp> -P ${CMAKE_CURRENT_SOURCE_DIR}/scripts/check_symbols.cmake)
set_tests_properties(test_exported_symbols PROPERTIES LABELS cpu)
# gdp-ckpt info on a metadata-only file with H = G = 2^32: answers at once (no loop over 1..G).
if(TARGET gdp-ckpt)
  add_test(NAME gdp_ckpt_info_huge_groups
           COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/scripts/ckpt_info_huge_groups.sh $<TARGET_FILE:gdp-ckpt>
                   ${CMAKE_CURRENT_BINARY_DIR})
  set_tests_properties(gdp_ckpt_info_huge_groups PROPERTIES LABELS cpu TIMEOUT 60)
endif()
# The pending kernel patches (kernels/chunk/pending) still apply to this tree: the device A/B builds
# its trees from them.
find_program(GDP_GIT git)
if(GDP_GIT)
  add_test(NAME pending_patches_apply
           COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/scripts/pending_patches_apply.sh ${PROJECT_SOURCE_DIR})
  set_tests_properties(pending_patches_apply PROPERTIES LABELS cpu TIMEOUT 60)
endif()
# launch/ab_table.py, the device A/B's summary table, on a log of the suite's shape
find_program(GDP_PYTHON3 python3)
if(GDP_PYTHON3)
  add_test(NAME ab_table_check COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/scripts/ab_table_check.sh ${PROJECT_SOURCE_DIR})
  set_tests_properties(ab_table_check PROPERTIES LABELS cpu TIMEOUT 60)
  # launch/prebuilt_pick.py: which objects of a patch's rebuild launch/prebuilt.sh pack keeps
  add_test(NAME prebuilt_pick_check COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/scripts/prebuilt_pick_check.sh ${PROJECT_SOURCE_DIR})
  set_tests_properties(prebuilt_pick_check PROPERTIES LABELS cpu TIMEOUT 60)
  # launch/prebuilt.sh ab, the device A/B over linked trees, on stand-in trees
  add_test(NAME prebuilt_ab_check COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/scripts/prebuilt_ab_check.sh ${PROJECT_SOURCE_DIR})
  set_tests_properties(prebuilt_ab_check PROPERTIES LABELS cpu TIMEOUT 60)
  # launch/bin_call.sh: pack and run over stand-in programs (one device call's stages, no GPU)
  add_test(NAME bin_call_check COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/scripts/bin_call_check.sh ${PROJECT_SOURCE_DIR})
  set_tests_properties(bin_call_check PROPERTIES LABELS cpu TIMEOUT 60)
endif()
# The Hopper chunk kernel and its split's kernels compile spill-free (tests/scripts/hopper_spill_check.sh names the
# known exceptions; ptxas alone, no GPU; 77 without nvcc)
add_test(NAME hopper_spill_check COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/scripts/hopper_spill_check.sh ${PROJECT_SOURCE_DIR})
set_tests_properties(hopper_spill_check PROPERTIES LABELS cpu TIMEOUT 300 SKIP_RETURN_CODE 77)
if(CMAKE_CUDA_COMPILER)
  set_tests_properties(hopper_spill_check PROPERTIES ENVIRONMENT "NVCC=${CMAKE_CUDA_COMPILER}")
endif()
