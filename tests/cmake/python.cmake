# The Python package's tests (python/tests): pytest against real tierd processes of this build
# (host engine), the package from the source tree and libtierclient.so of this build.
# The interpreter is TIER_TEST_PYTHON: scripts/test passes the virtual environment that
# scripts/python-env makes (torch 2.13, transformers, lightning; python/requirements-test.txt),
# so CI tests against the torch users run rather than the distribution's. Without it, the
# environment in build-venv if present, else /usr/bin/python3. Registered only where that
# interpreter can import torch, pytest and numpy, and not in sanitizer builds (an ASan/TSan
# libtierclient.so cannot be loaded into an uninstrumented python3).
set(TIER_TEST_PYTHON "" CACHE FILEPATH "Interpreter for the Python package's tests")
set(_tier_py_test_python "${TIER_TEST_PYTHON}")
if(NOT _tier_py_test_python)
  if(EXISTS ${CMAKE_SOURCE_DIR}/build-venv/bin/python)
    set(_tier_py_test_python ${CMAKE_SOURCE_DIR}/build-venv/bin/python)
  else()
    set(_tier_py_test_python /usr/bin/python3)
  endif()
endif()
set(_tier_py_test_ok FALSE)
if(TIER_SANITIZE)
  message(STATUS "python tests (python_test_*): not registered in a sanitizer build (TIER_SANITIZE=${TIER_SANITIZE})")
elseif(NOT EXISTS ${_tier_py_test_python})
  message(STATUS "python tests (python_test_*): not registered (${_tier_py_test_python} not found)")
else()
  execute_process(COMMAND ${_tier_py_test_python} -c "import torch, pytest, numpy"
                  RESULT_VARIABLE _tier_py_test_rc OUTPUT_QUIET ERROR_QUIET)
  if(_tier_py_test_rc EQUAL 0)
    set(_tier_py_test_ok TRUE)
    message(STATUS "python tests (python_test_*): ${_tier_py_test_python}")
  else()
    message(STATUS "python tests (python_test_*): not registered (${_tier_py_test_python} cannot import "
                   "torch, pytest and numpy: scripts/python-env makes an environment that can)")
  endif()
endif()
if(_tier_py_test_ok)
  # One CTest test per test file, so `ctest -j` runs them side by side (together they take
  # minutes: the trainers, FSDP2 ranks, the planner). -p no:cacheprovider and
  # PYTHONDONTWRITEBYTECODE: the tests write nothing into the source tree.
  file(GLOB _tier_py_test_files CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/python/tests/test_*.py)
  foreach(_file IN LISTS _tier_py_test_files)
    get_filename_component(_name ${_file} NAME_WE)
    add_test(NAME python_${_name}
             COMMAND ${_tier_py_test_python} -m pytest -q -p no:cacheprovider ${_file})
    set_tests_properties(python_${_name} PROPERTIES
      LABELS integration
      TIMEOUT 900
      ENVIRONMENT "TIER_BUILD_DIR=${CMAKE_BINARY_DIR};PYTHONDONTWRITEBYTECODE=1")
  endforeach()
  # Its loose bound on host time is a ratio of two timings; on two cores a neighbouring test's
  # burst once pushed it over (CI, 26.6 against 15 ops' time): it runs alone.
  set_tests_properties(python_test_hook_cost PROPERTIES RUN_SERIAL TRUE)
endif()
