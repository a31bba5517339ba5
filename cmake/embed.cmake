# SPDX-License-Identifier: MIT
# Turns a text file into a C header holding it as one string constant:
#   cmake -DIN=file -DOUT=header -DNAME=identifier -P embed.cmake
file(READ ${IN} text)
string(REPLACE "\\" "\\\\" text "${text}")
string(REPLACE "\"" "\\\"" text "${text}")
string(REPLACE "\n" "\\n\"\n\"" text "${text}")
file(WRITE ${OUT} "/* Generated from ${IN}; do not edit. */\nstatic const char ${NAME}[] =\n\"${text}\";\n")
