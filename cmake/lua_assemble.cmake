# SPDX-License-Identifier: MIT
# Assembles one Redis script from a driver (docs/redis.md, "How the
# scripts are made"): each line of the form
#   --@include NAME
# is replaced by the text of the file NAME, looked up in each directory of
# PATH in turn (the source tree, then the build's generated/: the range
# constants, cmake/lua_range.cmake), and its own --@include lines in turn.
#   cmake -DIN=driver.lua -DPATH=dir[|dir...] -DOUT=script.lua -P lua_assemble.cmake
# A name found nowhere, a file included twice (its locals would be made
# twice) or includes nested past 8 deep stop the build.
cmake_minimum_required(VERSION 3.18) # the policies of the build, in -P mode too
string(REPLACE "|" ";" dirs "${PATH}")
set(seen "")

function(lua_assemble file depth out)
  if(depth GREATER 8)
    message(FATAL_ERROR "${file}: --@include nested past 8 deep")
  endif()
  file(READ "${file}" text)
  set(result "")
  while(TRUE)
    string(REGEX MATCH "(^|\n)--@include ([^\n]*)\n" m "${text}")
    if(m STREQUAL "")
      break()
    endif()
    set(name "${CMAKE_MATCH_2}")
    string(STRIP "${name}" name)
    string(FIND "${text}" "${m}" at)
    if(m MATCHES "^\n")
      math(EXPR at "${at} + 1") # keep the newline before it
    endif()
    string(SUBSTRING "${text}" 0 ${at} before)
    string(LENGTH "${m}" mlen)
    string(FIND "${text}" "${m}" start)
    math(EXPR rest "${start} + ${mlen}")
    string(SUBSTRING "${text}" ${rest} -1 text)
    string(APPEND result "${before}")
    set(found "")
    foreach(d ${dirs})
      if(found STREQUAL "" AND EXISTS "${d}/${name}")
        set(found "${d}/${name}")
      endif()
    endforeach()
    if(found STREQUAL "")
      message(FATAL_ERROR "${file}: --@include ${name}: no such file in ${PATH}")
    endif()
    if("${found}" IN_LIST seen)
      message(FATAL_ERROR "${file}: --@include ${name}: included twice")
    endif()
    list(APPEND seen "${found}")
    set(seen "${seen}" PARENT_SCOPE)
    math(EXPR next "${depth} + 1")
    lua_assemble("${found}" ${next} part)
    set(seen "${seen}" PARENT_SCOPE)
    string(APPEND result "${part}")
    if(NOT part MATCHES "\n$")
      string(APPEND result "\n")
    endif()
  endwhile()
  string(APPEND result "${text}")
  set(${out} "${result}" PARENT_SCOPE)
endfunction()

lua_assemble("${IN}" 0 script)
file(WRITE "${OUT}.tmp" "${script}")
# only a change rewrites it, so what embeds it rebuilds only then
configure_file("${OUT}.tmp" "${OUT}" COPYONLY)
