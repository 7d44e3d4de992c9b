# cmake -DPASSED=n [-DOUTPUT=regex] -P expect_ranks.cmake -- mpirun ...
# Runs the mpirun command line after "--" and passes when exactly PASSED ranks
# printed gtest's "[  PASSED  ]" line, none printed "[  FAILED  ]", and the output
# (stdout and stderr of all ranks) matches OUTPUT when given. mpirun's exit code is
# not used: a rank that ends on a broken group skips MPI_Finalize on purpose, and
# mpirun then exits non-zero whatever the tests said.
set(command)
set(after_dashes OFF)
foreach(i RANGE ${CMAKE_ARGC})
  if(after_dashes AND DEFINED CMAKE_ARGV${i})
    list(APPEND command "${CMAKE_ARGV${i}}")
  elseif("${CMAKE_ARGV${i}}" STREQUAL "--")
    set(after_dashes ON)
  endif()
endforeach()
execute_process(COMMAND ${command} OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE code)
set(all "${out}\n${err}")
message("${all}")
string(REGEX MATCHALL "\\[  PASSED  \\]" passed "${all}")
list(LENGTH passed n_passed)
if(NOT n_passed EQUAL PASSED)
  message(FATAL_ERROR "expected ${PASSED} ranks to pass, ${n_passed} did (mpirun exit ${code})")
endif()
if(all MATCHES "\\[  FAILED  \\]")
  message(FATAL_ERROR "a rank reported a failed test")
endif()
if(DEFINED OUTPUT AND NOT OUTPUT STREQUAL "" AND NOT all MATCHES "${OUTPUT}")
  message(FATAL_ERROR "the output does not match '${OUTPUT}'")
endif()
