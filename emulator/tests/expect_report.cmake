# Runs one control of emulator/tests/controls.cu and checks that the detector it
# plants a bug for said so: the exit code and a line of its report.
#
#   cmake -DCODE=66 -DREPORT=regex -P expect_report.cmake -- program args...
#
# CODE 0 with REPORT "ran to the end" is a correct twin: it must pass silently.
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
execute_process(COMMAND ${command} RESULT_VARIABLE code OUTPUT_VARIABLE out ERROR_VARIABLE err)
string(REPLACE ";" " " shown "${command}")
if(NOT "${code}" STREQUAL "${CODE}" OR NOT "${out}${err}" MATCHES "${REPORT}")
  message(FATAL_ERROR "${shown}\nexited with ${code}, expected ${CODE} and a report matching "
                      "'${REPORT}': the detector is broken\n${out}${err}")
endif()
message(STATUS "${shown}: exit ${code}, '${REPORT}' reported, as it must be")
