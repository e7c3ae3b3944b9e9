# Python package tests (python/tests, pytest): the gdp Python ops on numpy arrays against the
# golden files and a float64 recurrence, the ctypes struct layouts, bad inputs, the layer
# entry (gdp.layer) at TP = 1 and 2, and, when torch and a GPU are present, the torch CUDA
# path (graph capture, CUDA vs CPU). The library under test is this build's libgdp.so.
# numpy and pytest must be installed for this python3 (launch/setup.sh installs them): when
# they are missing the test is still registered and fails, it never skips silently.
find_program(GDP_PYTHON3 NAMES python3 DOC "python3 that runs the Python package tests")
if(NOT GDP_PYTHON3)
  message(WARNING "test_python: python3 not found; the test is registered and will fail. Install python3 "
                  "with numpy and pytest (launch/setup.sh).")
  set(GDP_PYTHON3 python3)
else()
  execute_process(COMMAND ${GDP_PYTHON3} -c "import numpy, pytest" RESULT_VARIABLE _gdp_py_missing
                  OUTPUT_QUIET ERROR_QUIET)
  if(NOT _gdp_py_missing EQUAL 0)
    message(WARNING "test_python: ${GDP_PYTHON3} lacks numpy or pytest, so test_python will fail until you run "
                    "`python3 -m pip install numpy pytest` (launch/setup.sh does).")
  endif()
endif()
add_test(NAME test_python
         COMMAND ${GDP_PYTHON3} -m pytest -q -p no:cacheprovider ${PROJECT_SOURCE_DIR}/python/tests)
set_tests_properties(test_python PROPERTIES LABELS cpu TIMEOUT 900
                     ENVIRONMENT "GDP_LIBRARY=$<TARGET_FILE:gdp>;NCCL_NVLS_ENABLE=0;PYTHONDONTWRITEBYTECODE=1")
