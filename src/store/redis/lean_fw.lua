-- SPDX-License-Identifier: MIT
-- The lean fixed window's driver, one limit (docs/redis.md, "Lean
-- scripts"): the common part, then the rule (src/algo/fixed_window.lua).
-- Windows are aligned to the clock's zero (offset, in lean_lib.lua); t
-- and t_last share a window when t - t_last is the difference of their
-- offsets.  num [5] L (at most FIXED_WINDOW_LEAN), [6] W (ns, below
-- it), as the client's gate (lean_of) sends them
--@include src/store/redis/lean_lib.lua
--@include src/algo/fixed_window.lua
local LAST = 6
--@call
--@include src/store/redis/lean.lua
local L, W = num[5], num[6]
if L > FIXED_WINDOW_LEAN or W >= FIXED_WINDOW_LEAN then return DECLINE end
local e = offset(t_hi, t_lo, W)
local cnt, same = nil, false
if st ~= nil then
  cnt = w8 -- nil past 2^53: declined below
  if cnt == nil then return DECLINE end
  same = dt == e - offset(l_hi, l_lo, W)
end
cnt = fw_load(cnt, L)
if cnt == nil then return DECLINE end
cnt = fw_advance(cnt, same)
local to_next = W - e
if OP ~= '0' then
  local x = fw_adjust(cnt, OP == '1' and 1 or 2, n, L)
  local remaining, reset = fw_status(x, L, to_next)
  write(word_out(x, 1), reset)
  return {1, 1, 0, 0, L, remaining, 0, 0, reset}
end
local ok, reason, delay, retry = fw_decide(cnt, n, L, to_next)
local x = cnt
if ok then x = fw_commit(cnt, n) end
local remaining, reset = fw_status(x, L, to_next)
if ok and n > 0 then write(word_out(x, 1), reset) end
return {1, ok and 1 or 0, reason, 0, L, remaining, delay, retry, reset}
