# Optional parts of the build, each a cache variable AUTO, ON or OFF:
#
#   d2l_feature(<var> <doc>)        declares it (AUTO unless set)
#   d2l_feature_wanted(<var> <out>) <out> = whether to look for it at all
#   d2l_feature_found(<var> <found> <what is missing>)
#                                   records the outcome: ON and not found is
#                                   a configure error naming what is missing;
#                                   D2L_FEATURE_<var> holds the outcome
#                                   (ON or OFF), which the package records.
function(d2l_feature var doc)
  set(${var} AUTO CACHE STRING "${doc}: AUTO (where found), ON (required) or OFF")
  set_property(CACHE ${var} PROPERTY STRINGS AUTO ON OFF)
  string(TOUPPER "${${var}}" value)
  if(value MATCHES "^(1|YES|TRUE|Y)$")
    set(value ON)
  elseif(value MATCHES "^(0|NO|FALSE|N|)$")
    set(value OFF)
  endif()
  if(NOT value MATCHES "^(AUTO|ON|OFF)$")
    message(FATAL_ERROR "${var} is '${${var}}'; it takes AUTO, ON or OFF")
  endif()
  set(D2L_FEATURE_REQUEST_${var} ${value} CACHE INTERNAL "")
endfunction()

function(d2l_feature_wanted var out)
  if(D2L_FEATURE_REQUEST_${var} STREQUAL "OFF")
    set(${out} OFF PARENT_SCOPE)
  else()
    set(${out} ON PARENT_SCOPE)
  endif()
endfunction()

function(d2l_feature_found var found missing)
  if(D2L_FEATURE_REQUEST_${var} STREQUAL "OFF")
    set(outcome OFF)
  elseif(found)
    set(outcome ON)
  elseif(D2L_FEATURE_REQUEST_${var} STREQUAL "ON")
    message(FATAL_ERROR "${var}=ON, and ${missing}; install it, or configure with ${var}=AUTO or OFF")
  else()
    set(outcome OFF)
    message(STATUS "d2l_attention: ${var} off: ${missing}")
  endif()
  set(D2L_FEATURE_${var} ${outcome} CACHE INTERNAL "")
endfunction()
