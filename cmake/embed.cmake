# SPDX-License-Identifier: MIT
# Turns text files into a C header holding them, one after the other, as
# one string constant:
#   cmake -DIN=file[|file...] -DOUT=header -DNAME=identifier -P embed.cmake
set(text "")
string(REPLACE "|" ";" files "${IN}")
foreach(f ${files})
  file(READ ${f} part)
  string(APPEND text "${part}")
endforeach()
string(REPLACE "\\" "\\\\" text "${text}")
string(REPLACE "\"" "\\\"" text "${text}")
string(REPLACE "\n" "\\n\"\n\"" text "${text}")
file(WRITE ${OUT} "/* Generated from ${IN}; do not edit. */\nstatic const char ${NAME}[] =\n\"${text}\";\n")
