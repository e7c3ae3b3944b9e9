# Python package tests (python/tests, pytest): the gdp Python ops on numpy arrays against the
# golden files and a float64 recurrence, the ctypes struct layouts, bad inputs, the layer
# entry (gdp.layer) at TP = 1 and 2, and, when torch and a GPU are present, the torch CUDA
# path (graph capture, CUDA vs CPU). The library under test is this build's libgdp.so.
# The modules of python/requirements-test.txt (numpy, pytest, ml_dtypes, setuptools >= 61, wheel:
# the packaging test runs `pip install --no-build-isolation ./python`) must be installed for this
# python (launch/setup.sh --tests, which launch/run-tests calls, installs them; -DGDP_PYTHON3=...
# picks another python). When they are missing the test is still registered and fails, it never
# skips silently. torch is optional: the torch tests skip without it and say so.
find_program(GDP_PYTHON3 NAMES python3 DOC "python3 that runs the Python package tests")
if(NOT GDP_PYTHON3)
  message(WARNING "test_python: python3 not found; the test is registered and will fail. Install python3 "
                  "and the modules of python/requirements-test.txt (launch/setup.sh --tests).")
  set(GDP_PYTHON3 python3)
else()
  execute_process(COMMAND ${GDP_PYTHON3} -c "import numpy, pytest, ml_dtypes, setuptools, wheel"
                  RESULT_VARIABLE _gdp_py_missing OUTPUT_QUIET ERROR_QUIET)
  if(NOT _gdp_py_missing EQUAL 0)
    message(WARNING "test_python: ${GDP_PYTHON3} lacks a module of python/requirements-test.txt, so test_python "
                    "will fail until you run `launch/setup.sh --tests` (or `${GDP_PYTHON3} -m pip install -r "
                    "python/requirements-test.txt`).")
  endif()
endif()
add_test(NAME test_python
         COMMAND ${GDP_PYTHON3} -m pytest -q -p no:cacheprovider ${PROJECT_SOURCE_DIR}/python/tests)
set_tests_properties(test_python PROPERTIES LABELS cpu TIMEOUT 900
                     ENVIRONMENT "GDP_LIBRARY=$<TARGET_FILE:gdp>;NCCL_NVLS_ENABLE=0;PYTHONDONTWRITEBYTECODE=1")
