# SPDX-License-Identifier: MIT
# rate_lua_script(NAME DRIVER): the Redis script NAME, assembled from the
# Lua file DRIVER and what it includes (cmake/lua_assemble.cmake: the
# algorithms' rules src/algo/*.lua, the range constants), written to
# generated/NAME.lua and embedded as the C string NAME_lua in
# generated/NAME_lua.h, which is added to RATE_SOURCES.  Needs
# rate_lua_range, the generated range constants (generated/lua_range.lua).
# docs/redis.md, "How the scripts are made".
file(GLOB_RECURSE rate_lua_parts CONFIGURE_DEPENDS
     ${CMAKE_CURRENT_SOURCE_DIR}/src/*.lua)
function(rate_lua_script name driver)
  set(gen ${CMAKE_CURRENT_BINARY_DIR}/generated)
  add_custom_command(
    OUTPUT ${gen}/${name}_lua.h ${gen}/${name}.lua
    COMMAND ${CMAKE_COMMAND} -DIN=${CMAKE_CURRENT_SOURCE_DIR}/${driver}
            "-DPATH=${CMAKE_CURRENT_SOURCE_DIR}|${gen}" -DOUT=${gen}/${name}.lua
            -P ${CMAKE_CURRENT_SOURCE_DIR}/cmake/lua_assemble.cmake
    COMMAND ${CMAKE_COMMAND} -DIN=${gen}/${name}.lua -DOUT=${gen}/${name}_lua.h
            -DNAME=${name}_lua -P ${CMAKE_CURRENT_SOURCE_DIR}/cmake/embed.cmake
    DEPENDS ${rate_lua_range} ${rate_lua_parts} cmake/lua_assemble.cmake
            cmake/embed.cmake
    VERBATIM)
  set(RATE_SOURCES ${RATE_SOURCES} ${gen}/${name}_lua.h PARENT_SCOPE)
endfunction()
