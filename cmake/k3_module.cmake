# k3_module(<name> [RECURSE] DEPS <targets...> [TEST_DEPS <targets...>])
# Builds every *.cpp of the calling folder (and its subfolders with RECURSE) except
# *_test.cpp and main.cpp (plus every *.cu when K3_HAVE_CUDA, linking k3_backends_cuda) into the
# library k3_<name>, and every *_test.cpp into the
# GoogleTest program k3_<name>_tests, so a test lives beside the code it tests and adding
# a file never means editing CMake.
function(k3_module name)
  cmake_parse_arguments(M "RECURSE;HOST_GLUE" "" "DEPS;TEST_DEPS;PCH" ${ARGN})
  if(M_RECURSE)
    set(glob GLOB_RECURSE)
  else()
    set(glob GLOB)
  endif()
  file(${glob} srcs CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/*.cpp)
  # Op folders' *_ops_test.cpp and *_ops_test_util.cpp join k3_ops_tests (src/kernels), their
  # *_op_bench.cpp the op benchmark k3bench_ops_gpu (CUDA builds), not the module.
  list(FILTER srcs EXCLUDE REGEX "(_test|_test_util|_op_bench|/main)\\.cpp$")
  # CUDA sources (*.cu) join the library only when the CUDA backend is on; without nvcc they are
  # ignored entirely, so a CPU-only build never sees them.
  set(cuda_srcs "")
  if(K3_HAVE_CUDA)
    file(${glob} cuda_srcs CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/*.cu)
    list(APPEND srcs ${cuda_srcs})
  endif()
  file(${glob} tests CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/*_test.cpp)
  list(FILTER tests EXCLUDE REGEX "_ops_test\\.cpp$")
  if(srcs)
    add_library(k3_${name} STATIC ${srcs})
    set(scope PUBLIC)
  else()
    add_library(k3_${name} INTERFACE)  # header-only so far
    set(scope INTERFACE)
  endif()
  target_include_directories(k3_${name} ${scope} ${PROJECT_SOURCE_DIR}/src)
  target_link_libraries(k3_${name} ${scope} ${M_DEPS} Threads::Threads)
  if(cuda_srcs AND NOT name STREQUAL "backends_cuda")
    target_link_libraries(k3_${name} ${scope} k3_backends_cuda)
  endif()
  if(K3_BUILD_TESTS AND tests)
    add_executable(k3_${name}_tests ${tests})
    target_link_libraries(k3_${name}_tests PRIVATE k3_${name} ${M_TEST_DEPS} GTest::gtest_main)
    target_compile_definitions(k3_${name}_tests PRIVATE K3_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
    gtest_discover_tests(k3_${name}_tests DISCOVERY_TIMEOUT 60
                         PROPERTIES ENVIRONMENT "K3_SOURCE_DIR=${PROJECT_SOURCE_DIR}")
  endif()
  # Compile time (docs/perf/setup_time.md): PCH names heavy third-party headers most of the module's
  # files include (nlohmann/json, cpp-httplib), parsed once per target instead of once per file;
  # HOST_GLUE marks request/response and command-line code, built at -O2 in Release (a third less
  # compile time than -O3, nothing hot runs there).
  foreach(t k3_${name} k3_${name}_tests)
    if(TARGET ${t})
      get_target_property(type ${t} TYPE)
      if(type STREQUAL "INTERFACE_LIBRARY")
        continue()
      endif()
      if(M_PCH)
        target_precompile_headers(${t} PRIVATE ${M_PCH})
      endif()
      if(M_HOST_GLUE)
        target_compile_options(${t} PRIVATE $<$<AND:$<CONFIG:Release>,$<COMPILE_LANGUAGE:CXX>>:-O2>)
      endif()
    endif()
  endforeach()
endfunction()
