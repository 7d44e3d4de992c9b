# cmake -DCOUNT=n [-DPATTERN=regex] [-DOUTPUT=regex[;regex...]] [-DEXIT0=ON] -P expect_ranks.cmake -- mpirun ...
# Runs the command line after "--" and passes when its output (stdout and stderr
# of every rank) holds exactly COUNT matches of PATTERN (by default gtest's
# "[  PASSED  ]" line, printed once per rank whose tests passed), no
# "[  FAILED  ]", and a match of each OUTPUT regex. mpirun's exit code counts only
# with EXIT0: a rank that ends on a broken group skips MPI_Finalize on purpose,
# and mpirun then exits non-zero whatever the tests said.
if(NOT DEFINED PATTERN OR PATTERN STREQUAL "")
  set(PATTERN "\\[  PASSED  \\]")
endif()
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
string(REGEX MATCHALL "${PATTERN}" matches "${all}")
list(LENGTH matches n)
if(NOT n EQUAL COUNT)
  message(FATAL_ERROR "expected ${COUNT} matches of '${PATTERN}', found ${n} (exit ${code})")
endif()
if(all MATCHES "\\[  FAILED  \\]")
  message(FATAL_ERROR "a rank reported a failed test")
endif()
# ctest hands a list over with its separators escaped.
string(REPLACE "\\;" ";" OUTPUT "${OUTPUT}")
foreach(regex IN LISTS OUTPUT)
  if(NOT all MATCHES "${regex}")
    message(FATAL_ERROR "the output does not match '${regex}'")
  endif()
endforeach()
if(EXIT0 AND NOT code EQUAL 0)
  message(FATAL_ERROR "the command exited with ${code}")
endif()
