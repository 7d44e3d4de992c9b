# Runs a program and checks how it stops, which ctest's WILL_FAIL cannot (it only
# sees "not 0"):
#
#   cmake -DCODE=2 -DSTDERR=regex [-DSTDOUT_NOT=regex] [-DKEEP=file] -P expect_exit.cmake
#         -- program args...
#
# CODE: the exit code. STDERR: a regex the whole of stderr must match, checked to be
# one line. STDOUT_NOT: a regex stdout must not match (work that should not have
# started). KEEP: a file written before the run that must be unchanged after it.
cmake_policy(VERSION 3.20)
set(command)
set(after_separator FALSE)
math(EXPR last "${CMAKE_ARGC} - 1")
foreach(i RANGE ${last})
  if(after_separator)
    list(APPEND command "${CMAKE_ARGV${i}}")
  elseif("${CMAKE_ARGV${i}}" STREQUAL "--")
    set(after_separator TRUE)
  endif()
endforeach()
if(NOT command)
  message(FATAL_ERROR "expect_exit.cmake: no program after --")
endif()

set(kept "there before the run\n")
if(DEFINED KEEP)
  file(WRITE "${KEEP}" "${kept}")
endif()
execute_process(COMMAND ${command} RESULT_VARIABLE code OUTPUT_VARIABLE out ERROR_VARIABLE err)
string(REPLACE ";" " " shown "${command}")
if(NOT "${code}" STREQUAL "${CODE}")
  message(FATAL_ERROR "${shown}\nexited with ${code}, expected ${CODE}; stderr:\n${err}")
endif()
string(REGEX MATCHALL "\n" newlines "${err}")
list(LENGTH newlines lines)
if(NOT lines EQUAL 1 OR NOT err MATCHES "^${STDERR}\n$")
  message(FATAL_ERROR "${shown}\nstderr is not one line matching ^${STDERR}$:\n${err}")
endif()
if(DEFINED STDOUT_NOT AND out MATCHES "${STDOUT_NOT}")
  message(FATAL_ERROR "${shown}\nstdout matches ${STDOUT_NOT}:\n${out}")
endif()
if(DEFINED KEEP)
  file(READ "${KEEP}" now)
  if(NOT now STREQUAL kept)
    message(FATAL_ERROR "${shown}\nchanged ${KEEP}, which was there before the run:\n${now}")
  endif()
endif()
