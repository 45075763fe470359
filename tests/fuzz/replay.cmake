# The fuzz harnesses (tests/fuzz/fuzz_*.cpp) in the regular build: each is linked with tests/fuzz/replay_main.cpp
# instead of libFuzzer as fuzz_replay_<name>, and CTest runs it over tests/fuzz/corpus/<name> (the seeds) and
# tests/fuzz/regressions/<name> (inputs that once crashed). Included from the top-level CMakeLists.txt inside
# if(CIDER_BUILD_TESTS); the libFuzzer build itself is tests/fuzz/CMakeLists.txt (scripts/fuzz.sh).
file(GLOB CIDER_FUZZ_HARNESSES CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/tests/fuzz/fuzz_*.cpp)
foreach(src ${CIDER_FUZZ_HARNESSES})
  get_filename_component(harness ${src} NAME_WE)
  string(REGEX REPLACE "^fuzz_" "" name ${harness})
  add_executable(fuzz_replay_${name} ${src} ${CMAKE_SOURCE_DIR}/tests/fuzz/replay_main.cpp)
  target_compile_options(fuzz_replay_${name} PRIVATE ${CIDER_WARNINGS})
  target_link_libraries(fuzz_replay_${name} PRIVATE cider)
  target_include_directories(fuzz_replay_${name} PRIVATE ${CMAKE_SOURCE_DIR}/src)
  target_compile_definitions(fuzz_replay_${name} PRIVATE CIDER_SOURCE_DIR="${CMAKE_SOURCE_DIR}")
  add_test(NAME Fuzz.replay_${name}
           COMMAND fuzz_replay_${name} ${CMAKE_SOURCE_DIR}/tests/fuzz/corpus/${name}
                   ${CMAKE_SOURCE_DIR}/tests/fuzz/regressions/${name})
  # The scratch files of the path-only APIs go to the build tree, not /dev/shm or /tmp.
  set_tests_properties(Fuzz.replay_${name} PROPERTIES
                       ENVIRONMENT "CIDER_FUZZ_TMP=${CMAKE_CURRENT_BINARY_DIR}/fuzz-tmp;CIDER_SOURCE_DIR=${CMAKE_SOURCE_DIR}"
                       TIMEOUT 300)
endforeach()
file(MAKE_DIRECTORY ${CMAKE_CURRENT_BINARY_DIR}/fuzz-tmp)
